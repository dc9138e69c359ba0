"""`Upstream`, the gateway's HTTP/1.1 client, against real servers: uvicorn serving the stub
(a test double of an engine; the HTTP stack is real) and raw sockets for the failure cases."""

from __future__ import annotations

import asyncio
import json
import socket
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from presched.serve.upstream import Upstream, UpstreamError, UpstreamTimeout


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


# --- the response parser, fuzzed against a real loopback socket server ----------------------------
# Each example starts an asyncio TCP server on a free loopback port that reads the request, writes
# the response in the drawn pieces (each written and drained on its own, so the client's reads see
# those splits or merges of them) and closes. The client must return the exact body or raise
# UpstreamError: any other exception, or no answer within 10 s (a hang), fails the property.
FUZZ = settings(max_examples=40, deadline=None)


async def _exchange(pieces: list[bytes], **upstream_kw) -> bytes:
    async def handle(reader, writer):
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            n = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
            await reader.readexactly(n)
            for p in pieces:
                writer.write(p)
                await writer.drain()
                await asyncio.sleep(0)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    up = Upstream(**upstream_kw)
    try:
        async with asyncio.timeout(10):
            r = await up.post(url, "/v1/completions", b'{"x": 1}')
            try:
                return await r.aread()
            finally:
                await r.aclose()
    finally:
        await up.aclose()
        server.close()


def _outcome(pieces: list[bytes], **kw) -> bytes | UpstreamError:
    try:
        return asyncio.run(_exchange(pieces, **kw))
    except UpstreamError as e:
        return e


def _split(data: bytes, cuts: list[int]) -> list[bytes]:
    cuts = sorted({min(c, len(data)) for c in cuts})
    return [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)]) if b > a]


@st.composite
def chunked(draw, max_chunk: int = 4096):
    """(body, the whole chunked response): random chunk sizes, hex case, leading zeros,
    extensions and trailers."""
    body = draw(st.binary(max_size=3000))
    cuts = draw(st.lists(st.integers(1, max(len(body), 1)), max_size=8))
    parts = _split(body, cuts)
    wire = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    for p in parts:
        size = format(len(p), draw(st.sampled_from(["x", "X", "04x"]))).encode()
        ext = draw(st.sampled_from([b"", b";name=value", b" ; a"]))
        wire += size + ext + b"\r\n" + p + b"\r\n"
    wire += b"0\r\n" + draw(st.sampled_from([b"", b"X-Trailer: 1\r\n"])) + b"\r\n"
    return body, wire


@FUZZ
@given(chunked(), st.lists(st.integers(0, 4000), max_size=10))
def test_chunked_bodies_in_any_framing_and_split_come_back_exactly(case, splits):
    body, wire = case
    assert _outcome(_split(wire, splits)) == body


@FUZZ
@given(st.binary(max_size=5000), st.lists(st.integers(0, 6000), max_size=10))
def test_content_length_bodies_split_anywhere_come_back_exactly(body, splits):
    wire = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    assert _outcome(_split(wire, splits)) == body


@FUZZ
@given(st.one_of(chunked(), st.binary(min_size=1, max_size=2000).map(
    lambda b: (b, b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(b) + b))), st.data())  # fmt: skip
def test_a_response_cut_anywhere_gives_a_clean_error(case, data):
    """Cut before its end (the server closes there): UpstreamError — except a chunked one cut
    after its last-chunk line, in the trailers (the body is whole then, and given)."""
    body, wire = case
    cut = data.draw(st.integers(0, len(wire) - 1))
    got = _outcome([wire[:cut]])
    chunked_end = wire.rindex(b"0\r\n") + 3 if b"Transfer-Encoding" in wire else len(wire)
    if cut >= chunked_end:
        assert got == body
    else:
        assert isinstance(got, UpstreamError), (cut, got)


@FUZZ
@given(st.binary(max_size=400), st.lists(st.integers(0, 500), max_size=5))
def test_garbage_gives_a_clean_error_or_bytes(junk, splits):
    got = _outcome(_split(junk, splits))
    assert isinstance(got, (bytes, UpstreamError))


