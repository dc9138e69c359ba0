"""`presched replay` when things fail (HTTP errors, broken streams, closed ports, bad config) and
its command end to end (real HTTP on loopback; the stub is a test double of an engine)."""

from __future__ import annotations

import json

import pytest
import typer
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
from typer.testing import CliRunner

from presched.loadgen.cli import replay
from presched.loadgen.replay import ReplayConfig, ReplayError, run_replay
from presched.workload.request import Request
from loadgen.replay_rig import closed_port, make_reqs


# --- failures -------------------------------------------------------------------------------------
def test_http_errors_are_counted_and_left_out_of_latency(asgi_server):
    from presched.serve.stub import StubEngine

    stub = StubEngine().app()
    calls = {"n": 0}

    async def flaky(request):  # every third generation request fails with 500
        calls["n"] += 1
        if calls["n"] % 3 == 0:
            return JSONResponse({"error": {"message": "boom"}}, status_code=500)
        return await stub_engine.generate(request)

    stub_engine = stub.state.engine
    app = Starlette(routes=[Route("/v1/models", stub_engine.models),
                            Route("/v1/completions", flaky, methods=["POST"])])  # fmt: skip
    url = asgi_server(app)
    res = run_replay(make_reqs([3] * 9, gap_s=0.005), ReplayConfig(url=url))
    s = res.summary
    assert s["failed"] == 3 and s["errors_by_status"] == {"500": 3}
    assert s["completed"] == 6 and s["total_output_tokens"] == 18 and len(res.records) == 6
    bad = [r for r in res.rows if not r["ok"]]
    assert all(
        r["status"] == 500 and "boom" in r["error"] and r["output_tokens"] is None for r in bad
    )


def test_broken_streams_are_counted_as_protocol_failures(asgi_server):
    from starlette.responses import StreamingResponse

    def event(i):
        return f'data: {{"choices": [{{"index": 0, "text": " t{i}"}}]}}\n\n'

    async def broken(request):  # r0: cut before [DONE]; r1: an error event; r2: not JSON
        kind = (await request.json())["prompt"]

        async def body():
            yield event(0)
            if kind == "error":
                yield 'data: {"error": {"message": "engine died", "code": 500}}\n\n'
            elif kind == "junk":
                yield "data: {not json\n\n"
            if kind == "ok":
                yield event(1) + "data: [DONE]\n\n"

        return StreamingResponse(body(), media_type="text/event-stream")

    url = asgi_server(Starlette(routes=[Route("/v1/completions", broken, methods=["POST"])]))
    reqs = [Request(id=f"r{i}", prompt_tokens=1, output_tokens=2, prompt=p, arrival=i * 0.01)
            for i, p in enumerate(["cut", "error", "junk", "ok"])]  # fmt: skip
    res = run_replay(reqs, ReplayConfig(url=url, model="m"))
    assert res.summary["errors_by_status"] == {"protocol": 3} and res.summary["completed"] == 1
    errors = [r["error"] for r in res.rows]
    assert "[DONE]" in errors[0] and "engine died" in errors[1] and "malformed" in errors[2]
    assert res.rows[3]["usage_missing"] and res.rows[3]["output_tokens"] == 2  # 2 content events


def test_closed_port_counts_transport_errors_and_model_lookup_raises():
    url = f"http://127.0.0.1:{closed_port()}"
    res = run_replay(make_reqs([3, 3, 3]), ReplayConfig(url=url, model="m", timeout_s=2))
    assert res.summary["failed"] == 3 and res.summary["completed"] == 0
    assert res.summary["errors_by_status"] == {"ConnectError": 3}
    assert all(r["status"] == 0 and "ConnectError" in r["error"] for r in res.rows)
    with pytest.raises(ReplayError, match="cannot reach"):
        run_replay(make_reqs([3]), ReplayConfig(url=url, timeout_s=2))


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match="url"):
        ReplayConfig(url="localhost:8000")
    with pytest.raises(ValueError, match="time_scale"):
        ReplayConfig(time_scale=-1)
    assert ReplayConfig(url="http://h:1/v1/").url == "http://h:1"


# --- the command ----------------------------------------------------------------------------------
def _app() -> typer.Typer:
    app = typer.Typer()
    app.command("replay")(replay)  # as presched.cli registers it
    app.command("other")(lambda: None)
    return app


def test_cli_end_to_end_writes_json_csv_png(stub_server, tmp_path):
    url, engine = stub_server(token_s=0.001)
    out = tmp_path / "o"
    args = ["--url", url, "-n", "25", "--rate", "100", "--seed", "3", "-o", str(out),
            "--set", "workload.max_tokens=12", "--set", "slo.ttft_ms=1000"]  # fmt: skip
    r = CliRunner().invoke(_app(), ["replay", *args])
    assert r.exit_code == 0, r.output
    assert "p99_e2el_ms" in r.stdout and "max_send_lag_ms" in r.stdout
    doc = json.loads((out / "replay.json").read_text())
    assert doc["summary"]["completed"] == 25 and doc["summary"]["failed"] == 0
    assert doc["summary"]["good_requests"] == 25 and doc["model"] == "stub"
    assert doc["meta"]["workload"]["seed"] == 3 and doc["config"]["url"] == url
    assert (out / "replay.png").stat().st_size > 10_000
    rows = (out / "replay.csv").read_text().splitlines()
    assert len(rows) == 26 and rows[0].startswith("id,tenant,ok,status")
    assert engine.received == 25

    args = ["--url", url, "-n", "5", "--set", "workload.max_tokens=4", "--no-stream", "--json",
            "-o", str(out), "--api-key", "secret"]  # fmt: skip
    r = CliRunner().invoke(_app(), ["replay", *args])
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert s["completed"] == 5 and s["mean_tpot_ms"] is None
    assert "secret" not in (out / "replay.json").read_text()


def test_cli_bad_input_exits_2_naming_the_field(tmp_path):
    cases = [
        (["--endpoint", "bogus"], "replay.endpoint"),
        (["--url", "ftp://x"], "replay.url"),
        (["--set", "replay.time_scale=-1"], "replay.time_scale"),
        (["-n", "0"], "workload.num_requests"),
        (["--set", "nonsense=1"], "nonsense"),
        (["--set", "replay.max_concurrency"], "KEY=VALUE"),
        # a long path, printed whole (an error wrapped at 80 columns breaks the path it names)
        (["-w", "azure", "--path", str(tmp_path / ("x" * 90) / "missing.csv")], str(tmp_path / ("x" * 90) / "missing.csv")),
        (["--tokenizer", str(tmp_path / "nope.json")], "--tokenizer"),
    ]
    for args, needle in cases:
        r = CliRunner().invoke(_app(), ["replay", *args, "-o", str(tmp_path)])
        assert r.exit_code == 2, (args, r.output)
        assert needle in r.stderr, (args, r.stderr)
        assert r.exception is None or isinstance(r.exception, SystemExit), (args, r.exception)


def test_cli_unreachable_server_exits_1_with_a_clear_message(tmp_path):
    url = f"http://127.0.0.1:{closed_port()}"
    r = CliRunner().invoke(_app(), ["replay", "--url", url, "-n", "3", "-o", str(tmp_path)])
    assert r.exit_code == 1 and "cannot reach" in r.stderr and "Traceback" not in r.output
    r = CliRunner().invoke(
        _app(), ["replay", "--url", url, "--model", "m", "-n", "3", "-o", str(tmp_path)]
    )
    assert r.exit_code == 1 and "every request failed" in r.stderr and "ConnectError x3" in r.stderr
