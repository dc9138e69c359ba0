"""`presched replay` against real HTTP servers on loopback (uvicorn in a thread, see conftest).

The upstream is `StubEngine`, a test double of an engine with exactly known timing (each reply
has exactly max_tokens tokens, one every token_s seconds), so every figure can be computed by
hand. The real-engine tier (vLLM on the CPU) lives in tests/engine; the presched gateway here is
the real one.

No test depends on how fast the machine is. The stub never answers early, so its timing is a
floor that a busy machine only raises; the generator's timestamps are checked against the
server's (causality: sent before received, received before the first token came back) and the
figures against the rows they summarize, not against a ceiling.
"""

from __future__ import annotations

import json
import math
import socket
import time

import numpy as np
import pytest
import typer
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
from typer.testing import CliRunner

from presched.loadgen.cli import replay
from presched.loadgen.replay import (
    ReplayConfig,
    ReplayError,
    request_body,
    run_replay,
    synthetic_prompt,
)
from presched.metrics.summary import GoodputSLO, summarize
from presched.workload.request import Request


def _reqs(lengths, gap_s=0.0, **kw) -> list[Request]:
    return [Request(id=f"r{i}", prompt_tokens=16, arrival=i * gap_s, output_tokens=n, **kw)
            for i, n in enumerate(lengths)]  # fmt: skip


class _Recorder:
    """ASGI wrapper around a real app: notes when each generation request reaches the server
    (same process, same perf_counter clock) and can add response headers, as the presched
    gateway adds x-presched-queue-wait-ms / x-presched-backend."""

    def __init__(self, app, headers=None):
        self.app, self.headers, self.received, self.ports = app, headers, [], []
        self.in_flight = self.max_in_flight = 0
        self.auth: list[str] = []

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].endswith("completions"):
            return await self.app(scope, receive, send)
        self.received.append(time.perf_counter())
        self.ports.append(scope["client"][1])
        self.auth.append(dict(scope["headers"]).get(b"authorization", b"").decode())
        extra = self.headers(len(self.received)) if self.headers else {}

        finished = False

        def finish():
            nonlocal finished
            if not finished:
                finished, self.in_flight = True, self.in_flight - 1

        async def send_with_headers(msg):
            if msg["type"] == "http.response.start" and extra:
                added = [(k.encode(), v.encode()) for k, v in extra.items()]
                msg = dict(msg, headers=[*msg["headers"], *added])
            if msg["type"] == "http.response.body" and not msg.get("more_body", False):
                # a request stops counting when its last byte is handed to the server, not when
                # the app's coroutine returns: the client may read that byte and start its next
                # request before a busy server thread gets back to this coroutine
                finish()
            await send(msg)

        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await self.app(scope, receive, send_with_headers)
        finally:
            finish()


def assert_one_clock(received: list[float], rows: list[dict], before: float) -> None:
    """The server's receive times (perf_counter, same process) agree with the generator's own
    timestamps (seconds from its start t0): some t0 >= `before` (taken just before the run) has
    every request sent before the server got it and got by the server before its first token
    came back: max(recv - first_token) <= t0 <= min(recv - sent), compared in sorted order
    (which server receipt belongs to which request is not known; the k-th smallest of each
    keeps both bounds). A timing relation that holds on any machine, however slow."""
    recv = np.sort(np.asarray(received))
    sent = np.sort([r["sent_s"] for r in rows])
    first = np.sort([r["first_token_s"] for r in rows])
    assert len(recv) == len(rows)
    lo, hi = max(before, float(np.max(recv - first))), float(np.min(recv - sent))
    assert lo <= hi + 1e-6, (lo, hi)
    for r in rows:  # the generator's own books: sent = schedule + its lateness + slot wait
        assert r["send_lag_ms"] >= 0 and r["client_wait_ms"] >= 0
        parts = r["scheduled_s"] + (r["send_lag_ms"] + r["client_wait_ms"]) / 1e3
        assert r["sent_s"] == pytest.approx(parts)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --- timing ---------------------------------------------------------------------------------------
