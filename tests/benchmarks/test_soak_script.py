"""benchmarks/soak.py: its accounting on hand-made cases (the answer is known), its stalling
backend over real HTTP, and two --quick runs end to end (real processes: `presched serve`, the
repo's stub and the soak's stalling server — both test doubles, not engines — real HTTP, the
real SQLite request log)."""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import httpx
import pytest
from builders import BENCHMARKS, load_benchmark, printed_figures

SCRIPT = BENCHMARKS / "soak.py"
FIGURES = ("soak_lost", "soak_duplicated", "soak_gateway_5xx", "soak_rss_growth_mb",
           "soak_live_blocks_growth", "soak_victim_p99_wait_s", "soak_rss_high_water_mb",
           "soak_peak_in_flight")  # the issue's lines, then context, in the printed order  # fmt: skip


@pytest.fixture(scope="module", autouse=True)
def acc():
    load_benchmark("soak.py")  # puts benchmarks/ on sys.path for its helper modules
    return load_benchmark("soak_account.py")


def rec(uid, outcome="ok", status=200, rid=None, kind="normal", msg=None, tenant="victim"):
    return {"uid": uid, "tenant": tenant, "kind": kind, "stream": False, "status": status,
            "rid": rid if rid is not None else (f"cmpl-{uid}" if status == 200 else None),
            "outcome": outcome, "msg": msg, "t_send": 0.0, "t_end": 0.1}  # fmt: skip


def row(uid, status=200, error=None, tenant="victim", wait=0.0, rid=None):
    return {"id": rid or f"cmpl-{uid}", "tenant": tenant, "status": status, "error": error,
            "prompt": f"soak-{uid} the gateway", "queue_wait_s": wait, "backend": "a"}  # fmt: skip


def test_clean_requests_count_nothing(acc):
    a = acc.account([rec("s0"), rec("s1"), rec("s2", "answered", 400, kind="n_3")],
                    [row("s0"), row("s1")])  # fmt: skip
    assert (a["lost"], a["duplicated"], a["gateway_5xx"]) == (0, 0, 0)
    assert (
        a["sent"] == 3
        and a["logged_once"] == 2
        and a["accepted"] == 2
        and a["malformed_accepted"] == 0
    )


def test_lost_is_unanswered_or_accepted_but_unlogged(acc):
    recs = [rec("s0", "timeout", None),                 # stalled, the gateway logged a 499
            rec("s1"),                                   # a 200 the log never saw
            rec("s2", "left"),                           # left on purpose and logged: fine
            rec("s3", "left"),                           # left on purpose, never logged: lost
            rec("s4", "conn_error", None, msg="reset"),  # no answer, no row
            rec("s5", "cut"),                            # a 200 that ended without [DONE]
            rec("s6", "answered", 429, tenant="flood"),  # refused before acceptance: not logged
            rec("s7", "not_sent", None)]  # never sent: not counted  # fmt: skip
    rows = [row("s0", 499), row("s2", 499), row("s5", 502, "backend a broke the stream")]
    a = acc.account(recs, rows)
    assert a["lost"] == 5 and a["examples"]["lost"] == ["s0", "s1", "s3", "s4", "s5"]
    assert a["unanswered"] == 3 and a["accepted_unlogged"] == 2 and a["unanswered_accepted"] == 2
    assert a["conn_errors"] == {"reset": 1}
    assert a["sent"] == 7 and a["not_sent"] == 1 and a["duplicated"] == 0


def test_duplicates_count_each_request_once(acc):
    recs = [rec("s0"), rec("s1", rid="cmpl-x"), rec("s2", rid="cmpl-x"), rec("s3")]
    rows = [row("s0"), row("s0", rid="cmpl-s0-retry"), row("s1", rid="cmpl-x"), row("s2", rid="cmpl-y"),
            row("s3")]  # fmt: skip
    a = acc.account(recs, rows)
    assert a["duplicated"] == 3 and a["examples"]["duplicated"] == ["s0", "s1", "s2"]
    assert a["logged_once"] == 3 and a["lost"] == 0


