"""The response side of one request, as the proxy streams it through the picker: count the
output tokens, find the true count in the engine's usage, and hand the bytes back.

    tap = ResponseTap(seq, out, stream, injected, clock, max_response_bytes, max_event_bytes=...)
    tap.headers(status)
    data = tap.chunk(piece, end)      # what the client gets of `piece` (events held until whole)
    tap.failed                        # the stream was cut (an event over max_event_bytes)

Streams (status 200, `stream: true`): the body is cut into whole server-sent events
(`serve.sse.split_events`) and each is read by `serve.relay.inspect_event`, as the gateway reads
it; the usage-only event the picker asked for itself (`injected`) is not passed on, so the
client receives exactly what the engine would have sent it. An unfinished event is held at most
`max_event_bytes`: past that the stream is cut as `presched serve` cuts it, with an OpenAI-format
error event (`data: {"error": {..., "code": 502}}`, no `[DONE]`), the outcome 502, and what the
endpoint still sends dropped. Whole responses pass through at once; a copy (up to
`max_response_bytes`) is parsed for `usage` at the end.
"""

from __future__ import annotations

import json
from typing import Callable

from presched.serve.outcome import Outcome
from presched.serve.relay import error_event, inspect_event, usage_tokens
from presched.serve.seq import GatewaySeq
from presched.serve.sse import split_events


class ResponseTap:
    def __init__(self, seq: GatewaySeq, out: Outcome, stream: bool, injected: bool,
                 clock: Callable[[], float], max_response_bytes: int,
                 on_tokens: Callable[[GatewaySeq, int], None] | None = None,
                 max_event_bytes: int = 2**20) -> None:  # fmt: skip
        self.seq, self.out, self.stream, self.injected = seq, out, stream, injected
        self.clock, self.limit, self.on_tokens = clock, max_response_bytes, on_tokens
        self.max_event = max_event_bytes
        self.status = 0
        self._buf = b""
        self._whole = bytearray()
        self.ended = False
        self.failed = False  # cut at an event over max_event_bytes: the outcome is final (502)
        self.no_headers = False  # the body came without response headers (`headless`)

    def headers(self, status: int) -> None:
        self.status = status
        self.out.started = True

    def headless(self, first: bytes) -> None:
        """The body's first bytes came without response headers (the gateway skips them,
        response_header_mode SKIP): server-sent events are a 200 stream; a whole body tells
        its status at its end (`_end_whole`: a completion is 200, an OpenAI error its code)."""
        self.out.started = self.no_headers = True
        if self.stream and first.lstrip().startswith(b"data:"):
            self.status = 200

    @property
    def events(self) -> bool:
        return self.stream and self.status == 200

    def chunk(self, data: bytes, end: bool) -> bytes:
        """The bytes to pass on for `data`; at `end` the request's outcome is complete."""
        if not self.events:
            if len(self._whole) + len(data) <= self.limit:
                self._whole += data
            if end:
                self._end_whole()
            return data
        if self.failed:  # cut: nothing more is held or passed on
            self.ended = self.ended or end
            return b""
        start = max(len(self._buf) - 3, 0)
        self._buf += data
        events, self._buf = split_events(self._buf, start)
        keep = []
        before = self.seq.generated
        for ev in events:
            if inspect_event(ev, self.seq, self.out, self.clock) or not self.injected:
                keep.append(ev)
        if self.on_tokens is not None and self.seq.generated > before:
            self.on_tokens(self.seq, self.seq.generated - before)
        if len(self._buf) > self.max_event:
            keep.append(self._cut(end))
        elif end:
            keep.append(self._buf)
            self._buf = b""
            self.ended = True
            self.out.status = 200
        return b"".join(keep)

    def _cut(self, end: bool) -> bytes:
        """End the stream at an unfinished event over `max_event_bytes`: the held bytes are
        dropped, the outcome is 502, and the client gets the error event instead."""
        b = self.out.backend
        self.out.status, self.out.kind = 502, "server_error"
        self.out.error = (f"endpoint {b.name if b is not None else '?'} sent an event over max_event_bytes "
                          f"({self.max_event} bytes)")  # fmt: skip
        self._buf = b""
        self.failed = True
        self.ended = end
        return error_event(502, self.out.error)

    def _end_whole(self) -> None:
        self.ended = True
        try:
            parsed = json.loads(bytes(self._whole))
        except (json.JSONDecodeError, UnicodeDecodeError):
            parsed = None
        if self.no_headers and not self.status:
            self.status = _status_of(parsed)
        self.out.status = self.status
        now = self.clock()
        if self.status != 200:
            self.out.error = bytes(self._whole[:500]).decode("utf-8", "replace")
            return
        if isinstance(parsed, dict):
            self.out.tokens = usage_tokens(parsed.get("usage"))
            choices = parsed.get("choices")
            if isinstance(choices, list) and choices and isinstance(choices[0], dict):
                fr = choices[0].get("finish_reason")
                self.out.finish_reason = fr[:100] if isinstance(fr, str) else None
        self.seq.first_token = self.seq.last_token = now


def _status_of(parsed) -> int:
    """A body's status when no headers told it: 200 for a completion (`choices`), an OpenAI
    error's `code` (400-599), else 0 (unknown)."""
    if not isinstance(parsed, dict):
        return 0
    err = parsed.get("error")
    if isinstance(err, dict):
        code = err.get("code")
        return code if isinstance(code, int) and not isinstance(code, bool) and 400 <= code <= 599 else 0
    return 200 if isinstance(parsed.get("choices"), list) else 0