def test_requests_reach_the_server_at_their_arrival_times(asgi_server):
    from presched.serve.stub import StubEngine

    arrivals = [0.0, 0.03, 0.05, 0.12, 0.121, 0.2, 0.26, 0.3, 0.41, 0.45]
    reqs = [
        Request(id=f"r{i}", prompt_tokens=8, arrival=a, output_tokens=4)
        for i, a in enumerate(arrivals)
    ]
    rec = _Recorder(StubEngine(token_s=0.5).app())  # each reply takes 1.5 s: longer than the run
    url = asgi_server(rec)
    before = time.perf_counter()
    res = run_replay(reqs, ReplayConfig(url=url, model="stub"))
    assert res.summary["failed"] == 0 and res.summary["completed"] == len(reqs)
    assert [r["scheduled_s"] for r in res.rows] == pytest.approx(arrivals)
    # never early, and the lateness it reports is the lateness the server saw
    assert_one_clock(rec.received, res.rows, before)
    lag = [r["send_lag_ms"] for r in res.rows]
    assert np.isclose(res.summary["max_send_lag_ms"], max(lag))
    # open loop: no request waited for a reply, so all 10 were at the server at once (a closed
    # loop would have 1); generous: only a stall of ~1 s would end the first reply in time
    assert rec.max_in_flight == len(reqs)


def test_keep_alive_connections_are_reused(asgi_server):
    from presched.serve.stub import StubEngine

    reqs = [
        Request(id=f"r{i}", prompt_tokens=8, arrival=i * 0.05, output_tokens=3) for i in range(8)
    ]

    for stream in (True, False):
        rec = _Recorder(StubEngine().app())
        cfg = ReplayConfig(url=asgi_server(rec), model="stub", stream=stream, max_concurrency=1)
        res = run_replay(reqs, cfg)
        assert res.summary["completed"] == 8
        # one request in flight at a time (on any machine): one connection serves them all
        assert len(set(rec.ports)) == 1, rec.ports


def test_max_concurrency_caps_requests_in_flight_and_reports_the_wait(asgi_server):
    from presched.serve.stub import StubEngine

    token_s = 0.05
    rec = _Recorder(StubEngine(token_s=token_s).app())
    reqs = _reqs([10] * 6)  # all at t=0, each holding its slot >= 9 * 50 ms (the stub's floor)
    url = asgi_server(rec)
    before = time.perf_counter()
    res = run_replay(reqs, ReplayConfig(url=url, model="stub", max_concurrency=2))
    assert res.summary["completed"] == 6
    # never more than 2 at the server; 2 at once (generous: a 450 ms stall would leave 1)
    assert rec.max_in_flight == 2
    assert_one_clock(rec.received, res.rows, before)
    busy = 9 * token_s
    waits = sorted(r["client_wait_ms"] / 1e3 for r in res.rows)
    assert waits[2] >= busy - 0.002 and waits[4] >= 2 * busy - 0.002  # rounds 2 and 3 waited
    assert waits[1] < busy  # round 1 took its slots at once (generous: a 450 ms stall breaks it)
    assert res.summary["max_client_wait_ms"] == pytest.approx(waits[-1] * 1e3)
    # E2E counts from the send (the client wait is reported apart), and the summary is of that
    e2el = [r["e2el_s"] for r in res.rows]
    assert e2el == pytest.approx([r["finish_s"] - r["sent_s"] for r in res.rows])
    assert res.summary["p99_e2el_ms"] == pytest.approx(np.percentile(e2el, 99) * 1e3)


def test_time_scale_stretches_the_schedule(asgi_server):
    from presched.serve.stub import StubEngine

    reqs = [
        Request(id=f"r{i}", prompt_tokens=8, arrival=10 + i * 0.05, output_tokens=2)
        for i in range(4)
    ]

    rec = _Recorder(StubEngine().app())
    url = asgi_server(rec)
    before = time.perf_counter()
    res = run_replay(reqs, ReplayConfig(url=url, model="stub", time_scale=2.0))
    # relative to the first (sent at once), gaps doubled; the server never sees one early
    assert [r["scheduled_s"] for r in res.rows] == pytest.approx([0, 0.1, 0.2, 0.3])
    assert_one_clock(rec.received, res.rows, before)