def test_5xx_from_a_backend_is_allowed_anything_else_counts(acc):
    recs = [rec("s0", "stream_error", 200), rec("s1", "answered", 502), rec("s2", "answered", 500),
            rec("s3", "answered", 503, msg="no healthy backend serves model 'stub'"),
            rec("s4", "answered", 503, msg="overloaded"), rec("s5", "answered", 504)]  # fmt: skip
    rows = [row("s0", 502, "backend a broke the stream: reset"),
            row("s1", 502, "backend b failed before responding and 3 backends were tried"),
            row("s2", 500, "gateway error: KeyError: 'x'"), row("s5", 504, None),
            row("s9", 500, "gateway error: stray")]  # logged, never sent by this phase  # fmt: skip
    a = acc.account(recs, rows)
    assert a["gateway_5xx"] == 4 and a["examples"]["gateway_5xx"] == ["s2", "s4", "s5", "s9"]
    assert sum(n for k, n in a["five_xx_causes"].items() if " backend:" in k) == 3
    assert a["stray_logged"] == 1


def test_victim_p99_wait_reads_only_the_victims_rows(acc):
    rows = [row(f"s{i}", wait=i / 100) for i in range(101)]
    rows += [row(f"s{i}", tenant="flood", wait=50.0) for i in range(101, 150)]
    a = acc.account([rec(f"s{i}") for i in range(150)], rows)
    assert a["victim_p99_wait_s"] == pytest.approx(0.99)
    assert math.isnan(
        acc.account([rec("s0", tenant="flood")], [row("s0", tenant="flood")])["victim_p99_wait_s"]
    )


def test_every_request_carries_its_id_and_malformed_ones_are_malformed(acc):
    load = load_benchmark("soak_load.py")
    rng = random.Random(0)
    for kind in ("normal", "leave", *acc.MALFORMED):
        r = load.build(rng, "s7", "flood", kind, "stub", (4, 8))
        assert acc.UID.search(r.body.decode())[1] == "s7", kind
        if kind in ("truncated_json", "not_object"):
            assert not isinstance(_json_or_none(r.body), dict)
        elif kind == "too_large":
            assert len(r.body) > load.MAX_BODY
    assert load.build(rng, "s8", "victim", "leave", "stub", (4, 8)).stream


def test_plan_has_the_tenants_chaos_shares_and_flood_bursts(acc):
    load = load_benchmark("soak_load.py")
    recs, times = load.plan(
        random.Random(1), "s", 200.0, 20.0, "stub", (4, 8), True, 1, flood_every=10.0
    )
    assert (times[1:] >= times[:-1]).all() and times[0] >= 0 and times[-1] < 20
    assert len({r.uid for r in recs}) == len(recs) == len(times)
    poisson = 200 * 20
    bursts = [t for t in times if 2.5 <= t < 3.5 or 12.5 <= t < 13.5]
    assert len(bursts) == pytest.approx(2 * 400 + 2 * 200, rel=0.1)  # 2 bursts of 2 x rps + Poisson
    kinds = [r.kind for r in recs]
    assert kinds.count("leave") / poisson == pytest.approx(0.05, rel=0.15)
    assert sum(k in acc.MALFORMED for k in kinds) / poisson == pytest.approx(0.05, rel=0.15)
    victims = sum(r.tenant == "victim" for r in recs)
    assert victims / poisson == pytest.approx(0.2, rel=0.1)  # bursts are all the flood tenant's
    calm, _ = load.plan(random.Random(1), "r", 200.0, 20.0, "stub", (4, 8), False, 1)
    assert {r.kind for r in calm} == {"normal"} and len(calm) == pytest.approx(poisson, rel=0.05)


def _json_or_none(raw: bytes):
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return None


def test_stall_server_stalls_after_headers_and_survives_a_kill(tmp_path):
    be = load_benchmark("soak_backends.py")
    p = be.Proc("stall", "stall", be.free_port(), tmp_path, "stub", 0.0, dict(os.environ))
    body = {"model": "stub", "prompt": "soak-s0 x", "max_tokens": 3, "stream": True}
    try:
        p.start()
        with httpx.Client(timeout=5) as c:
            assert c.post(f"{p.url}/v1/completions", json=body).text.endswith("data: [DONE]\n\n")
            assert json.loads(be.post_json(f"{p.url}/soak/stall", b'{"on": true}'))["stalling"]
            with c.stream("POST", f"{p.url}/v1/completions", json=body, timeout=1.0) as r:
                assert r.status_code == 200  # the headers came
                with pytest.raises(httpx.ReadTimeout):  # and then nothing
                    next(r.iter_raw())
        p.kill()
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{p.url}/health", timeout=1)
        p.start()  # same port, a fresh process: not stalling
        r = httpx.post(f"{p.url}/v1/completions", json={**body, "stream": False}, timeout=5)
        assert r.json()["usage"]["completion_tokens"] == 3 and p.starts == 2
    finally:
        p.stop()
    assert p.proc is None


