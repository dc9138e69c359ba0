"""`Upstream`, the gateway's HTTP/1.1 client, against real servers: uvicorn serving the stub
(a test double of an engine; the HTTP stack is real) and raw sockets for the failure cases."""

from __future__ import annotations

import asyncio
import json
import socket
import threading

import pytest

from presched.serve.upstream import Upstream, UpstreamError


def _body(max_tokens: int, stream: bool) -> bytes:
    return json.dumps({"model": "stub", "prompt": "hi", "max_tokens": max_tokens, "stream": stream}).encode()


def test_json_and_sse_answers_over_one_keep_alive_connection(stub_server):
    url, eng = stub_server()

    async def main():
        up = Upstream()
        r1 = await up.post(url, "/v1/completions", _body(3, False))
        plain = await r1.aread()
        await r1.aclose()
        r2 = await up.post(url, "/v1/completions", _body(4, True))
        chunks = [c async for c in r2.aiter_raw()]
        await r2.aclose()
        idle = sum(len(p) for p in up._idle.values())
        await up.aclose()
        return r1, plain, r2, chunks, idle

    r1, plain, r2, chunks, idle = asyncio.run(main())
    assert r1.status_code == 200 and r1.headers["content-type"] == "application/json"
    assert json.loads(plain)["usage"]["completion_tokens"] == 3
    assert r2.headers["content-type"].startswith("text/event-stream")
    sse = b"".join(chunks)
    assert sse.count(b"data: ") == 5 and sse.endswith(b"data: [DONE]\n\n")  # 4 tokens + [DONE]
    assert idle == 1  # both requests used the same connection, which is back in the pool
    assert eng.received == 2


def _one_shot_server(replies: list[bytes]) -> tuple[str, threading.Thread, list[bytes]]:
    """A raw socket server: for each connection, read one request, send the next reply, close."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()
    seen: list[bytes] = []

    def run():
        for reply in replies:
            conn, _ = srv.accept()
            with conn:
                seen.append(conn.recv(65536))
                conn.sendall(reply)
        srv.close()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return f"http://127.0.0.1:{srv.getsockname()[1]}", t, seen


def test_a_response_cut_mid_body_raises_and_the_connection_is_not_reused():
    url, t, seen = _one_shot_server([b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort"])

    async def main():
        up = Upstream()
        r = await up.post(url, "/v1/completions", b"{}")
        with pytest.raises(UpstreamError, match="closed the connection mid-response"):
            await r.aread()
        await r.aclose()
        return sum(len(p) for p in up._idle.values())

    assert asyncio.run(main()) == 0
    t.join(5)
    assert seen[0].startswith(b"POST /v1/completions HTTP/1.1\r\n") and seen[0].endswith(b"\r\n\r\n{}")


def test_the_path_of_a_base_url_prefixes_every_request():
    url, t, seen = _one_shot_server([b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"])

    async def main():
        up = Upstream()
        r = await up.post(url + "/serving/llm", "/v1/completions", b"{}")
        return await r.aread()

    assert asyncio.run(main()) == b"ok"
    t.join(5)
    assert seen[0].startswith(b"POST /serving/llm/v1/completions HTTP/1.1\r\n")


def test_a_refused_backend_raises_upstream_error():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"  # nothing listens here

    async def main():
        await Upstream().post(url, "/v1/completions", b"{}")

    with pytest.raises(UpstreamError, match="ConnectionRefused"):
        asyncio.run(main())


def test_a_connection_the_backend_closed_while_idle_is_replaced(stub_server):
    url, eng = stub_server()

    async def main():
        up = Upstream()
        r = await up.post(url, "/v1/completions", _body(1, False))
        await r.aread()
        await r.aclose()
        (conn,) = next(iter(up._idle.values()))
        conn.writer.transport.abort()  # as if the backend's keep-alive timer had closed it
        await asyncio.sleep(0.05)
        r = await up.post(url, "/v1/completions", _body(2, False))
        data = await r.aread()
        await r.aclose()
        return json.loads(data)

    assert asyncio.run(main())["usage"]["completion_tokens"] == 2
    assert eng.received == 2  # the second request reached the backend once


def test_cancelling_a_request_closes_its_connection(stub_server):
    """A client that goes away: the gateway cancels the relay, the upstream connection closes
    (vLLM aborts the request when its client disconnects) and is not reused."""
    url, eng = stub_server(token_s=0.05)

    async def main():
        up = Upstream()
        r = await up.post(url, "/v1/completions", _body(100, True))

        async def relay():
            async for _ in r.aiter_raw():
                pass

        task = asyncio.create_task(relay())
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await r.aclose()
        return sum(len(p) for p in up._idle.values())

    assert asyncio.run(main()) == 0
    deadline = asyncio.run(_wait_released(eng))
    assert deadline


async def _wait_released(eng, timeout: float = 5.0) -> bool:
    """True once the stub has released the cancelled request's slot (it saw the disconnect)."""
    for _ in range(int(timeout / 0.02)):
        if eng.running == 0:
            return True
        await asyncio.sleep(0.02)
    return False