# --- lengths and bodies ---------------------------------------------------------------------------
def test_forced_lengths_generate_the_true_lengths(stub_server):
    url, engine = stub_server()
    lengths = [1, 2, 7, 30, 64]
    reqs = _reqs(lengths) + [Request(id="capped", prompt_tokens=4, output_tokens=50, max_tokens=9),
                             Request(id="unknown", prompt_tokens=4, max_tokens=5)]  # fmt: skip
    res = run_replay(reqs, ReplayConfig(url=url, max_tokens_default=3))
    assert res.model == "stub"  # asked GET /v1/models
    out = {r["id"]: r["output_tokens"] for r in res.rows}
    assert out == {**{f"r{i}": n for i, n in enumerate(lengths)}, "capped": 9, "unknown": 5}
    assert not any(r["usage_missing"] for r in res.rows)
    assert res.summary["total_output_tokens"] == sum(lengths) + 9 + 5
    assert engine.received == len(reqs)


def test_request_body_fields():
    r = Request(id="a", prompt_tokens=5, output_tokens=40, max_tokens=30, prompt="hi")
    b = request_body(r, ReplayConfig(extra_body={"temperature": 0}), "m", "hi")
    assert b == {"model": "m", "max_tokens": 30, "stream": True, "prompt": "hi", "ignore_eos": True,
                 "stream_options": {"include_usage": True}, "temperature": 0}  # fmt: skip
    b = request_body(r, ReplayConfig(endpoint="chat", stream=False, force_lengths=False), "m", "hi")
    assert b == {"model": "m", "max_tokens": 30, "stream": False,
                 "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
    free = Request(id="b", prompt_tokens=5, output_tokens=40)
    assert (
        request_body(free, ReplayConfig(force_lengths=False, max_tokens_default=7), "m", "x")[
            "max_tokens"
        ]
        == 7
    )


def test_synthetic_prompts_are_deterministic_distinct_and_fit_a_tokenizer():
    r = Request(id="x", prompt_tokens=50)
    p = synthetic_prompt(r, seed=1)
    assert p == synthetic_prompt(r, seed=1) and len(p.split()) == 50
    assert p != synthetic_prompt(Request(id="y", prompt_tokens=50), seed=1)
    assert p != synthetic_prompt(r, seed=2)

    def by_chars(text: str) -> int:  # a tokenizer of about 4 characters a token
        return max(1, round(len(text) / 4))

    for n in (1, 17, 300):
        got = by_chars(synthetic_prompt(Request(id="z", prompt_tokens=n), count_tokens=by_chars))
        assert abs(got - n) <= max(1, 0.02 * n)


def test_api_key_and_per_tenant_keys_are_sent(asgi_server):
    from presched.serve.stub import StubEngine

    rec = _Recorder(StubEngine().app())
    reqs = [Request(id=f"r{i}", prompt_tokens=4, arrival=i * 0.02, output_tokens=2, tenant=t)
            for i, t in enumerate(["a", "b", "c"])]  # fmt: skip
    cfg = ReplayConfig(url=asgi_server(rec), model="stub", api_key="k0", tenant_keys={"b": "kb"})
    res = run_replay(reqs, cfg)
    assert rec.auth == ["Bearer k0", "Bearer kb", "Bearer k0"]
    assert res.summary["num_tenants"] == 3


# --- metrics --------------------------------------------------------------------------------------
def test_metrics_match_the_stubs_known_timing(stub_server):
    token_s = 0.02
    lengths = [2, 4, 6, 16, 20, 5]
    # n tokens, one every token_s, the first at once
    true_e2e = [(n - 1) * token_s for n in lengths]
    reqs = _reqs(lengths, gap_s=0.03)
    url, _ = stub_server(token_s=token_s)
    res = run_replay(reqs, ReplayConfig(url=url, model="stub"), slo=GoodputSLO(e2el_ms=200))
    s, rows = res.summary, res.rows
    assert s["completed"] == len(lengths) and s["failed"] == 0 and s["errors_by_status"] == {}
    e2e = np.array([r["e2el_s"] for r in rows])
    ttft = np.array([r["ttft_s"] for r in rows])
    # The stub never sends early, so its timing is a floor a busy machine only raises: E2E (from
    # the send, before the server got it, to the end, after its last token) is at least it.
    for r, want in zip(rows, true_e2e):
        assert r["e2el_s"] >= want - 0.002 and 0 < r["ttft_s"] <= r["e2el_s"]
        assert r["events"] == r["output_tokens"]  # one content event per token, as sent
        assert r["max_itl_s"] <= r["e2el_s"] - r["ttft_s"] + 1e-9  # every gap after the first token
    # every figure is the simulator's formula on these rows, whatever the machine made of them
    assert s["mean_ttft_ms"] == pytest.approx(ttft.mean() * 1e3)
    n = np.asarray(lengths)
    assert s["median_tpot_ms"] == pytest.approx(np.median((e2e - ttft) / (n - 1)) * 1e3)
    assert s["mean_itl_ms"] == pytest.approx(res.itl[0].mean() * 1e3)
    assert s["mean_itl_ms"] <= ((e2e - ttft).sum() / (n - 1).sum()) * 1e3 + 1e-6  # gaps fit inside
    assert s["p99_e2el_ms"] == pytest.approx(np.percentile(e2e, 99) * 1e3)
    short = np.argsort(n, kind="stable")[:3]  # the shorter half: 2, 4 and 5 tokens
    assert s["short_p99_e2el_ms"] == pytest.approx(np.percentile(e2e[short], 99) * 1e3)
    # goodput counts the requests whose E2E met 200 ms; 300 and 380 ms of tokens never can
    assert s["good_requests"] == int((e2e <= 0.2).sum()) <= 4
    assert s["total_output_tokens"] == sum(lengths)
    # every figure the simulator reports, under the same names
    assert set(summarize(res.records, None, GoodputSLO(e2el_ms=200))) <= set(s)
    # no queue-wait header from the stub: queue wait unknown, reported NaN, not 0
    assert math.isnan(s["mean_queue_wait_ms"]) and math.isnan(s["max_queue_wait_ms"])
    assert [r["instance"] for r in rows] == [-1] * len(lengths)


def test_non_streaming_and_chat(stub_server):
    url, _ = stub_server(token_s=0.01)
    res = run_replay(_reqs([3, 9]), ReplayConfig(url=url, stream=False))
    assert [r["output_tokens"] for r in res.rows] == [3, 9]
    assert all(r["ttft_s"] == r["e2el_s"] for r in res.rows)  # first token seen = finish
    assert math.isnan(res.summary["mean_tpot_ms"]) and math.isnan(res.summary["p99_itl_ms"])

    res = run_replay(_reqs([4, 6]), ReplayConfig(url=url, endpoint="chat"))
    assert [r["output_tokens"] for r in res.rows] == [4, 6]
    assert [r["events"] for r in res.rows] == [4, 6]
    # the gaps between the chat deltas: 8 of them, each after the first token. Their sum lies
    # inside each request's decode time (first token to end); wall-clock floors are not asserted:
    # a shared CI machine's timer slack put 80 ms of stub sleeps at 71.6 ms.
    assert res.itl[0].size == 8 and (res.itl[0] > 0).all()
    assert res.summary["mean_itl_ms"] == pytest.approx(res.itl[0].mean() * 1e3)
    decode_s = sum(r["e2el_s"] - r["ttft_s"] for r in res.rows)
    assert 0 < res.itl[0].sum() <= decode_s + 1e-6


def test_stream_without_usage_counts_events_and_flags_it(stub_server):
    url, _ = stub_server()
    res = run_replay(_reqs([5, 3]), ReplayConfig(url=url, include_usage=False))
    assert [r["output_tokens"] for r in res.rows] == [5, 3]
    assert res.summary["usage_missing"] == 2


def test_gateway_headers_give_queue_wait_and_backend(asgi_server):
    from presched.serve.stub import StubEngine

    # as the presched gateway does; the odd requests carry no queue-wait header
    def headers(k):
        h = {"x-presched-backend": "gpu-a" if k % 2 else "gpu-b"}
        if k % 2:
            h["x-presched-queue-wait-ms"] = str(10.0 * k)
        return h

    url = asgi_server(_Recorder(StubEngine().app(), headers))
    res = run_replay(_reqs([2, 2, 2, 2], gap_s=0.02), ReplayConfig(url=url, model="stub"))
    assert [r["instance"] for r in res.rows] == [0, 1, 0, 1]
    waits = [r["queue_wait_s"] for r in res.rows]
    assert waits[0] == pytest.approx(0.01) and waits[2] == pytest.approx(0.03)
    assert math.isnan(waits[1]) and math.isnan(waits[3])
    assert res.summary["mean_queue_wait_ms"] == pytest.approx(20)
    assert res.summary["max_queue_wait_ms"] == pytest.approx(30)  # over the requests that have it


def test_through_the_presched_gateway_reports_its_queue_waits(asgi_server, stub_server):
    from presched.serve.app import build_app
    from presched.serve.config import ServeConfig

    token_s, n = 0.01, 11  # each request holds the only slot for ~100 ms
    up, _ = stub_server(model="m", token_s=token_s)
    backends = [{"url": up, "model": "m", "max_in_flight": 1}]
    app = build_app(ServeConfig(backends=backends, policy="fcfs", log={"path": None}), None, None)
    url = asgi_server(app)
    reqs = [
        Request(id=f"r{i}", prompt_tokens=8, arrival=i * 0.01, output_tokens=n) for i in range(3)
    ]

    res = run_replay(reqs, ReplayConfig(url=url))
    assert res.summary["completed"] == 3 and res.model == "m"
    wait = [r["queue_wait_s"] for r in res.rows]
    busy = (n - 1) * token_s  # FCFS, one slot: r1 waits for r0, r2 for r0 and r1
    # floors (r1 arrives 10 ms after r0, r2 20 ms after): a busy machine only lengthens the waits
    assert busy - 0.01 - 0.005 <= wait[1] and 2 * busy - 0.02 - 0.005 <= wait[2]
    assert wait[0] < wait[1] < wait[2]  # r0 waited for nobody
    assert res.summary["mean_queue_wait_ms"] == pytest.approx(np.mean(wait) * 1e3)
    assert [r["instance"] for r in res.rows] == [0, 0, 0]


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
    res = run_replay(_reqs([3] * 9, gap_s=0.005), ReplayConfig(url=url))
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
    url = f"http://127.0.0.1:{_closed_port()}"
    res = run_replay(_reqs([3, 3, 3]), ReplayConfig(url=url, model="m", timeout_s=2))
    assert res.summary["failed"] == 3 and res.summary["completed"] == 0
    assert res.summary["errors_by_status"] == {"ConnectError": 3}
    assert all(r["status"] == 0 and "ConnectError" in r["error"] for r in res.rows)
    with pytest.raises(ReplayError, match="cannot reach"):
        run_replay(_reqs([3]), ReplayConfig(url=url, timeout_s=2))


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
        (["-w", "azure", "--path", str(tmp_path / "missing.csv")], "missing.csv"),
        (["--tokenizer", str(tmp_path / "nope.json")], "--tokenizer"),
    ]
    for args, needle in cases:
        r = CliRunner().invoke(_app(), ["replay", *args, "-o", str(tmp_path)])
        assert r.exit_code == 2, (args, r.output)
        assert needle in r.stderr, (args, r.stderr)
        assert r.exception is None or isinstance(r.exception, SystemExit), (args, r.exception)


def test_cli_unreachable_server_exits_1_with_a_clear_message(tmp_path):
    url = f"http://127.0.0.1:{_closed_port()}"
    r = CliRunner().invoke(_app(), ["replay", "--url", url, "-n", "3", "-o", str(tmp_path)])
    assert r.exit_code == 1 and "cannot reach" in r.stderr and "Traceback" not in r.output
    r = CliRunner().invoke(
        _app(), ["replay", "--url", url, "--model", "m", "-n", "3", "-o", str(tmp_path)]
    )
    assert r.exit_code == 1 and "every request failed" in r.stderr and "ConnectError x3" in r.stderr
