"""Bugs the review found in files it does not own (`serve/app.py`, `serve/config.py`): each
test states the expected behaviour and is marked xfail(strict=True) until the owner fixes the
line named in its reason (then it passes, strict xfail reports it, and the mark goes).

Over real HTTP (uvicorn, the stub engine) where the bug is in the HTTP app.
"""

from __future__ import annotations

import httpx
import pydantic
import pytest

from presched.serve.app import build_app
from presched.serve.config import ServeConfig


@pytest.mark.xfail(strict=True, reason="serve/app.py:240 body.get('max_completion_tokens', "
                   "body.get('max_tokens')) is None when the key is present as null")
def test_a_null_max_completion_tokens_falls_back_to_max_tokens(asgi_server, stub_server):
    """OpenAI clients may send `max_completion_tokens: null` with `max_tokens` (both are
    optional in vLLM's protocol). The gateway then reads max_tokens as None: an oracle
    policy refuses the request (400: send ignore_eos with max_tokens) and the log row has
    max_tokens NULL."""
    upstream, _ = stub_server(model="m")
    cfg = ServeConfig(backends=[{"url": upstream, "model": "m"}], log={"path": None},
                      policy="sjf-oracle")  # fmt: skip
    url = asgi_server(build_app(cfg))
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3,
            "max_completion_tokens": None, "ignore_eos": True}  # fmt: skip
    r = httpx.post(url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 200, r.text


@pytest.mark.xfail(strict=True, reason="serve/config.py:47-48 TenantConfig.weight and "
                   "rate_limit_rps accept inf (no allow_inf_nan=False)")  # fmt: skip
@pytest.mark.parametrize("field", ["weight", "rate_limit_rps"])
def test_an_infinite_tenant_weight_or_rate_is_refused_naming_the_field(field):
    """weight: .inf crashes Gateway() (QueueShares: floor(nan), 'cannot convert float NaN to
    integer', naming no field); rate_limit_rps: .inf crashes Tenants() (OverflowError in
    int(inf) for the default burst). Both should be config errors naming the field."""
    with pytest.raises(pydantic.ValidationError, match=rf"tenants\.0\.{field}"):
        ServeConfig(backends=[{"url": "http://127.0.0.1:9", "model": "m"}], log={"path": None},
                    tenants=[{"name": "a", "api_key": "k", field: float("inf")}])  # fmt: skip
