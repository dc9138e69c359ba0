"""Server-sent events as the SSE spec splits them: lines end at LF, CRLF or CR, and nowhere else.

httpx's `aiter_lines` splits like `str.splitlines`, also at U+2028, U+2029, U+0085 and \\x1c-\\x1e,
which JSON strings may carry raw: an engine that generates one of them (a random-weight model
does, now and then) would see its event cut in two and "malformed". Who calls it: the load
generator (`replay.py`) and the engine calibration (`engine/calibrate.py`); the gateway itself
relays bytes and splits events on b"\\n\\n" (`app.py`).
"""

from __future__ import annotations

from collections.abc import AsyncIterable, AsyncIterator


async def sse_lines(chunks: AsyncIterable[bytes]) -> AsyncIterator[str]:
    """The lines of an SSE body (without their ends), decoded as UTF-8, from its byte chunks."""
    buf = b""
    async for chunk in chunks:
        buf += chunk
        if b"\n" not in buf and b"\r" not in buf:
            continue
        # a CR at the end of the buffer may be the first half of a CRLF: keep it for the next chunk
        cut = len(buf) - 1 if buf.endswith(b"\r") else len(buf)
        lines = buf[:cut].replace(b"\r\n", b"\n").replace(b"\r", b"\n").split(b"\n")
        buf = lines.pop() + buf[cut:]
        for line in lines:
            yield line.decode("utf-8", "replace")
    if buf:  # the last line, with (a held-back CR) or without its end
        lines = buf.replace(b"\r", b"\n").split(b"\n")
        if not lines[-1]:
            lines.pop()
        for line in lines:
            yield line.decode("utf-8", "replace")
