"""Bugs a review found in `serve/app.py` and `serve/config.py`, fixed: a null
`max_completion_tokens` beside `max_tokens`, infinite tenant weights / rates, and token counting
and predictions run on the event loop (issue 13, defect 10: a long prompt stalled every stream).

Over real HTTP (uvicorn, the stub engine) where the bug is in the HTTP app.
"""

from __future__ import annotations

import threading

import httpx
import numpy as np
import pydantic
import pytest

from presched.predict.estimate import LEVELS, LengthEstimate
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


def test_token_counting_and_predictions_run_off_the_event_loop(asgi_server, stub_server):
    """Both run on the gateway's worker thread, never on the thread of the event loop that
    relays every stream (a tokenizer over a long prompt, a predictor batch: CPU-bound)."""
    up, _ = stub_server(model="m")
    seen: dict[str, str] = {}

    class Constant:  # TEST DOUBLE of a length predictor: 10 tokens; notes where it ran
        def predict(self, requests):
            seen["predict"] = threading.current_thread().name
            return LengthEstimate.from_quantiles(np.full((len(requests), len(LEVELS)), 10.0))

    app = build_app(ServeConfig(backends=[{"url": up, "model": "m"}], log={"path": None}), Constant(), None)
    g = app.state.gateway
    count = g.count

    def counting(text):
        seen["count"] = threading.current_thread().name
        return count(text)

    g.count = counting
    url = asgi_server(app)
    r = httpx.post(url + "/v1/completions", json={"model": "m", "prompt": "hello " * 50, "max_tokens": 2})
    assert r.status_code == 200, r.text
    # the event loop runs in the server's thread ("uvicorn-test"); the calls in the worker's
    assert set(seen) == {"predict", "count"}
    assert all(name.startswith("presched-worker") for name in seen.values()), seen