def run_quick(tmp_path, *extra):
    t = time.monotonic()
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--out", str(tmp_path), *extra],
                          capture_output=True, text=True, timeout=150, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert time.monotonic() - t < 60  # ~20 s on 2 busy cores
    figures = printed_figures(proc.stdout)
    assert list(figures) == list(FIGURES), proc.stdout[-2000:]
    res = json.loads((tmp_path / "soak.json").read_text())
    assert (tmp_path / "soak.png").stat().st_size > 10_000
    assert res["figures"] == pytest.approx({k: figures[k] for k in FIGURES}, rel=1e-3, nan_ok=True)
    return figures, res


def test_quick_run_without_chaos_loses_nothing_and_logs_every_request_once(tmp_path):
    figures, res = run_quick(tmp_path, "--no-chaos", "--rps", "20")
    a = res["accounting"]
    assert (figures["soak_lost"], figures["soak_duplicated"], figures["soak_gateway_5xx"]) == (
        0,
        0,
        0,
    )
    assert a["sent"] > 150 and a["not_sent"] == 0  # 20 req/s for 12 s, Poisson
    assert a["outcomes"] == {"ok": a["sent"]} and a["logged_once"] == a["sent"] == a["logged_rows"]
    assert a["log_statuses"] == {"200": a["sent"]} and a["unknown_rows"] == 0
    assert res["events"] == [] and res["capacity"] is None and res["drain"]["clean"]
    assert (
        math.isfinite(figures["soak_victim_p99_wait_s"]) and figures["soak_victim_p99_wait_s"] >= 0
    )


def test_quick_chaos_run_reports_every_figure_and_its_counts_add_up(tmp_path):
    figures, res = run_quick(tmp_path)
    a = res["accounting"]
    assert [s["rate"] for s in res["capacity"]["steps"]][:1] == [10]  # the ramp ran first
    assert res["meta"]["rps"] == pytest.approx(0.8 * (res["capacity"]["capacity_rps"] or 5))
    assert sum(a["outcomes"].values()) == a["sent"] > 50
    assert {"kill a", "a up", "stall_on", "stall_off"} <= {e["event"] for e in res["events"]}
    kinds = set(a["by_kind"])
    assert "normal" in kinds and "leave" in kinds and kinds - {"normal", "leave"}  # some malformed
    assert (
        a["lost"] <= a["unanswered"] + a["accepted_unlogged"] and figures["soak_lost"] == a["lost"]
    )
    assert all(s["rss_mb"] >= s["anon_mb"] > 10 for s in res["samples"]) and res["drain"]["clean"]
    growth = res["end"]["anon_mb"] - res["after_warmup"]["anon_mb"]
    assert figures["soak_rss_growth_mb"] == pytest.approx(growth, abs=1e-3)
    # the warm-up takes in the first kill, so the growth starts after its backlog's high-water mark
    assert res["after_warmup"]["t"] >= res["meta"]["warmup_s"] >= res["meta"]["kill_every_s"]
    high = max(s["anon_mb"] for s in res["samples"]) - res["samples"][0]["anon_mb"]
    assert figures["soak_rss_high_water_mb"] == pytest.approx(high, abs=1e-3) and high >= 0
    assert figures["soak_peak_in_flight"] == max(s["in_flight"] for s in res["samples"]) >= 1
    live = [s["python_allocated_blocks"] for s in res["samples"]]  # the gateway's /metrics, each sample
    assert all(v > 10_000 for v in live)  # read while the gateway runs (NaN: /metrics did not answer)
    blocks = res["end"]["python_allocated_blocks"] - res["after_warmup"]["python_allocated_blocks"]
    assert figures["soak_live_blocks_growth"] == blocks


@pytest.mark.parametrize("flag", [["--duration", "0"], ["--rps", "-1"], ["--max-outstanding", "0"],
                                  ["--flood-size", "50"], ["--kill-every", "-1"], ["--duration", "1e9"]])  # fmt: skip
def test_bad_flags_are_refused_naming_the_flag(flag):
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), *flag],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2 and flag[0] in proc.stderr and "Traceback" not in proc.stderr


def _children(pid: int) -> list[int]:
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            if int(stat.read_text().rsplit(")", 1)[1].split()[1]) == pid:
                out.append(int(stat.parent.name))
        except (OSError, ValueError, IndexError):
            pass
    return out


