"""The gateway's relay under backends that misbehave after their headers, over real HTTP: a
backend that stalls, one that never ends an event, one with CRLF framing, one behind a path
prefix, answers of the wrong shape, and a shutdown (in-process and SIGTERM to `presched serve`)
with requests still in flight.

The gateway and its SQLite log are the real ones (uvicorn on loopback, helpers from
test_gateway_faults); the upstreams are `StubEngine`, a TEST DOUBLE of an engine, in its fault
modes (`stall_after`, `event_end`). Every test ends with `settled(...)`: no slot held, nothing
waiting, one log row per accepted request.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import httpx
from starlette.applications import Starlette
from starlette.routing import Mount

from presched.serve.app import build_app
from presched.serve.backend import MAX_HOLD_S, Backend
from presched.serve.cli import gateway_server
from presched.serve.config import BackendConfig, ServeConfig
from presched.serve.log import RequestLog, read_log
from presched.serve.stub import StubEngine
from serve.test_gateway_faults import (ERROR_KEYS, MODEL, Gw, assert_served, await_until, body, call,
                                       client, drive, parse_sse, settled, start_gateway, wait_until)  # fmt: skip


def _error_of(rep) -> dict:
    last = rep.events[-1]
    assert isinstance(last, dict) and set(last) == {"error"}, rep.events[-3:]
    assert set(last["error"]) == ERROR_KEYS
    return last["error"]


# --- a backend that sends its headers and stalls --------------------------------------------------
def test_a_stalled_stream_ends_with_an_error_event_frees_its_slot_and_counts_against_it(
        asgi_server, stub_server, tmp_path):  # fmt: skip
    """One backend, one slot, two streams: the first stalls after 2 tokens, the second waits for
    the slot. The stall is cut after idle_timeout_s (504 error event, log row), the slot goes to
    the second (which, on the same stalling backend, is cut the same way once the backend's hold
    is over), and each stall counts against the backend and holds it down longer."""
    url, eng = stub_server(stall_after=2)
    g = start_gateway(asgi_server, tmp_path, [("stall", url)], max_in_flight=1,
                      idle_timeout_s=0.3, health_interval_s=0.1)  # fmt: skip
    b = g.gw.backends[0]

    async def main():
        async with client() as c:
            first = asyncio.create_task(call(c, g.url, 10, True, prompt="first"))
            await await_until(lambda: eng.running == 1, what="the first to run")
            second = asyncio.create_task(call(c, g.url, 10, True, prompt="second"))
            return await first, await second

    replies = drive(g, main)
    for rep in replies:
        assert rep.status == 200 and rep.stream_tokens == 2 and not rep.complete
        err = _error_of(rep)
        assert err["code"] == 504 and "stalled" in err["message"] and "idle_timeout_s" in err["message"]
    df = settled(g, rows=2)
    assert (df["status"] == 504).all() and df["error"].str.contains("stall").all()
    assert eng.started == ["first", "second"]
    assert b.failures == 2 and b.strikes == 2  # held down 0.1 s after the first, 0.2 s after the second


def test_a_stalled_whole_response_is_retried_on_another_backend(asgi_server, stub_server, tmp_path):
    stall_url, stalled = stub_server(stall_after=0)  # headers and the first body bytes, then nothing
    ok_url, ok = stub_server()
    g = start_gateway(asgi_server, tmp_path, [("stall", stall_url), ("ok", ok_url)], idle_timeout_s=0.3)

    async def main():
        async with client() as c:
            return await call(c, g.url, 6, False)

    assert_served(drive(g, main), 6, stream=False)
    row = settled(g, rows=1).iloc[0]
    assert row["status"] == 200 and row["backend"] == "ok" and row["retries"] == 1
    assert stalled.received == 1 and ok.received == 1
    assert g.gw.backends[0].failures == 1 and not g.gw.backends[0].healthy


def test_failures_hold_a_backend_down_longer_each_time_until_one_is_served():
    b = Backend(0, BackendConfig(url="http://127.0.0.1:9", model=MODEL), _Fcfs())
    holds = []
    for now in (10.0, 20.0, 30.0, 40.0):
        b.note_failure(now, 2.0)
        holds.append(b.held_until - now)
    assert holds == [2.0, 4.0, 8.0, 16.0] and b.failures == 4
    assert b.held(40.0 + 15.9) and not b.held(40.0 + 16.0)
    for _ in range(40):
        b.note_failure(100.0, 2.0)
    assert b.held_until == 100.0 + MAX_HOLD_S  # capped
    b.note_success()
    b.note_failure(500.0, 2.0)
    assert b.held_until == 502.0 and b.failures == 45


def _Fcfs():
    from presched.schedule.registry import POLICIES

    return POLICIES.create("fcfs")


# --- event framing ----------------------------------------------------------------------------------
def test_a_stream_that_never_ends_an_event_is_cut_at_max_event_bytes(asgi_server, stub_server, tmp_path):
    url, eng = stub_server(event_end="\n")  # events end with one LF: no blank line, ever
    g = start_gateway(asgi_server, tmp_path, [("b", url)], max_event_bytes=1024)

    async def main():
        async with client() as c:
            return await call(c, g.url, 200, True)

    rep = drive(g, main)
    assert rep.status == 200 and len(rep.events) == 1  # nothing relayed but the error
    err = _error_of(rep)
    assert err["code"] == 502 and "max_event_bytes" in err["message"]
    row = settled(g, rows=1).iloc[0]
    assert row["status"] == 502 and "max_event_bytes" in row["error"]
    assert g.gw.backends[0].failures == 1


def test_crlf_framed_events_are_relayed_unchanged_and_counted(asgi_server, stub_server, tmp_path):
    """Events ended by CRLF CRLF (sse-starlette's default framing): the gateway splits them like
    LF ones, so it counts the tokens, reads the usage event and hides it (the client did not ask
    for usage), and relays every other byte as sent."""
    url, eng = stub_server(event_end="\r\n\r\n")
    g = start_gateway(asgi_server, tmp_path, [("b", url)])

    async def main():
        async with client() as c:
            r = await c.post(f"{g.url}/v1/completions", json=body(5, True))
            return r.content

    raw = drive(g, main)
    assert raw.count(b"\r\n\r\n") == 6 and b"usage" not in raw  # 5 tokens + [DONE]
    assert raw.endswith(b"data: [DONE]\r\n\r\n")
    events = parse_sse(raw.replace(b"\r\n", b"\n"))
    assert sum(1 for e in events if isinstance(e, dict)) == 5
    row = settled(g, rows=1).iloc[0]
    assert row["status"] == 200 and row["output_tokens"] == 5 and row["ttft_s"] >= 0


# --- a backend URL with a path --------------------------------------------------------------------
def test_a_backend_behind_a_path_prefix_gets_its_generation_requests_there(asgi_server, tmp_path):
    eng = StubEngine()
    url = asgi_server(Starlette(routes=[Mount("/engine/a", app=eng.app())]))
    g = start_gateway(asgi_server, tmp_path, [("prefixed", url + "/engine/a/v1")])

    async def main():
        async with client() as c:
            return [await call(c, g.url, 3, s) for s in (False, True)]

    for rep, s in zip(drive(g, main), (False, True)):
        assert_served(rep, 3, stream=s)
    assert eng.received == 2
    assert (settled(g, rows=2)["status"] == 200).all()


# --- shutdown -------------------------------------------------------------------------------------
def test_shutdown_drains_for_drain_timeout_s_then_ends_what_is_left(stub_server, tmp_path):
    """SIGTERM (here `should_exit`, which is what uvicorn's signal handler sets) while two
    streams run: the short one finishes within the drain, the stalled one (idle_timeout_s far
    away) is ended after drain_timeout_s with a 503 error event and its log row, and the server
    exits."""
    stall_url, _ = stub_server(stall_after=1)
    ok_url, _ = stub_server(token_s=0.02)
    cfg = ServeConfig(port=0, backends=[BackendConfig(url=stall_url, name="stall", model=MODEL),
                                        BackendConfig(url=ok_url, name="ok", model=MODEL)],
                      idle_timeout_s=600, drain_timeout_s=2.0, health_interval_s=60)  # fmt: skip
    log = RequestLog(tmp_path / "requests.sqlite", batch_s=0.01)
    app = build_app(cfg, predictor=None, log=log)
    server = gateway_server(app, cfg)
    thread = threading.Thread(target=server.run, name="gateway-drain", daemon=True)
    thread.start()
    wait_until(lambda: server.started, 10, "the gateway to start")
    g = Gw(f"http://127.0.0.1:{server.servers[0].sockets[0].getsockname()[1]}", app.state.gateway.gw, log)
    gw = g.gw

    async def main():
        async with client() as c:
            stalled = asyncio.create_task(call(c, g.url, 10, True, prompt="stalled"))
            await await_until(lambda: gw.backends[0].running and gw.backends[0].running[0].first_token,
                              what="the stalled stream's first token")  # fmt: skip
            short = asyncio.create_task(call(c, g.url, 10, True, prompt="short"))  # ~0.2 s
            await await_until(lambda: gw.backends[1].running, what="the short stream to start")
            server.should_exit = True
            return await stalled, await short

    stalled, short = drive(g, main)
    thread.join(10)
    assert not thread.is_alive(), "the gateway did not exit"
    assert stalled.status == 200 and stalled.stream_tokens == 1
    err = _error_of(stalled)
    assert err["code"] == 503 and "drain_timeout_s" in err["message"]
    assert_served(short, 10, stream=True)
    df = settled(g, rows=2).set_index("id")
    assert df.loc[stalled.id, "status"] == 503 and "drain_timeout_s" in df.loc[stalled.id, "error"]
    assert df.loc[short.id, "status"] == 200


# --- answers of the wrong shape ---------------------------------------------------------------------
def odd_shapes_app():
    """An upstream (test double) whose answers are valid JSON of the wrong shape: usage a list,
    choices not a list, events that are a number, a string, choices of numbers."""
    from starlette.requests import Request as HTTPRequest
    from starlette.responses import JSONResponse, Response, StreamingResponse
    from starlette.routing import Route

    odd_events = [b"data: 5", b'data: "text"', b'data: {"choices": 3}', b'data: {"choices": [1, null]}',
                  b'data: {"usage": [1], "choices": [{"text": "a", "finish_reason": {"x": 1}}]}',
                  b'data: {"usage": {"completion_tokens": "7"}, "choices": []}', b"data: [DONE]"]  # fmt: skip

    async def generate(request: HTTPRequest) -> Response:
        body = await request.json()
        if body.get("stream"):
            async def gen():
                for ev in odd_events:
                    yield ev + b"\n\n"

            return StreamingResponse(gen(), media_type="text/event-stream")
        return JSONResponse({"usage": [1, 2], "choices": {"0": {"finish_reason": "stop"}}})

    return Starlette(routes=[Route("/health", lambda r: Response(status_code=200)),
                             Route("/v1/completions", generate, methods=["POST"])]), odd_events  # fmt: skip


def test_answers_of_the_wrong_shape_are_relayed_as_sent_and_logged(asgi_server, tmp_path):
    app, odd_events = odd_shapes_app()
    g = start_gateway(asgi_server, tmp_path, [("odd", asgi_server(app))])

    async def main():
        async with client() as c:
            whole = await c.post(f"{g.url}/v1/completions", json=body(3, False))
            stream = await c.post(f"{g.url}/v1/completions", json=body(3, True))
            return whole, stream

    whole, stream = drive(g, main)
    assert whole.status_code == 200 and whole.json() == {"usage": [1, 2], "choices": {"0": {"finish_reason": "stop"}}}
    assert stream.status_code == 200
    # the usage-only event (the gateway asked for usage, the client did not) is hidden
    assert stream.content == b"".join(ev + b"\n\n" for ev in odd_events if b"completion_tokens" not in ev)
    df = settled(g, rows=2)
    assert (df["status"] == 200).all() and df["output_tokens"].isna().all() and df["finish_reason"].isna().all()


def test_sigterm_to_presched_serve_ends_a_stalled_stream_and_the_process(stub_server, tmp_path):
    """The command as users run it (a real process), a stream stalled on its backend, SIGTERM:
    the stream ends with the 503 error event after drain_timeout_s, its row is in the log, and
    the process exits (it used to wait for the stream forever)."""
    url, _ = stub_server(stall_after=1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log_path = tmp_path / "log.sqlite"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(_SRC), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, "-m", "presched.cli", "serve", "--backend", url, "--port", str(port),
                             "--log", str(log_path), "--set", "drain_timeout_s=1", "--set", "idle_timeout_s=600"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    try:
        gw = f"http://127.0.0.1:{port}"
        wait_until(lambda: _up(gw), 60, "presched serve to answer /health")
        with httpx.Client(timeout=20) as c, c.stream("POST", f"{gw}/v1/completions", json=body(10, True)) as r:
            lines = r.iter_lines()
            assert next(lines).startswith("data: ")  # the one token before the stall
            proc.send_signal(signal.SIGTERM)
            rest = "\n".join(lines)
        rc = proc.wait(20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    out = proc.stdout.read().decode()
    assert rc in (0, -signal.SIGTERM), out  # uvicorn re-raises the signal once it has shut down
    assert '"code": 503' in rest and "drain_timeout_s" in rest, rest
    assert "ending 1 request(s) still in flight" in out, out
    df = read_log(log_path)
    assert len(df) == 1 and df.iloc[0]["status"] == 503


_SRC = Path(__file__).resolve().parents[2] / "src"


def _up(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
