"""`Upstream`: the gateway's HTTP/1.1 client to its backends — keep-alive connections, one
request per connection at a time, nothing else.

    up = Upstream(connect_timeout_s=5.0, idle_timeout_s=60.0)
    resp = await up.post("http://127.0.0.1:8000", "/v1/completions", payload)  # status + headers read
    resp.status_code, resp.headers["content-type"]
    data = await resp.aread()            # or: async for chunk in resp.aiter_raw(): ...
    await resp.aclose()                  # keep-alive if the body was read to its end, else closed
    await up.aclose()                    # at shutdown

Who calls it: `Relay` (relay.py), for every generation request. Why not httpx or aiohttp:
the gateway's added latency is mostly CPU, and per request (client CPU, 8 in flight, uvloop;
`benchmarks/gateway_overhead.py --clients`, 3 repeats, medians) this client costs 51 us for a
whole response and 196 us for a 16-event stream, aiohttp 3.14 140 us and 278 us (3.0x, 1.4x),
httpx 0.28 950 us and 1476 us (18x, 7x).

A base URL may carry a path (`http://host:8000/prefix`): requests go to `/prefix` + path.

Bounds: the status line and headers together at most 64 KiB (asyncio's stream limit), a chunk
size line likewise, a chunk at most `max_chunk_bytes`, at most 64 trailer lines, a body read by
`aread` at most `max_body_bytes`. Every body read waits at most `first_byte_timeout_s` for the
first bytes after the headers and `idle_timeout_s` between later ones (a backend that sends its
headers and stalls is cut off).

Errors: anything that goes wrong on the wire (refused, reset, timeout, a malformed or oversized
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

_HEX = frozenset(b"0123456789abcdefABCDEF")
_MAX_TRAILERS = 64


class UpstreamError(Exception):
    """A request to a backend failed on the wire (no usable response)."""


class UpstreamTimeout(UpstreamError):
    """The backend sent nothing for too long after its response headers."""


class _Conn:
    __slots__ = ("reader", "writer", "used")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer, self.used = reader, writer, 0.0

    def usable(self, now: float, idle_s: float) -> bool:
        return not self.reader.at_eof() and not self.writer.is_closing() and now - self.used < idle_s


def _closed() -> UpstreamError:
    return UpstreamError("the backend closed the connection mid-response")


def _parse_head(head: bytes) -> tuple[int, dict[str, str]]:
    """Status and lower-cased headers of a response head (ending in CRLF CRLF)."""
    lines = head.decode("latin-1").split("\r\n")
    proto, _, rest = lines[0].partition(" ")
    code = rest[:3]
    if not proto.startswith("HTTP/1.") or len(code) != 3 or not code.isdigit() or rest[3:4] not in ("", " "):
        raise UpstreamError(f"malformed status line {lines[0][:80]!r}")
    status = int(code)
    if not 200 <= status <= 599:
        raise UpstreamError(f"unexpected status {status}")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if line:
            name, sep, value = line.partition(":")
            if not sep or not name or name != name.strip():
                raise UpstreamError(f"malformed header line {line[:80]!r}")
            headers[name.lower()] = value.strip()
    return status, headers


class UpstreamResponse:
    """A response whose status line and headers were read; the body is read on demand."""

    def __init__(self, up: "Upstream", key: tuple, conn: _Conn, status: int, headers: dict[str, str]) -> None:
        """Raises UpstreamError for a malformed Content-Length or Transfer-Encoding."""
        self.status_code = status
        self.headers = headers  # lower-case names
        self._up, self._key, self._conn = up, key, conn
        self._done = False
        self._timer: asyncio.TimerHandle | None = None
        te = headers.get("transfer-encoding")
        self._chunked = te is not None
        if te is not None and te.lower() != "chunked":
            raise UpstreamError(f"unsupported transfer-encoding {te[:40]!r}")
        cl = headers.get("content-length")
        if status in (204, 304):
            cl = "0"  # no body
        if cl is not None and not self._chunked and not (cl.isdigit() and cl.isascii() and len(cl) <= 18):
            raise UpstreamError(f"malformed content-length {cl[:40]!r}")
        self._left = int(cl) if cl is not None and not self._chunked else None
        self._keep = headers.get("connection", "").lower() != "close" and (self._chunked or cl is not None)

    # --- the stall watchdog: one timer per response, re-armed only when it fires ---------------
    def _arm(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._last, self._first, self._reading, self._stalled = self._loop.time(), True, True, None
        self._timer = None
        if self._up.first_byte_timeout_s is not None:
            self._timer = self._loop.call_later(self._up.first_byte_timeout_s, self._watch)

    def _got_first(self) -> None:
        self._first = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._up.idle_timeout_s is not None:
            self._timer = self._loop.call_later(self._up.idle_timeout_s, self._watch)

    def _watch(self) -> None:
        """Timer: abort the connection if the backend sent nothing for the limit while the body
        was being read (time spent by the reader's consumer elsewhere does not count)."""
        if self._conn is None:  # closed meanwhile
            self._timer = None
            return
        limit = self._up.first_byte_timeout_s if self._first else self._up.idle_timeout_s
        now = self._loop.time()
        due = (self._last if self._reading else now) + limit
        if now < due:
            self._timer = self._loop.call_at(due, self._watch)
            return
        self._timer = None
        which = "first_byte_timeout_s" if self._first else "idle_timeout_s"
        self._stalled = f"the backend sent nothing for {limit:g} s ({which})"
        self._conn.writer.transport.abort()  # the pending read ends at once

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def aiter_raw(self):
        """The body's bytes (transfer framing removed) as they arrive."""
        self._arm()
        try:
            async for data in self._body():
                if self._first:
                    self._got_first()
                self._reading = False
                yield data
                self._reading, self._last = True, self._loop.time()
        except UpstreamError as e:
            if self._stalled is not None:
                raise UpstreamTimeout(self._stalled) from None
            raise e from None
        finally:
            self._disarm()

    async def _body(self):
        r = self._conn.reader
        try:
            if self._chunked:
                while True:
                    line = await r.readline()
                    if not line.endswith(b"\n"):
                        raise _closed()
                    size_s = line.split(b";", 1)[0].strip()
                    if not size_s or len(size_s) > 16 or not _HEX.issuperset(size_s):
                        raise UpstreamError(f"malformed chunk size {line[:40]!r}")
                    size = int(size_s, 16)
                    if size > self._up.max_chunk_bytes:
                        raise UpstreamError(f"a chunk of {size} bytes exceeds {self._up.max_chunk_bytes}")
                    if size == 0:
                        for _ in range(_MAX_TRAILERS + 1):
                            if (await r.readline()) in (b"\r\n", b"\n", b""):
                                break
                        else:
                            raise UpstreamError(f"more than {_MAX_TRAILERS} trailer lines")
                        break
                    if size <= 65536:  # the usual case: one read
                        data = await r.readexactly(size + 2)
                        if data[-2:] != b"\r\n":
                            raise UpstreamError("malformed chunk: no CRLF after its data")
                        yield data[:-2]
                        continue
                    while size > 0:
                        data = await r.read(min(size, 65536))
                        if not data:
                            raise _closed()
                        size -= len(data)
                        yield data
                    if await r.readexactly(2) != b"\r\n":
                        raise UpstreamError("malformed chunk: no CRLF after its data")
            elif self._left is not None:
                while self._left > 0:
                    data = await r.read(min(self._left, 65536))
                    if not data:
                        raise _closed()
                    self._left -= len(data)
                    yield data
            else:  # no framing: the body ends when the backend closes
                while data := await r.read(65536):
                    yield data
        except asyncio.IncompleteReadError:
            raise _closed() from None
        except (OSError, ValueError) as e:  # ValueError: a line over the stream limit
            raise UpstreamError(f"{type(e).__name__}: {e}") from None
        self._done = True

    async def aread(self) -> bytes:
        """The whole body; UpstreamError past the client's `max_body_bytes`."""
        parts, n, limit = [], 0, self._up.max_body_bytes
        async for c in self.aiter_raw():
            n += len(c)
            if n > limit:
                raise UpstreamError(f"a response body over {limit} bytes (max_response_bytes)")
            parts.append(c)
        return b"".join(parts)

    async def aclose(self) -> None:
        """Give the connection back (body read to its end) or close it."""
        self._disarm()
        conn, self._conn = self._conn, None
        if conn is None:
            return
        if self._done and self._keep:
            self._up._release(self._key, conn)
        else:
            conn.writer.close()


class Upstream:
    def __init__(self, connect_timeout_s: float = 5.0, max_idle: int = 100, idle_s: float = 4.0, *,
                 first_byte_timeout_s: float | None = None, idle_timeout_s: float | None = None,
                 max_chunk_bytes: int = 16 * 2**20, max_body_bytes: int = 64 * 2**20) -> None:  # fmt: skip
        """`idle_s`: drop pooled connections idle longer than this (uvicorn, as vLLM runs it,
        closes them after 5 s). `first_byte_timeout_s` / `idle_timeout_s`: most seconds a body
        read waits for the first bytes after the headers / for more bytes (None: no limit)."""
        self.connect_timeout_s, self.max_idle, self.idle_s = connect_timeout_s, max_idle, idle_s
        self.first_byte_timeout_s, self.idle_timeout_s = first_byte_timeout_s, idle_timeout_s
        self.max_chunk_bytes, self.max_body_bytes = max_chunk_bytes, max_body_bytes
        self._idle: dict[tuple, list[_Conn]] = {}
        self._hosts: dict[str, tuple] = {}
        self._tls: _ssl.SSLContext | None = None

    def _key(self, base: str) -> tuple:
        """(host, port, https, Host header, path prefix) of a base URL."""
        key = self._hosts.get(base)
        if key is None:
            u = urlsplit(base)
            https = u.scheme == "https"
            key = (u.hostname, u.port or (443 if https else 80), https, u.netloc.encode(),
                   u.path.rstrip("/").encode())  # fmt: skip
            self._hosts[base] = key
        return key

    async def _connect(self, key: tuple) -> _Conn:
        host, port, https = key[:3]
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
        msg = (b"POST " + key[4] + path.encode() + b" HTTP/1.1\r\nHost: " + key[3] + b"\r\nContent-Type: "
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
            status, headers = _parse_head(head)
            return UpstreamResponse(self, key, conn, status, headers)
        except BaseException as e:
            conn.writer.close()
            if isinstance(e, asyncio.LimitOverrunError):
                raise UpstreamError("response headers over 64 KiB") from None
            if isinstance(e, asyncio.IncompleteReadError):
                raise UpstreamError("the backend closed the connection before its response headers") from None
            if isinstance(e, OSError):
                raise UpstreamError(f"{type(e).__name__}: {e}" if str(e) else type(e).__name__) from None
            raise

    async def aclose(self) -> None:
        for pool in self._idle.values():
            for c in pool:
                c.writer.close()
        self._idle.clear()
