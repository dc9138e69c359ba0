"""The gateway's small endpoints: `GET /v1/models`, `/health`, `/metrics`.

`/v1/models` needs a tenant's key when tenants are configured. `/metrics` and the full `/health`
(backend names and URLs, queue sizes, the predictor's error) need the `admin_api_key` when one
is set, else a tenant's key when tenants are configured, else nothing (`public_status` opens
them to anyone). Without it `/metrics` is 401 and `/health` is a liveness answer that reveals
nothing: `{"status": "ok"}` (200) while a backend is up, `{"status": "unavailable"}` (503)
otherwise.
"""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING

from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response

from presched.serve.request_body import error_response

if TYPE_CHECKING:
    from presched.serve.app import GatewayApp


async def list_models(g: GatewayApp, request: HTTPRequest) -> Response:
    if g.tenants.identify(request.headers) is None:
        return error_response(401, "invalid or missing API key", "authentication_error")
    data = [{"id": m, "object": "model", "created": 0, "owned_by": "presched"} for m in g.models]
    return JSONResponse({"object": "list", "data": data})


def may_see_status(g: GatewayApp, headers) -> bool:
    """Whether a request may read /metrics and the full /health (`admin_api_key`,
    `public_status`; else any tenant's key when tenants are configured)."""
    cfg = g.cfg
    if cfg.public_status:
        return True
    if cfg.admin_api_key is not None:
        auth = headers.get("authorization", "")
        key = auth[7:].strip() if auth[:7].lower() == "bearer " else headers.get("api-key", "")
        return hmac.compare_digest(key.encode(), cfg.admin_api_key.encode())
    return not cfg.tenants or g.tenants.identify(headers) is not None


async def health(g: GatewayApp, request: HTTPRequest) -> Response:
    snap = g.gw.snapshot()
    up = any(b["healthy"] for b in snap["backends"])
    if not may_see_status(g, request.headers):  # liveness only: no names, no URLs
        return JSONResponse({"status": "ok" if up else "unavailable"}, status_code=200 if up else 503)
    return JSONResponse({"status": "ok" if up else "no healthy backend", **snap},
                        status_code=200 if up else 503)  # fmt: skip


async def prometheus(g: GatewayApp, request: HTTPRequest) -> Response:
    if not may_see_status(g, request.headers):
        return error_response(401, "GET /metrics needs the admin key (or a tenant's key when no "
                              "admin_api_key is set)", "authentication_error")  # fmt: skip
    return Response(g.metrics.render(), media_type="text/plain; version=0.0.4")
