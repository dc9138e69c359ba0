"""`Upstream`: the gateway's HTTP/1.1 client to its backends — keep-alive connections, one
request per connection at a time, nothing else.

    up = Upstream(connect_timeout_s=5.0)
    resp = await up.post("http://127.0.0.1:8000", "/v1/completions", payload)  # status + headers read
    resp.status_code, resp.headers["content-type"]
    data = await resp.aread()            # or: async for chunk in resp.aiter_raw(): ...
    await resp.aclose()                  # keep-alive if the body was read to its end, else closed
    await up.aclose()                    # at shutdown

Who calls it: `GatewayApp` (app.py), for every generation request. Why not httpx: httpx costs
~1 ms of CPU per proxied request here (its connection pool, anyio locks and h11 framing); this
client costs a tenth of that, and the gateway's added latency is mostly CPU.

Errors: anything that goes wrong on the wire (refused, reset, timeout of the connect, a malformed
response) raises `UpstreamError`. Cancelling a request (the client went away) closes its
connection, which makes vLLM abort the request. A keep-alive connection the backend closed while
idle is detected before reuse (or, if it closes as the request is written, replaced once: the
backend had not read the request).
"""

from __future__ import annotations

import asyncio
import ssl as _ssl
import time
from urllib.parse import urlsplit


class UpstreamError(Exception):
    """A request to a backend failed on the wire (no usable response)."""


class _Conn:
    __slots__ = ("reader", "writer", "used")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer, self.used = reader, writer, 0.0

    def usable(self, now: float, idle_s: float) -> bool:
        return not self.reader.at_eof() and not self.writer.is_closing() and now - self.used < idle_s


class UpstreamResponse:
    """A response whose status line and headers were read; the body is read on demand."""

    def __init__(self, up: "Upstream", key: tuple, conn: _Conn, status: int, headers: dict[str, str]) -> None:
        self.status_code = status
        self.headers = headers  # lower-case names
        self._up, self._key, self._conn = up, key, conn
        self._done = False
        te = headers.get("transfer-encoding", "").lower()
        self._chunked = "chunked" in te
        cl = headers.get("content-length")
        if status in (204, 304) or 100 <= status < 200:
            cl = "0"  # no body
        self._left = int(cl) if cl is not None and not self._chunked else None
        self._keep = headers.get("connection", "").lower() != "close" and (self._chunked or cl is not None)

    async def aiter_raw(self):
        """The body's bytes (transfer framing removed) as they arrive."""
        r = self._conn.reader
        try:
            if self._chunked:
                while True:
                    line = await r.readline()
                    if not line.endswith(b"\n"):
                        raise UpstreamError("the backend closed the connection mid-response")
                    size = int(line.split(b";", 1)[0], 16)
                    if size == 0:
                        while (await r.readline()) not in (b"\r\n", b"\n", b""):
                            pass  # trailers
                        break
                    data = await r.readexactly(size + 2)
                    yield data[:-2]
            elif self._left is not None:
                while self._left > 0:
                    data = await r.read(min(self._left, 65536))
                    if not data:
                        raise UpstreamError("the backend closed the connection mid-response")
                    self._left -= len(data)
                    yield data
            else:  # no framing: the body ends when the backend closes
                while data := await r.read(65536):
                    yield data
        except (OSError, asyncio.IncompleteReadError, ValueError) as e:
            raise UpstreamError(f"{type(e).__name__}: {e}") from None
        self._done = True

    async def aread(self) -> bytes:
        return b"".join([c async for c in self.aiter_raw()])

    async def aclose(self) -> None:
        """Give the connection back (body read to its end) or close it."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._done and self._keep:
            self._up._release(self._key, conn)
        else:
            conn.writer.close()


class Upstream:
    def __init__(self, connect_timeout_s: float = 5.0, max_idle: int = 100, idle_s: float = 4.0) -> None:
        """`idle_s`: drop connections idle longer than this (uvicorn, as vLLM runs it, closes them
        after 5 s)."""
        self.connect_timeout_s, self.max_idle, self.idle_s = connect_timeout_s, max_idle, idle_s
        self._idle: dict[tuple, list[_Conn]] = {}
        self._hosts: dict[str, tuple] = {}
        self._tls: _ssl.SSLContext | None = None

    def _key(self, base: str) -> tuple:
        key = self._hosts.get(base)
        if key is None:
            u = urlsplit(base)
            https = u.scheme == "https"
            key = (u.hostname, u.port or (443 if https else 80), https, u.netloc.encode())
            self._hosts[base] = key
        return key

    async def _connect(self, key: tuple) -> _Conn:
        host, port, https, _ = key
        if https and self._tls is None:
            self._tls = _ssl.create_default_context()
        try:
            r, w = await asyncio.wait_for(asyncio.open_connection(host, port, ssl=self._tls if https else None),
                                          self.connect_timeout_s)  # fmt: skip
        except asyncio.TimeoutError:
            raise UpstreamError(f"connect timeout ({self.connect_timeout_s} s)") from None
        except OSError as e:
            raise UpstreamError(f"{type(e).__name__}: {e}") from None
        return _Conn(r, w)

    def _release(self, key: tuple, conn: _Conn) -> None:
        pool = self._idle.setdefault(key, [])
        if len(pool) >= self.max_idle:
            conn.writer.close()
            return
        conn.used = time.monotonic()
        pool.append(conn)

    async def post(self, base: str, path: str, payload: bytes,
                   content_type: bytes = b"application/json") -> UpstreamResponse:  # fmt: skip
        """Send POST `base + path` and read the status line and headers."""
        key = self._key(base)
        msg = (b"POST " + path.encode() + b" HTTP/1.1\r\nHost: " + key[3] + b"\r\nContent-Type: "
               + content_type + b"\r\nAccept: */*\r\nContent-Length: " + str(len(payload)).encode()
               + b"\r\n\r\n" + payload)  # fmt: skip
        pool, now = self._idle.get(key), time.monotonic()
        conn = None
        while pool:
            c = pool.pop()
            if c.usable(now, self.idle_s):
                conn = c
                break
            c.writer.close()
        reused = conn is not None
        if conn is None:
            conn = await self._connect(key)
        try:
            try:
                conn.writer.write(msg)
                head = await conn.reader.readuntil(b"\r\n\r\n")
            except (asyncio.IncompleteReadError, ConnectionError) as e:
                if not reused or (isinstance(e, asyncio.IncompleteReadError) and e.partial):
                    raise
                conn.writer.close()  # closed by the backend while idle: it never read this request
                conn = await self._connect(key)
                conn.writer.write(msg)
                head = await conn.reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            status = int(lines[0].split(" ", 2)[1])
            headers = {}
            for line in lines[1:]:
                if line:
                    name, _, value = line.partition(":")
                    headers[name.strip().lower()] = value.strip()
        except BaseException as e:
            conn.writer.close()
            if isinstance(e, (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                              ValueError, IndexError)):  # fmt: skip
                raise UpstreamError(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__) from None
            raise
        return UpstreamResponse(self, key, conn, status, headers)

    async def aclose(self) -> None:
        for pool in self._idle.values():
            for c in pool:
                c.writer.close()
        self._idle.clear()
