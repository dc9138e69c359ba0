"""Reading and checking the body of an OpenAI generation request, and the OpenAI error format.

    raw = await read_body(request, limit)            # Done(413) over the limit
    body, prompt = parse_body(raw, chat, models)     # Done(400 / 404) naming the field

`parse_body` returns the JSON object and its prompt: the text to count (chat: every message's
text), or the token ids the client sent instead. Every refusal is a `Done` carrying an
OpenAI-format error response (`error_response`) whose `param` names the field at fault.

Bounds: JSON nested at most `MAX_DEPTH` deep; no NaN / Infinity (not JSON, though Python reads
them) and no number that overflows a double (1e400, which Python reads as inf); every integer
field the gateway knows (`INT_FIELDS`) an integer (not a bool, not 1.0) within its range, so
nothing forwarded or logged can overflow a 64-bit integer; the prompt valid Unicode (no lone
surrogates) and token ids in [0, `tokens.MAX_TOKEN_ID`].
"""

from __future__ import annotations

import json
import math
import uuid
from typing import Any

from starlette.requests import ClientDisconnect
from starlette.requests import Request as HTTPRequest
from starlette.responses import Response

from presched.serve.tokens import prompt_text
from presched.workload.request import Request


MAX_DEPTH = 64
"""Deepest JSON nesting accepted (a chat body with content parts is 5 deep)."""

_I32 = 2**31 - 1
_I64 = 2**63 - 1
INT_FIELDS: dict[str, tuple[int, int]] = {
    "max_tokens": (1, _I32),
    "max_completion_tokens": (1, _I32),
    "min_tokens": (0, _I32),
    "n": (1, 1),  # one choice per request (the gateway's books are per choice)
    "best_of": (1, _I32),
    "seed": (-_I64 - 1, _I64),
    "top_k": (-1, _I32),
    "logprobs": (0, _I32),  # completions; chat's `logprobs` is a bool
    "top_logprobs": (0, _I32),
    "prompt_logprobs": (-1, _I32),
    "priority": (-_I32 - 1, _I32),
    "truncate_prompt_tokens": (-1, _I32),
}
"""Integer fields of the request bodies: name -> (lowest, highest) accepted value."""

_BOOL_FIELDS = ("stream", "ignore_eos", "echo")
_OBJECT_FIELDS = ("stream_options", "vllm_xargs")


def error_response(status: int, message: str, kind: str = "invalid_request_error",
                   param: str | None = None, retry_after: float | None = None) -> Response:  # fmt: skip
    """An OpenAI-format error body: {"error": {"message", "type", "param", "code"}}. ASCII JSON,
    so a message quoting any client text (even a lone surrogate) can always be sent."""
    headers = {"retry-after": str(max(1, math.ceil(retry_after)))} if retry_after is not None else None
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return Response(json.dumps(body), status_code=status, headers=headers, media_type="application/json")


class Done(Exception):
    """Ends a request early with a prepared response (bad input, auth, limits)."""

    def __init__(self, response: Response) -> None:
        self.response = response


async def read_body(request: HTTPRequest, limit: int) -> bytes:
    """The request body; `Done` (413) as soon as more than `limit` bytes arrived (or the
    Content-Length says so), without reading further: a chunked upload is never buffered beyond
    the limit. The 413 closes the connection, so the client stops sending."""
    size = request.headers.get("content-length")
    # ASCII digits only: str.isdigit() is also true of '²', which int() refuses (ValueError)
    digits = size is not None and size.isascii() and size.isdigit()
    if digits and (len(size) > 18 or int(size) > limit):
        raise Done(_too_large(f"request body of {_short(size)} bytes exceeds {limit}"))
    chunks, n = [], 0
    try:
        async for chunk in request.stream():
            n += len(chunk)
            if n > limit:
                raise Done(_too_large(f"request body exceeds {limit} bytes (refused after {n})"))
            chunks.append(chunk)
    except ClientDisconnect:
        raise Done(error_response(400, "body: the client disconnected while sending it", param="body")) from None
    return b"".join(chunks)


def check_content_type(headers) -> None:
    """`Done` (415) unless the Content-Type is application/json (parameters such as charset
    allowed)."""
    ct = headers.get("content-type", "")
    if ct.split(";", 1)[0].strip().lower() != "application/json":
        got = repr(_short(ct, 60)) if ct else "none"
        raise Done(error_response(415, f"content-type: expected application/json, got {got}",
                                  param="content-type"))  # fmt: skip


def _too_large(message: str) -> Response:
    resp = error_response(413, message)
    resp.headers["connection"] = "close"  # the rest of the body is not read
    return resp


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _finite(text: str) -> float:
    """A JSON number with a fraction or exponent; one that overflows a double (1e400, which
    Python reads as inf and would forward as `Infinity`, not JSON) is refused."""
    v = float(text)
    if not math.isfinite(v):
        raise ValueError(f"{_short(text)} is out of range for a double")
    return v


