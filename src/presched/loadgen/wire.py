"""One request of `presched replay` on the wire: send it, time its reply, classify a failure.

`send` (called by `replay.replay_async` for each request) sends a pre-built httpx request and
returns an `Outcome`: the status, the gateway's headers (queue wait, backend), the time of each
content event of the stream (or of the whole reply), the usage counts and, if it failed, why
(`kind`: the HTTP status, the transport error's class, `protocol`). It never raises for a bad
reply. What counts as a token, a failure and the first token is in `replay.py`'s module doc.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from presched.serve.sse import sse_lines

QUEUE_WAIT_HEADER = "x-presched-queue-wait-ms"
BACKEND_HEADER = "x-presched-backend"


@dataclass
class Outcome:
    status: int = 0
    error: str | None = None
    kind: str | None = None  # key in errors_by_status when failed
    first_token: float = math.nan
    finish: float = math.nan
    events: list[float] = field(default_factory=list)
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    queue_wait_ms: float = math.nan
    backend: str | None = None

    def fail(self, kind: str, error: str) -> Outcome:
        self.kind, self.error = kind, error[:500]
        return self


def has_content(choice: dict, chat: bool) -> bool:
    if not chat:
        return bool(choice.get("text"))
    delta = choice.get("delta") or {}
    return bool(delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning"))


def read_headers(out: Outcome, headers) -> None:
    out.backend = headers.get(BACKEND_HEADER)
    wait = headers.get(QUEUE_WAIT_HEADER)
    if wait is not None:
        try:
            out.queue_wait_ms = float(wait)
        except ValueError:
            pass


def refused(obj: Any, out: Outcome, malformed: str) -> bool:
    """Fail `out` (kind `protocol`) when a reply or event is not a JSON object (`malformed` is
    the message) or carries an error; True if it did."""
    if not isinstance(obj, dict):
        out.fail("protocol", malformed)
        return True
    if "error" in obj:
        out.fail("protocol", stream_error(obj))
        return True
    return False


def stream_error(obj: dict) -> str:
    e = obj.get("error")
    return json.dumps(e)[:500] if not isinstance(e, str) else e


async def send(client, request, stream: bool, chat: bool, clock: Callable[[], float]) -> Outcome:
    """Send one pre-built httpx request and time its reply; failures are returned, not raised."""
    import httpx

    out = Outcome()
    try:
        resp = await client.send(request, stream=stream)
        try:
            out.status = resp.status_code
            read_headers(out, resp.headers)
            if resp.status_code >= 400:
                return out.fail(
                    str(resp.status_code), (await resp.aread()).decode(errors="replace")
                )
            if stream:
                await read_stream(resp, out, chat, clock)
            else:
                read_reply(resp.json(), out, chat, clock())
            return out
        finally:
            await resp.aclose()
    except httpx.HTTPError as e:
        why = str(e) or repr(e.__cause__ or e.__context__ or "")
        return out.fail(type(e).__name__, f"{type(e).__name__}: {why}")
    except ValueError as e:  # a reply that is not JSON
        return out.fail("protocol", f"malformed reply: {e}")


async def read_stream(resp, out: Outcome, chat: bool, clock: Callable[[], float]) -> None:
    done = False
    async for line in sse_lines(resp.aiter_bytes()):
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":  # read on to the end of the body, so the connection is reused
            done = True
            continue
        t = clock()
        try:
            obj = json.loads(data)
        except json.JSONDecodeError:
            obj = None
        if refused(obj, out, f"malformed SSE event: {data[:200]}"):
            return
        if obj.get("usage"):
            out.completion_tokens = obj["usage"].get("completion_tokens")
            out.prompt_tokens = obj["usage"].get("prompt_tokens")
        choices = obj.get("choices") or ()
        if any(has_content(ch, chat) for ch in choices):
            out.events.append(t)
        for ch in choices:
            out.finish_reason = ch.get("finish_reason") or out.finish_reason
    out.finish = clock()
    out.first_token = out.events[0] if out.events else out.finish
    if not done:
        out.fail("protocol", "the stream ended without data: [DONE]")


def read_reply(obj: Any, out: Outcome, chat: bool, now: float) -> None:
    out.finish = out.first_token = now
    if refused(obj, out, f"malformed reply: {str(obj)[:200]}"):
        return
    choices = obj.get("choices") or [{}]
    out.finish_reason = choices[0].get("finish_reason")
    usage = obj.get("usage") or {}
    out.completion_tokens = usage.get("completion_tokens")
    out.prompt_tokens = usage.get("prompt_tokens")
    if out.completion_tokens is None:  # count words of the reply instead, flagged usage_missing
        text = (choices[0].get("message") or {}).get("content") if chat else choices[0].get("text")
        out.events = [now] * len(str(text or "").split())
