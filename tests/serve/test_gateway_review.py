"""Review fixes of the hardened gateway: each test here failed before its fix.

Driven on the real objects (`parse_body`, `PredictBatcher` with its worker thread, `Gateway`);
no HTTP where the bug is not in the HTTP layer.
"""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import numpy as np

from presched.predict.estimate import LEVELS, LengthEstimate
from presched.serve.predictions import PredictBatcher
from presched.serve.request_body import Done, parse_body
from presched.workload.request import Request


@settings(max_examples=50, deadline=None)
@given(mantissa=st.integers(1, 9), exp=st.integers(309, 5000), sign=st.sampled_from(["", "-"]),
       field=st.sampled_from(["temperature", "top_p", "presence_penalty"]))  # fmt: skip
def test_a_number_that_overflows_a_double_is_refused_naming_the_body(mantissa, exp, sign, field):
    """1e400 is valid JSON but Python reads it as inf: forwarded, it would be `Infinity` (not
    JSON) to the backend. It is refused like NaN / Infinity."""
    raw = f'{{"model": "m", "prompt": "x", "{field}": {sign}{mantissa}e{exp}}}'.encode()
    with pytest.raises(Done) as d:
        parse_body(raw, False, ["m"])
    err = json.loads(d.value.response.body)["error"]
    assert d.value.response.status_code == 400 and err["param"] == "body", err
    assert "out of range" in err["message"]


def test_finite_floats_and_zero_temperature_are_accepted():
    raw = b'{"model": "m", "prompt": "x", "temperature": 0, "top_p": 1e-320, "frequency_penalty": -1.5e3}'
    body, prompt = parse_body(raw, False, ["m"])
    assert body["temperature"] == 0 and body["top_p"] == 1e-320 and prompt == "x"


class _Rows:
    """A predictor (test double: its output is the point) that returns `extra` estimates more
    than it was asked for (fewer when negative)."""

    def __init__(self, extra: int) -> None:
        self.extra = extra

    def predict(self, requests):
        n = max(0, len(requests) + self.extra)
        return LengthEstimate.from_quantiles(np.full((n, len(LEVELS)), 10.0))


@pytest.mark.parametrize("extra", [-1, -3, 1])
def test_a_predictor_that_returns_the_wrong_number_of_estimates_fails_every_request(extra):
    """Before: the batch's futures past the short result were never resolved (the drain task
    died on an IndexError), so those requests hung; a longer result was used silently."""

    async def main():
        pb = PredictBatcher(_Rows(extra))
        reqs = [Request(id=f"r{i}", prompt_tokens=5, model="m") for i in range(3)]
        # a generous hang bound: the thread hand-off takes microseconds
        got = await asyncio.wait_for(asyncio.gather(*(pb.estimate(r) for r in reqs),
                                                    return_exceptions=True), 30)  # fmt: skip
        assert all(isinstance(g, ValueError) and "estimates for 3 requests" in str(g) for g in got), got
        assert pb._draining is None
        pb.worker.close()

    asyncio.run(main())


def test_a_cancelled_drain_cancels_the_requests_it_was_predicting():
    """At shutdown the worker's pending call is cancelled: the requests waiting for it end
    (CancelledError) instead of waiting forever."""

    async def main():
        gate = threading.Event()

        class Slow(_Rows):
            def predict(self, requests):
                gate.wait(30)
                return super().predict(requests)

        pb = PredictBatcher(Slow(0))
        task = asyncio.ensure_future(pb.estimate(Request(id="r", prompt_tokens=5, model="m")))
        while pb._draining is None or not pb.calls:
            await asyncio.sleep(0.001)
        pb._draining.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, 30)
        gate.set()
        pb.worker.close()

    asyncio.run(main())
