"""The outermost layer of the gateway's ASGI app: every HTTP answer is OpenAI-format JSON and
counted, and no exception reaches the server.

    Starlette(..., middleware=[Middleware(Guard, metrics=m, allowed_hosts=[...])],
              exception_handlers={HTTPException: http_error})

`Guard` counts each response by endpoint and status (`presched_http_responses_total`; 499 when
the client left before any answer). An exception that escapes an endpoint is logged (logger
`presched.serve.guard`, with its traceback), counted (`presched_unhandled_errors_total`) and
answered 500 `server_error` when nothing was sent yet (a response already under way is ended
instead); the connection stays usable. `http_error` turns Starlette's 404 / 405 into the same
error format. A request whose `Host` is not in `allowed_hosts` (when set) gets 400 and reaches
no endpoint.
"""

from __future__ import annotations

import logging

from starlette.exceptions import HTTPException
from starlette.requests import Request as HTTPRequest
from starlette.responses import Response

from presched.serve.request_body import error_response

log = logging.getLogger(__name__)

ENDPOINTS = ("/v1/completions", "/v1/chat/completions", "/v1/models", "/health", "/metrics")
"""Paths counted under their own label; any other path is counted as `other`."""

_KIND = {401: "authentication_error", 403: "permission_error", 404: "not_found_error"}


async def http_error(request: HTTPRequest, exc: HTTPException) -> Response:
    """Starlette's HTTP errors (unknown path 404, wrong method 405, ...) in OpenAI format."""
    what = {404: f"no endpoint {request.url.path}", 405: f"method {request.method} not allowed on "
            f"{request.url.path}"}.get(exc.status_code, str(exc.detail))  # fmt: skip
    resp = error_response(exc.status_code, what, _KIND.get(exc.status_code, "invalid_request_error"))
    if exc.headers:
        resp.headers.update(exc.headers)  # 405's Allow
    return resp


def host_allowed(host: str, allowed: list[str]) -> bool:
    """Whether `host` (a Host header, port ignored) matches an entry of `allowed` (exact, or
    `*.example.com` for its subdomains); an empty list allows every host."""
    if not allowed:
        return True
    name = host.rsplit(":", 1)[0] if not host.endswith("]") else host  # [::1] keeps its colons
    name = name.lower()
    for a in allowed:
        a = a.lower()
        if a == "*" or name == a or (a.startswith("*.") and name.endswith(a[1:])):
            return True
    return False


class Guard:
    """ASGI middleware; see the module doc. `metrics`: a `GatewayMetrics` (or None)."""

    def __init__(self, app, metrics=None, allowed_hosts: list[str] | None = None) -> None:
        self.app = app
        self.metrics = metrics
        self.allowed_hosts = list(allowed_hosts or ())

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 0

        async def counted(msg) -> None:
            nonlocal status
            if msg["type"] == "http.response.start":
                status = msg["status"]
            await send(msg)

        try:
            host = next((v.decode("latin-1") for k, v in scope["headers"] if k == b"host"), "")
            if not host_allowed(host, self.allowed_hosts):
                resp = error_response(400, f"host: {host!r} is not served here", param="host")
                await resp(scope, receive, counted)
                return
            await self.app(scope, receive, counted)
        except Exception as e:  # noqa: BLE001 - the last line of defence
            log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            if self.metrics is not None:
                self.metrics.unhandled.inc()
            if status == 0:
                msg = f"gateway error: {type(e).__name__} (logged)"
                await error_response(500, msg, "server_error")(scope, receive, counted)
        finally:
            if self.metrics is not None:
                path = scope.get("path", "")
                self.metrics.responses.labels(path if path in ENDPOINTS else "other",
                                              str(status or 499)).inc()  # fmt: skip
