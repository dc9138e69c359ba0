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


def test_a_nan_clock_refills_nothing_and_does_not_stick():
    caps = TenantCaps(rate=1.0, burst=2)
    assert [caps.take("t", 0.0), caps.take("t", 0.0), caps.take("t", 0.0)] == [True, True, False]
    assert caps.take("t", float("nan")) is False  # no refill from a clock that is not one
    assert caps.take("t", 1.0) is True  # ... and the clock still moves (a NaN once froze it)
    fresh = TenantCaps(rate=1.0, burst=1)
    assert fresh.take("u", float("nan")) is True and fresh.take("u", 5.0) is True


def test_buckets_survive_a_save_under_the_new_configs_burst():
    caps = TenantCaps(rate=0.5, burst=4)
    for _ in range(4):
        caps.take("a", 10.0)
    caps.take("b", 10.0)
    again = TenantCaps(rate=0.5, burst=2)
    again.restore(caps.state())
    assert again.take("a", 10.0) is False  # emptied before the save: still empty
    assert [again.take("b", 10.0), again.take("b", 10.0)] == [True, True]  # 3 saved, capped at 2
    assert again.take("b", 10.0) is False and again.take("a", 12.0) is True  # 2 s at 0.5/s
