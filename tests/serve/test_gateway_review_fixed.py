"""Bugs a review found in `serve/app.py` and `serve/config.py`, fixed: a null
`max_completion_tokens` beside `max_tokens`, and infinite tenant weights / rates.

Over real HTTP (uvicorn, the stub engine) where the bug is in the HTTP app.
"""

from __future__ import annotations

import httpx
import pydantic
import pytest

from presched.serve.app import build_app
from presched.serve.config import ServeConfig


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


@pytest.mark.parametrize("field", ["weight", "rate_limit_rps"])
def test_an_infinite_tenant_weight_or_rate_is_refused_naming_the_field(field):
    """weight: .inf crashes Gateway() (QueueShares: floor(nan), 'cannot convert float NaN to
    integer', naming no field); rate_limit_rps: .inf crashes Tenants() (OverflowError in
    int(inf) for the default burst). Both should be config errors naming the field."""
    with pytest.raises(pydantic.ValidationError, match=rf"tenants\.0\.{field}"):
        ServeConfig(backends=[{"url": "http://127.0.0.1:9", "model": "m"}], log={"path": None},
                    tenants=[{"name": "a", "api_key": "k", field: float("inf")}])  # fmt: skip
