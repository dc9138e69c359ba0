"""Reading and checking the body of an OpenAI generation request, and the OpenAI error format.

    raw = await read_body(request, limit)            # Done(413) over the limit
    body, prompt = parse_body(raw, chat, models)     # Done(400 / 404) naming the field

`parse_body` returns the JSON object and its prompt: the text to count (chat: every message's
text), or the token ids the client sent instead. Every refusal is a `Done` carrying an
OpenAI-format error response (`error_response`) whose `param` names the field at fault.
"""

from __future__ import annotations

import json
import math

from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response

from presched.serve.tokens import prompt_text


def error_response(status: int, message: str, kind: str = "invalid_request_error",
                   param: str | None = None, retry_after: float | None = None) -> JSONResponse:  # fmt: skip
    """An OpenAI-format error body: {"error": {"message", "type", "param", "code"}}."""
    headers = {"retry-after": str(max(1, math.ceil(retry_after)))} if retry_after is not None else None
    body = {"error": {"message": message, "type": kind, "param": param, "code": status}}
    return JSONResponse(body, status_code=status, headers=headers)


class Done(Exception):
    """Ends a request early with a prepared response (bad input, auth, limits)."""

    def __init__(self, response: Response) -> None:
        self.response = response


async def read_body(request: HTTPRequest, limit: int) -> bytes:
    """The request body; `Done` (413) when it is larger than `limit` bytes."""
    size = request.headers.get("content-length")
    if size is not None and size.isdigit() and int(size) > limit:
        raise Done(error_response(413, f"request body of {size} bytes exceeds {limit}"))
    raw = await request.body()
    if len(raw) > limit:
        raise Done(error_response(413, f"request body of {len(raw)} bytes exceeds {limit}"))
    return raw


def parse_body(raw: bytes, chat: bool, models: list[str]) -> tuple[dict, str | list[int]]:
    """(body, prompt text or token ids) of a generation request; `Done` naming the bad field.
    Fills in `model` when it is missing and exactly one model is served."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise Done(error_response(400, f"body: not valid JSON ({e})", param="body")) from None
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


def check_fields(body: dict, chat: bool, models: list[str]) -> tuple[str, str, int] | None:
    """(field, message, status) of the first bad field, or None."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        return "model", "model: expected a string", 400
    if model is None and len(models) != 1:
        return "model", "model: required (this gateway serves " + ", ".join(models or ["no model yet"]) + ")", 400
    if model is not None and models and model not in models:
        return "model", f"model: {model!r} is not served here (served: {', '.join(models)})", 404
    for name in ("max_tokens", "max_completion_tokens"):
        v = body.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            return name, f"{name}: expected an integer >= 1, got {v!r}", 400
    for name in ("stream", "ignore_eos"):
        v = body.get(name)
        if v is not None and not isinstance(v, bool):
            return name, f"{name}: expected true or false, got {v!r}", 400
    so = body.get("stream_options")
    if so is not None and not isinstance(so, dict):
        return "stream_options", "stream_options: expected an object", 400
    n = body.get("n")
    if n is not None and n != 1:
        return "n", f"n: only 1 is supported, got {n!r}", 400
    xargs = body.get("vllm_xargs")
    if xargs is not None and not isinstance(xargs, dict):
        return "vllm_xargs", "vllm_xargs: expected an object", 400
    if chat and "prompt" in body:
        return "prompt", "prompt: not a field of chat completions (use messages)", 400
    return None
