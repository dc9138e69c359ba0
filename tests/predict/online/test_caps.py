"""`TenantCaps`: the per-tenant token bucket on the labels learned."""

from __future__ import annotations

import numpy as np

from presched.predict.online.caps import TenantCaps


def test_a_clock_that_steps_back_refills_nothing():
    # arrivals at t=0 and t=10 completed interleaved (the order `presched learn` feeds rows):
    # over a 10 s span a bucket of rate 1/s and burst 5 grants at most 5 + 10 labels
    caps = TenantCaps(rate=1.0, burst=5)
    granted = sum(caps.take("t", 10.0 if i % 2 else 0.0) for i in range(200))
    assert granted <= 15 and caps.dropped == 200 - granted


def test_shuffled_times_are_capped_as_the_sorted_ones():
    rng = np.random.default_rng(0)
    times = np.sort(rng.uniform(0, 20, 400))
    shuffled = times[np.argsort(times + rng.uniform(0.1, 5.0, 400))]  # completion order
    sorted_caps, shuffled_caps = TenantCaps(rate=2.0, burst=10), TenantCaps(rate=2.0, burst=10)
    in_order = sum(sorted_caps.take("t", float(t)) for t in times)
    out_of_order = sum(shuffled_caps.take("t", float(t)) for t in shuffled)
    bound = 10 + 2.0 * (times[-1] - times[0])
    assert in_order <= bound + 1 and out_of_order <= bound + 1
    assert out_of_order <= in_order
