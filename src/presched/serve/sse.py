"""Server-sent events as the SSE spec splits them: lines end at LF, CRLF or CR, and nowhere else.

httpx's `aiter_lines` splits like `str.splitlines`, also at U+2028, U+2029, U+0085 and \\x1c-\\x1e,
which JSON strings may carry raw: an engine that generates one of them (a random-weight model
does, now and then) would see its event cut in two and "malformed". Who calls it: the load
generator (`replay.py`) and the engine calibration (`engine/calibrate.py`).

`split_events` cuts a byte buffer into whole events (each up to and including the blank line
that ends it, in any of the three line ends), for the gateway's relay (`relay.py`), which passes
the bytes on unchanged.
"""

from __future__ import annotations

import re

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


# a line end followed by a line end (an empty line) ends an event
_BLANK = re.compile(rb"(?:\r\n|\r(?!\n)|\n)(?:\r\n|\r|\n)")  # CR LF is one end, not two


def split_events(buf: bytes, start: int = 0) -> tuple[list[bytes], bytes]:
    """(whole events, the rest) of `buf`; each event keeps its terminating blank line, so the
    events and the rest join back to `buf`. `start`: where to look for the first end (bytes
    before it are known to hold none; pass a few bytes before the newly added data).

    A CR ending `buf` may be the first half of a CRLF whose LF comes next: the event is then cut
    after the CR and the LF starts the next piece (as a leading empty line, which the SSE spec
    ignores); the bytes are unchanged either way."""
    events, at = [], 0
    for m in _BLANK.finditer(buf, start):
        events.append(buf[at:m.end()])
        at = m.end()
    return events, buf[at:]
