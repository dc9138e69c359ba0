"""benchmarks/gateway_overhead.py end to end in its --quick mode (real processes: the stub
upstream — a test double that answers instantly — three `presched serve` gateways, real HTTP),
plus its load generator's HTTP parsing against a real server."""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
import threading
import time

import pytest
from builders import BENCHMARKS, load_benchmark, printed_figures

SCRIPT = BENCHMARKS / "gateway_overhead.py"


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("gateway_overhead.py")


def test_quick_run_prints_the_figures_and_writes_the_results(tmp_path):
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--quick", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    # the timeout catches a hang (~20 s on 2 busy cores); how fast it ran is not asserted
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    figures = printed_figures(proc.stdout)
    for name in (
        "gateway_added_p50_ms",
        "gateway_max_rps",
        "gateway_added_p99_ms",
        "direct_max_rps",
        "gateway_added_p50_ms_with_log",
        "gateway_added_p50_ms_passthrough",
        "gateway_cpu_us_per_req",
    ):
        assert name in figures, f"no figure line for {name}:\n{proc.stdout[-2000:]}"
    assert math.isfinite(figures["gateway_added_p50_ms"]) and figures["gateway_cpu_us_per_req"] > 0
    assert figures["gateway_max_rps"] in (0, 100, 200) and figures["direct_max_rps"] in (
        0,
        100,
        200,
    )
    assert "test double" in proc.stdout  # the upstream is labelled for what it is

    res = json.loads((tmp_path / "gateway_overhead.json").read_text())
    assert (tmp_path / "gateway_overhead.png").stat().st_size > 10_000
    assert res["meta"]["upstream"].startswith(
        "minimal local upstream that answers instantly (test double)"
    )
    assert res["meta"]["rate"] == 200 and res["meta"]["repeats"] == 1
    assert set(res["meta"]["server_libraries"]) == {"uvloop", "httptools", "sniffio"}
    assert res["figures"] == pytest.approx(figures, rel=1e-3)
    keys = {
        f"{t}/{m}"
        for t in ("direct", "gateway", "gateway+log", "passthrough")
        for m in ("json", "stream")
    }
    assert set(res["summary"]) == keys
    for key, s in res["summary"].items():
        assert s["p50_ms"] <= s["p99_ms"], key
        if not key.startswith("direct"):
            assert s["added_p50_ms"] == pytest.approx(
                s["p50_ms"] - res["summary"]["direct/" + key.split("/")[1]]["p50_ms"]
            )
    runs = res["runs"]
    assert len(runs) == 8 and all(r["sent"] > 100 for r in runs)  # 200 req/s for 1 s, Poisson
    # every request of the latency runs was answered completely (a gateway that drops or cuts
    # answers fails here, not just in the figures)
    assert all(r["ok"] == r["sent"] == r["planned"] and not r["errors"] for r in runs), [
        r["errors"] for r in runs
    ]
    assert {r["rate"] for r in res["ramp"]} <= {100, 200}
    assert all(
        r["passed"]
        == (not r["errors"] and r["achieved_rps"] >= 0.95 * r["offered_rps"] and r["p99_ms"] <= 100)
        for r in res["ramp"]
    )


def test_generator_reads_json_and_chunked_sse_answers_from_a_real_server(bench):
    """The lean client against the stub over uvicorn: Content-Length and chunked bodies, keep-alive
    reuse, and `response_ok` telling a complete answer from a cut one."""
    import uvicorn

    from presched.serve.stub import StubEngine

    config = uvicorn.Config(StubEngine().app(), host="127.0.0.1", port=0, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline
        time.sleep(0.01)
    port = server.servers[0].sockets[0].getsockname()[1]
    try:

        async def main():
            pool = bench.Pool(port)
            out = []
            for stream in (False, True, False):
                body = bench.make_bodies(1, stream)[0]
                out.append(await pool.post("/v1/completions", body, time.perf_counter()))
            assert len(pool.idle) == 1  # one keep-alive connection served all three
            pool.close()
            return out

        (s1, plain, _), (s2, sse, first), (s3, _, _) = asyncio.run(main())
    finally:
        server.should_exit = True
        thread.join(5)
    assert s1 == s2 == s3 == 200 and first > 0
    assert json.loads(plain)["usage"]["completion_tokens"] == bench.MAX_TOKENS
    assert bench.response_ok(200, plain, False) and bench.response_ok(200, sse, True)
    assert not bench.response_ok(200, sse[: len(sse) // 2], True)  # a cut stream
    assert not bench.response_ok(502, plain, False)


def test_poisson_arrivals_have_the_rate_and_stay_in_the_window(bench):
    t = bench.poisson_arrivals(200.0, 50.0, seed=3)
    assert t[0] == 0 and (t < 50).all() and (t[1:] > t[:-1]).all()
    assert len(t) / 50 == pytest.approx(200, rel=0.05)
    assert (bench.poisson_arrivals(200.0, 50.0, seed=3) == t).all()  # seeded: same for every target
