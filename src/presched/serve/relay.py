"""One accepted request's trip to a backend and back: wait for a slot, open the upstream request,
relay the backend's bytes to the client unchanged, and fill in the request's `Outcome`.

    relay = Relay(cfg, gw, upstream)                       # who: `GatewayApp`, at start-up
    await relay.run(seq, payload, chat, stream, out, send)   # per request; payload() -> (bytes, injected)

Failures: a backend that refuses, times out before its response headers, or answers 502/503 is
marked down and the request is placed on another backend (up to `retries`); a non-streaming
request whose backend dies mid-way is retried the same way (the client has seen nothing yet). A
stream that breaks after bytes were sent ends with an OpenAI-style error event
(`data: {"error": {...}}`, no `[DONE]` after it): 502 when the backend broke it or sent an event
over `max_event_bytes`, 504 when it sent nothing for `idle_timeout_s`. Every failure counts
against its backend (`Backend.note_failure`: held down, longer each time it fails again).

Streaming: the gateway asks the backend for `stream_options.include_usage` (the true output
token count; `injected` says it added it); when the client did not ask for it, the usage-only
event is not relayed, so the client receives exactly the bytes the backend would have sent it.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any, Callable

from presched.serve.backend import Backend
from presched.serve.config import ServeConfig
from presched.serve.errors import GatewayError
from presched.serve.gateway import Gateway
from presched.serve.outcome import Outcome
from presched.serve.request_body import error_response
from presched.serve.seq import GatewaySeq
from presched.serve.sse import split_events
from presched.serve.upstream import Upstream, UpstreamError, UpstreamResponse, UpstreamTimeout

_RETRY_STATUS = (502, 503)  # the backend is unavailable: try another one


class Relay:
    """Sends accepted requests to the backends the `Gateway` picks and relays the answers."""

    def __init__(self, cfg: ServeConfig, gw: Gateway, upstream: Upstream) -> None:
        self.cfg = cfg
        self.gw = gw
        self.upstream = upstream

    async def run(self, seq: GatewaySeq, payload: Callable[[], tuple[bytes, bool]], chat: bool,
                  stream: bool, out: Outcome, send) -> None:  # fmt: skip
        """Wait for a slot, send the body `payload()` builds upstream (retrying elsewhere on
        early failure), relay the answer to `send`; when no backend could serve it, answer the
        error in `out`. `payload` is called once, when the first slot is granted: a request
        waiting in the queue holds its parsed body only, not also the bytes to send."""
        path = "/v1/chat/completions" if chat else "/v1/completions"
        data = None
        while True:
            b = await self.gw.wait(seq)
            out.backend = b
            if data is None:
                data, injected = payload()
            try:
                resp = await self._open(b, path, data)
            except _Unavailable as e:
                if not self._retry(seq, out, f"backend {b.name}: {e}"):
                    break
                continue
            if resp.status_code in _RETRY_STATUS:
                await resp.aclose()
                if not self._retry(seq, out, f"backend {b.name} answered {resp.status_code}"):
                    break
                continue
            try:
                if stream and resp.status_code == 200:
                    await self._relay_stream(seq, resp, injected, out, send)
                else:
                    why = await self._relay_whole(seq, resp, out, send)
                    if why is not None:
                        if not self._retry(seq, out, f"backend {b.name} failed mid-response: {why}"):
                            break
                        continue
            finally:
                await resp.aclose()
            if out.status == 200:
                b.note_success()
            return
        await send_error(out, send)

    def _retry(self, seq: GatewaySeq, out: Outcome, why: str) -> bool:
        out.retries += 1
        out.backend.note_failure(self.gw.now(), self.cfg.health_interval_s)
        try:
            self.gw.failed(seq)
            return True
        except GatewayError as e:
            out.status, out.error = e.status, f"{why}; {e}"
            out.kind = e.kind
            return False

    async def _open(self, b: Backend, path: str, payload: bytes) -> UpstreamResponse:
        try:
            async with asyncio.timeout(self.cfg.first_byte_timeout_s):
                return await self.upstream.post(b.url, path, payload)
        except TimeoutError:
            raise _Unavailable(f"no response within {self.cfg.first_byte_timeout_s} s") from None
        except UpstreamError as e:
            raise _Unavailable(str(e)) from None

    async def _relay_whole(self, seq: GatewaySeq, resp: UpstreamResponse, out: Outcome, send) -> str | None:
        """Read the whole response and send it on; what went wrong if it could not be read
        (nothing was sent then: the request may be retried)."""
        try:
            data = await resp.aread()
        except UpstreamError as e:
            return str(e)
        now = self.gw.now()
        usage = None
        if resp.status_code == 200:
            try:
                parsed = json.loads(data)
            except (json.JSONDecodeError, UnicodeDecodeError):
                parsed = None
            if isinstance(parsed, dict):
                usage, choices = parsed.get("usage"), parsed.get("choices")
                if isinstance(choices, list) and choices and isinstance(choices[0], dict):
                    out.finish_reason = _text_or_none(choices[0].get("finish_reason"))
            seq.first_token = seq.last_token = now
        out.status = resp.status_code
        out.tokens = usage_tokens(usage)
        if resp.status_code != 200:
            out.error = data[:500].decode("utf-8", "replace")
        headers = _headers(seq, resp.headers.get("content-type", "application/json"))
        await send({"type": "http.response.start", "status": resp.status_code, "headers": headers})
        out.started = True
        await send({"type": "http.response.body", "body": data})
        return None

    async def _relay_stream(self, seq: GatewaySeq, resp: UpstreamResponse, injected: bool,
                            out: Outcome, send) -> None:  # fmt: skip
        headers = _headers(seq, resp.headers.get("content-type", "text/event-stream"))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        out.started = True
        out.status = 200
        buf = b""
        clock, limit = self.gw.now, self.cfg.max_event_bytes
        try:
            async for chunk in resp.aiter_raw():
                start = max(len(buf) - 3, 0)  # a blank line may begin in the bytes held back
                buf += chunk
                events, buf = split_events(buf, start)
                if len(buf) > limit:
                    raise _EventTooLarge(f"sent an event over max_event_bytes ({limit} bytes)")
                if not events:
                    continue
                relay = []
                before = seq.generated
                for ev in events:
                    if inspect_event(ev, seq, out, clock) or not injected:
                        relay.append(ev)
                if seq.generated > before:
                    self.gw.tokens(seq, seq.generated - before)
                if relay:
                    await send({"type": "http.response.body", "body": b"".join(relay), "more_body": True})
        except (UpstreamError, _EventTooLarge) as e:
            b = out.backend
            status = 504 if isinstance(e, UpstreamTimeout) else 502
            what = "stalled: " if status == 504 else "broke the stream: " if isinstance(e, UpstreamError) else ""
            out.status, out.error = status, f"backend {b.name} {what}{e}"
            buf = error_event(status, out.error)
            b.note_failure(self.gw.now(), self.cfg.health_interval_s)
            self.gw.set_health(b, False)
        await send({"type": "http.response.body", "body": buf, "more_body": False})


async def send_error(out: Outcome, send) -> None:
    """Answer the error in `out` (an OpenAI-format JSON response; nothing was sent before)."""
    resp = error_response(out.status, out.error or "no backend could serve the request", out.kind)
    await send({"type": "http.response.start", "status": resp.status_code, "headers": resp.raw_headers})
    out.started = True
    await send({"type": "http.response.body", "body": resp.body})


def error_event(status: int, message: str) -> bytes:
    """An OpenAI-format error as the SSE event that ends a broken stream."""
    err = {"error": {"message": message, "type": "server_error", "param": None, "code": status}}
    return b"data: " + json.dumps(err).encode() + b"\n\n"


class _Unavailable(Exception):
    pass


class _EventTooLarge(Exception):
    pass


def _headers(seq: GatewaySeq, content_type: str) -> list[tuple[bytes, bytes]]:
    wait = (seq.first_scheduled or seq.arrival) - seq.arrival
    return [(b"content-type", content_type.encode()),
            (b"x-request-id", seq.id.encode()),
            (b"x-presched-backend", str(seq.instance).encode()),
            (b"x-presched-queue-wait-ms", f"{wait * 1e3:.3f}".encode())]  # fmt: skip


def inspect_event(ev: bytes, seq: GatewaySeq, out: Outcome, clock) -> bool:
    """Account one SSE event of the backend's stream; False for the usage-only event (which the
    gateway asked for itself and may hide)."""
    ev = ev.lstrip(b"\r\n")  # a leading empty line (a CRLF split between two reads)
    if not ev.startswith(b"data:"):
        return True
    data = ev[5:].strip()
    if data == b"[DONE]":
        return True
    try:
        obj = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return True
    if not isinstance(obj, dict):
        return True
    choices = obj.get("choices")
    choices = choices if isinstance(choices, list) else None
    usage = obj.get("usage")
    if isinstance(usage, dict) and usage:
        out.tokens = usage_tokens(usage)
        if not choices:
            return False
    for c in choices or ():
        if not isinstance(c, dict):
            continue
        delta = c.get("delta")
        piece = delta.get("content") if isinstance(delta, dict) else c.get("text")
        if piece:
            seq.on_token(clock())
        if c.get("finish_reason"):
            out.finish_reason = _text_or_none(c["finish_reason"])
    return True


MAX_USAGE_TOKENS = 10**9
"""A backend's `completion_tokens` above this is not a count (10**400 overflowed the metrics)."""


def usage_tokens(usage: Any) -> int | None:
    """`completion_tokens` of a backend's usage object, if it is a count (0..MAX_USAGE_TOKENS)."""
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return tokens if type(tokens) is int and 0 <= tokens <= MAX_USAGE_TOKENS else None


def _text_or_none(v: Any) -> str | None:
    return v[:100] if isinstance(v, str) else None
