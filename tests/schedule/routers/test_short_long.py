"""short-long: long requests spread evenly, the rest by queue length."""

from __future__ import annotations

import numpy as np
import pytest
from builders import constant_steps, make_estimates, make_requests
from hypothesis import given, settings
from hypothesis import strategies as st

from presched.schedule import POLICIES
from presched.schedule.routers import ROUTERS
from presched.sim.cluster import Cluster
from presched.sim.config import EngineConfig
from presched.sim.seq import Seq
from presched.sim.setup import SimConfig, simulate


def burst(outs, n, router="short-long", **params):
    """Route a burst (all at t=0) of requests with these output lengths (predicted about right);
    returns the instance of each."""
    reqs = make_requests([(16, o) for o in outs], arrivals=[0.0] * len(outs))
    cluster = Cluster(EngineConfig(max_num_seqs=4), 2000, constant_steps(),
                      lambda: POLICIES.create("fcfs"), ROUTERS.create(router, **params), n)  # fmt: skip
    res = cluster.run(reqs, estimates=make_estimates(outs, sigma=0.3))
    assert np.isfinite(res.records.finish).all()
    return res.records.instance


@settings(max_examples=25, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=40), st.integers(2, 4))
def test_a_burst_spreads_long_requests_evenly(kinds, n):
    inst = burst([800 if k else 20 for k in kinds], n, threshold_tokens=200)
    longs = np.bincount(inst[np.array(kinds)], minlength=n)
    assert longs.max() - longs.min() <= 1
    total = np.bincount(inst, minlength=n)
    assert total.max() - total.min() <= 2  # shorts fill the gaps by queue length


def test_least_work_alone_piles_long_requests_up():
    # one long, six medium, one long: least-work balances tokens, and six 150-token requests
    # outweigh one 800-token one, so the second long joins the first
    outs = [800] + [150] * 6 + [800]
    assert burst(outs, 2, "least-work").tolist() == [0, 1, 1, 1, 1, 1, 1, 0]
    # short-long: the second long goes where there is none; mediums by count, ties by work
    assert burst(outs, 2, threshold_tokens=500).tolist() == [0, 1, 1, 0, 1, 0, 1, 1]


def test_adaptive_threshold_is_a_sliding_quantile_of_recent_predictions():
    router = ROUTERS.create("short-long", long_fraction=0.25, window=4)
    values = [10, 20, 30, 40, 35, 100, 5, 5, 5, 5, 6]
    est = make_estimates(values)
    seqs = [Seq(r, i) for i, r in enumerate(make_requests([(1, 1)] * len(values)))]
    for s in seqs:
        s.estimate = est[s.index]
    got = [router.is_long(s) for s in seqs]
    # window of 4, threshold = its 3rd smallest: 40 > 30; 100 > 40; once 100 left, 6 > 5
    expect = [False, False, False, True, False, True, False, False, False, False, True]
    assert got == expect


def test_fixed_threshold_and_stat():
    router = ROUTERS.create("short-long", threshold_tokens=100, stat="q90")
    est = make_estimates([80, 80], sigma=0.0)
    seqs = [Seq(r, i) for i, r in enumerate(make_requests([(1, 1)] * 2))]
    seqs[0].estimate = est[0]
    seqs[1].estimate = make_estimates([80], sigma=0.5)[0]  # q90 = 80 e^(0.5 x 1.28) = 152
    assert [router.is_long(s) for s in seqs] == [False, True]


def test_needs_predictions():
    reqs = make_requests(n=5)
    with pytest.raises(ValueError, match="request 'r0' has no length prediction"):
        simulate(reqs, SimConfig(num_instances=2, router="short-long"))