def test_sigterm_mid_run_stops_every_process_it_started(tmp_path):
    proc = subprocess.Popen([sys.executable, str(SCRIPT), "--quick", "--rps", "10", "--duration", "60",
                             "--out", str(tmp_path)], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        for line in proc.stdout:  # the servers are up once the soak starts
            if line.startswith("soak:"):
                break
        kids = _children(proc.pid)
        assert len(kids) == 4  # gateway, a, b, stall
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 128 + signal.SIGTERM
    finally:
        if proc.poll() is None:
            proc.kill()
        left = [
            k for k in _children(proc.pid) + locals().get("kids", []) if Path(f"/proc/{k}").exists()
        ]
        for k in left:  # only processes the script started; a failing run must not leak them
            os.kill(k, signal.SIGKILL)
    assert not left
    assert not (tmp_path / "soak.json").exists()  # nothing half-written


def test_load_client_reads_every_framing_leaves_and_times_out_over_real_http(tmp_path):
    """The soak's HTTP/1.1 client against the stalling server (a stub-like test double) in its
    own process: JSON and chunked SSE answers, keep-alive reuse, a client that leaves mid-stream
    (the server sees its connection close), an error answer, and a stall that times out."""
    load = load_benchmark("soak_load.py")
    be = load_benchmark("soak_backends.py")
    p = be.Proc("stall", "stall", be.free_port(), tmp_path, "stub", 0.01, dict(os.environ))
    rng = random.Random(0)

    def req(uid, kind="normal", stream=False, **change):
        r = load.build(rng, uid, "victim", kind, "stub", (20, 20))
        body = {**json.loads(r.body), "stream": stream, **change} if kind == "normal" else None
        r.stream = stream if body else r.stream
        r.body = json.dumps(body).encode() if body else r.body
        return r

    async def main():
        c = load.Client(p.url, timeout_s=2.0, max_outstanding=10)
        plain, sse, left = req("s0"), req("s1", stream=True), req("s2", "leave")
        bad = req("s3", max_tokens="many")  # the stub itself fails on this: a 500, not parsed
        idle = []
        for r in (plain, sse, left):
            await c.send(r)
            idle.append(len(c.idle))
        await c.send(bad)
        be.post_json(f"{p.url}/soak/stall", b'{"on": true}')
        hung = req("s4", stream=True)
        await c.send(hung)
        await c.aclose()
        return plain, sse, left, hung, bad, idle

    try:
        p.start()
        plain, sse, left, hung, bad, idle = asyncio.run(main())
        stats = json.loads(urllib.request.urlopen(f"{p.url}/soak/stats", timeout=5).read())
    finally:
        p.stop()
    assert (plain.outcome, plain.status, sse.outcome, sse.status) == ("ok", 200, "ok", 200)
    assert left.outcome == "left" and left.status == 200
    assert idle == [1, 1, 0]  # one connection served both answers; leaving closed it
    assert (hung.outcome, hung.status) == ("timeout", 200), hung.msg  # headers, then nothing
    assert (bad.outcome, bad.status) == ("answered", 500) and stats["stalled"] == 1
    assert all(r.t_end >= r.t_send for r in (plain, sse, left, hung))
    assert hung.t_end - hung.t_send == pytest.approx(2.0, abs=1.0)


def test_load_client_resends_once_when_a_kept_alive_connection_was_closed_unread():
    """A server (a real TCP test double in this process) answers the first request on a
    connection with a keep-alive 200, then closes that connection when the next request arrives,
    without answering it: the client sends that request once more on a new connection (without
    the resend it would count a request the server never answered as lost)."""
    load = load_benchmark("soak_load.py")
    seen = []

    async def handle(reader, writer):
        served = 0
        while True:
            try:
                head = await reader.readuntil(b"\r\n\r\n")
            except asyncio.IncompleteReadError:
                break
            n = int(re.search(rb"content-length: (\d+)", head.lower())[1])
            seen.append(json.loads(await reader.readexactly(n))["prompt"].split()[0])
            if served:
                break  # closed unanswered
            body = b'{"choices": [{"text": "x"}]}'
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
            served += 1
        writer.close()

    async def main():
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        c = load.Client(f"http://127.0.0.1:{port}", timeout_s=5.0, max_outstanding=4)
        recs = []
        for uid in ("s0", "s1"):
            r = load.build(random.Random(0), uid, "victim", "normal", "stub", (4, 4))
            r.stream = False
            r.body = json.dumps({**json.loads(r.body), "stream": False}).encode()
            await c.send(r)
            recs.append(r)
        await c.aclose()
        server.close()
        return recs

    a, b = asyncio.run(main())
    assert (a.outcome, b.outcome) == ("ok", "ok"), b.msg
    assert seen == ["soak-s0", "soak-s1", "soak-s1"]  # s1 reached the server twice, answered once