def _too_deep(raw: bytes, obj: Any) -> bool:
    """True when `obj` nests deeper than MAX_DEPTH (iterative: no recursion on client data)."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_DEPTH:  # cannot be deeper than its brackets
        return False
    stack = [(obj, 1)]
    while stack:
        o, d = stack.pop()
        if d > MAX_DEPTH:
            return True
        kids = o.values() if isinstance(o, dict) else o
        stack.extend((k, d + 1) for k in kids if isinstance(k, (dict, list)))
    return False


def parse_body(raw: bytes, chat: bool, models: list[str]) -> tuple[dict, str | list[int]]:
    """(body, prompt text or token ids) of a generation request; `Done` naming the bad field.
    Fills in `model` when it is missing and exactly one model is served."""
    try:
        body = json.loads(raw, parse_constant=_no_constant, parse_float=_finite)
    except RecursionError:
        body, deep = None, True
    except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, NaN, a 4,300-digit number
        raise Done(error_response(400, f"body: not valid JSON ({_short(str(e), 200)})", param="body")) from None
    else:
        deep = _too_deep(raw, body)
    if deep:
        raise Done(error_response(400, f"body: JSON nested deeper than {MAX_DEPTH} levels", param="body"))
    if not isinstance(body, dict):
        raise Done(error_response(400, "body: expected a JSON object", param="body"))
    problem = check_fields(body, chat, models)
    if problem is not None:
        raise Done(error_response(problem[2], problem[1], param=problem[0],
                                  kind="invalid_request_error" if problem[2] == 400 else "not_found_error"))  # fmt: skip
    try:
        text, _, ids = prompt_text(body, chat)
    except ValueError as e:
        field = str(e).split(":", 1)[0]
        raise Done(error_response(400, str(e), param=field)) from None
    if "model" not in body and len(models) == 1:
        body["model"] = models[0]
    return body, text if ids is None else ids


def _short(s: str, n: int = 40) -> str:
    return s if len(s) <= n else s[: n - 3] + "..."


def check_int(name: str, v: Any, lo: int, hi: int) -> str | None:
    """The message for a value of integer field `name` outside [lo, hi] (or not an integer)."""
    if isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi:
        return None
    if lo == hi:
        return f"{name}: only {lo} is supported, got {_short(repr(v))}"
    what = "an integer" if isinstance(v, int) and not isinstance(v, bool) else f"an integer, not {type(v).__name__}"
    return f"{name}: expected {what} in [{lo}, {hi}], got {_short(repr(v))}"


def check_fields(body: dict, chat: bool, models: list[str]) -> tuple[str, str, int] | None:
    """(field, message, status) of the first bad field, or None."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        return "model", "model: expected a string", 400
    if model is None and len(models) != 1:
        return "model", "model: required (this gateway serves " + ", ".join(models or ["no model yet"]) + ")", 400
    if model is not None and models and model not in models:
        return "model", f"model: {_short(repr(model), 100)} is not served here (served: {', '.join(models)})", 404
    for name, (lo, hi) in INT_FIELDS.items():
        v = body.get(name)
        if v is None or (chat and name == "logprobs"):
            continue
        msg = check_int(name, v, lo, hi)
        if msg is not None:
            return name, msg, 400
    for name in (*_BOOL_FIELDS, "logprobs") if chat else _BOOL_FIELDS:
        v = body.get(name)
        if v is not None and not isinstance(v, bool):
            return name, f"{name}: expected true or false, got {_short(repr(v))}", 400
    for name in _OBJECT_FIELDS:
        v = body.get(name)
        if v is not None and not isinstance(v, dict):
            return name, f"{name}: expected an object", 400
    if chat and "prompt" in body:
        return "prompt", "prompt: not a field of chat completions (use messages)", 400
    return None


def new_request(body: dict, chat: bool, prompt_tokens: int, tenant: str, prompt: str | None,
                **fields: Any) -> tuple[Request, int | None]:
    """The `Request` of a checked body, for every front (the gateway's app, the endpoint picker):
    its id, model and `max_tokens` (chat: `max_completion_tokens` when set; null leaves
    max_tokens), `fields` passed on (SLOs, block hashes); and the forced length the oracles may
    read (`max_tokens` under `ignore_eos`, else None)."""
    max_tokens = body.get("max_tokens")
    if chat and body.get("max_completion_tokens") is not None:
        max_tokens = body["max_completion_tokens"]
    req = Request(id=f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:20]}", prompt_tokens=prompt_tokens,
                  tenant=tenant, model=body.get("model") or "", prompt=prompt, max_tokens=max_tokens,
                  **fields)  # fmt: skip
    return req, (max_tokens if body.get("ignore_eos") and max_tokens else None)