@FUZZ
@given(chunked(), st.integers(0, 3))
def test_chunks_over_max_chunk_bytes_are_refused(case, _):
    body, wire = case
    got = _outcome([wire], max_chunk_bytes=1024)
    sizes = [int(line.split(b";")[0], 16) for line in wire.split(b"\r\n\r\n", 1)[1].split(b"\r\n")[::2]
             if line and _is_hex(line.split(b";")[0].strip())]  # fmt: skip
    if max(sizes, default=0) > 1024:
        assert isinstance(got, UpstreamError) and "exceeds 1024" in str(got)
    else:
        assert got == body


def _is_hex(b: bytes) -> bool:
    return bool(b) and all(c in b"0123456789abcdefABCDEF" for c in b)


@pytest.mark.parametrize("reply", [
    b"HTTP/1.1 200 OK\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n",                 # headers over 64 KiB
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + b"f" * 70_000 + b"\r\n",  # a size line over 64 KiB
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nffffffffffffffffff\r\n",  # a 2**72 - 1 byte chunk
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n-5\r\nabc\r\n0\r\n\r\n",  # int() would take it
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x3\r\nabc\r\n0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabcXY0\r\n\r\n",      # no CRLF after the data
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\nabc",
    b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 1_0\r\n\r\n0123456789",
    b"HTTP/1.1 200 OK\r\nContent-Length: " + b"9" * 5000 + b"\r\n\r\n",          # int() would raise ValueError
    b"HTTP/1.1 2000 OK\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 abc OK\r\n\r\n",
    b"SSH-2.0-OpenSSH\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n",
    b"HTTP/1.1 100 Continue\r\n\r\n",
])  # fmt: skip
def test_malformed_or_oversized_responses_raise_upstream_error(reply):
    got = _outcome([reply])
    assert isinstance(got, UpstreamError), got


async def _paced_exchange(pieces: list[tuple[float, bytes]], consume_s: float, **kw) -> bytes:
    """Like `_exchange`, but the server sleeps before each piece and the client sleeps
    `consume_s` after each chunk it reads (a slow client of the gateway)."""

    async def handle(reader, writer):
        await reader.readuntil(b"\r\n\r\n")
        for pause, p in pieces:
            await asyncio.sleep(pause)
            writer.write(p)
            await writer.drain()
        await reader.read()  # until the client closes

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    up = Upstream(**kw)
    try:
        r = await up.post(url, "/v1/completions", b"")
        out = b""
        try:
            async for c in r.aiter_raw():
                out += c
                await asyncio.sleep(consume_s)
        finally:
            await r.aclose()
        return out
    finally:
        await up.aclose()
        server.close()


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n" % len(data) + data + b"\r\n"


HEAD = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"


def test_a_backend_silent_past_idle_timeout_s_raises_upstream_timeout():
    pieces = [(0, HEAD + _chunk(b"one")), (1.0, _chunk(b"two") + b"0\r\n\r\n")]
    with pytest.raises(UpstreamTimeout, match=r"nothing for 0.2 s \(idle_timeout_s\)"):
        asyncio.run(_paced_exchange(pieces, 0, idle_timeout_s=0.2))


def test_a_backend_silent_before_its_first_body_bytes_raises_after_first_byte_timeout_s():
    pieces = [(0, HEAD), (1.0, _chunk(b"one") + b"0\r\n\r\n")]
    with pytest.raises(UpstreamTimeout, match=r"first_byte_timeout_s"):
        asyncio.run(_paced_exchange(pieces, 0, first_byte_timeout_s=0.2, idle_timeout_s=60))


def test_a_slow_reader_is_not_a_stalled_backend():
    """The time the reader spends between chunks (the gateway waiting on its own client) is not
    the backend's silence: only time spent waiting for bytes counts."""
    # the pieces arrive while the reader is busy (every 0.3 s; it reads one per 0.6 s): no read
    # waits, though the backend is silent for longer than 0.2 s between pieces
    pieces = [(0, HEAD + _chunk(b"one")), (0.3, _chunk(b"two")), (0.3, _chunk(b"three") + b"0\r\n\r\n")]
    assert asyncio.run(_paced_exchange(pieces, 0.6, first_byte_timeout_s=5, idle_timeout_s=0.2)) == b"onetwothree"
