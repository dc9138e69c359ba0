"""`gittins`: the Gittins index of the predicted length distribution, through a real engine."""

from __future__ import annotations

import math

import numpy as np
import pytest
from builders import first_kv_victim, make_engine, make_estimates, make_requests, run_engine
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schedule.test_srpt import run_checked

from presched.predict.estimate import LengthEstimate
from presched.predict.noisy_oracle import noisy_oracle
from presched.schedule import POLICIES
from presched.schedule.gittins import Gittins
from presched.schedule.srpt import SRPT
from presched.sim.setup import SimConfig, simulate


def start_order(seqs):
    return [s.id for s in sorted(seqs, key=lambda s: (s.first_scheduled, s.index))]


def test_prefers_a_likely_short_heavy_tailed_request_over_a_sure_medium_one():
    # r1: a sure 100 tokens. r2: median 20 with a heavy tail (log-normal sigma 2): its mean,
    # ~140, is larger, but it is 50 % likely to be done within 20 tokens. Gittins runs r2 first
    # (1 / index ~15 vs 95); ordering by the mean (srpt, sjf) runs r1 first.
    reqs = make_requests([(4, 5), (4, 100), (4, 20)], arrivals=[0.0, 0.1, 0.2])
    est = LengthEstimate.concat([make_estimates([5, 100]), make_estimates([20], 2.0)])
    assert est[2].mean > est[1].mean

    def order(policy):
        return start_order(run_engine(make_engine(policy, max_num_seqs=1), reqs, est))

    assert order("gittins") == ["r0", "r2", "r1"]
    assert order("srpt") == order("sjf") == ["r0", "r1", "r2"]


def test_effective_size_of_a_sure_length_is_its_mean_remaining():
    # increasing hazard: the best horizon is "run to completion", so 1 / index = E[L - g | L > g]
    # (~ L - g; the sigma-0 estimate spreads 10 % of the mass below L)
    reqs = make_requests([(4, 50)], arrivals=[0.0])
    (seq,) = run_engine(make_engine("fcfs"), reqs, make_estimates([50]))
    for g in (0, 20, 45):
        seq.generated = g
        assert Gittins().priority(seq, 0.0) == pytest.approx(
            seq.estimate.mean_remaining(g), rel=1e-9
        )


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 60),
    seed=st.integers(0, 10_000),
    max_num_seqs=st.integers(1, 8),
    rate=st.sampled_from([5.0, 50.0, 500.0]),
)
def test_exact_predictions_order_like_srpt(n, seed, max_num_seqs, rate):
    reqs = make_requests(n=n, seed=seed, rate=rate)
    est = make_estimates([r.target_tokens for r in reqs])
    shape = {"max_num_seqs": max_num_seqs}
    git = run_checked(lambda: Gittins(c_frac=0), reqs, est, shape, num_blocks=10_000)
    srpt = run_checked(lambda: SRPT(c_frac=0), reqs, est, shape, num_blocks=10_000)
    assert [s.first_scheduled for s in git] == [s.first_scheduled for s in srpt]


def test_kv_victim_is_the_lowest_index():
    assert first_kv_victim(Gittins(), make_estimates([3, 7, 4])) == "r1"
    # r1 likely short (median 2, heavy tail: high index), r2 a sure 6: r2 has the lowest index
    est = LengthEstimate.concat(
        [make_estimates([3]), make_estimates([2], 2.0), make_estimates([6])]
    )
    assert est[1].mean > est[2].mean
    assert first_kv_victim(Gittins(), est) == "r2"
    assert first_kv_victim(Gittins(), make_estimates([5, 5, 5])) == "r2"  # tie: latest (here: last admitted)


def test_limited_preemption_shares_srpts_guard():
    # as in test_srpt: r1 (2 tokens) arrives at 5.5 while r0 (50) runs alone; with c_frac 0.8
    # gittins preempts r0 at t=6; after 0.8 * E[L] = 38 tokens it does not; c_frac 0 never does.
    est = make_estimates([50, 2])
    for arrival, c_frac, first in ((5.5, 0.8, 6.0), (38.5, 0.8, 50.0), (5.5, 0.0, 50.0)):
        reqs = make_requests([(2, 50), (2, 2)], arrivals=[0.0, arrival])
        policy = Gittins(c_frac=c_frac, recompute_weight=0.0)
        r0, r1 = run_engine(make_engine(policy, max_num_seqs=1), reqs, est)
        assert r1.first_scheduled == first
        assert r0.preemptions == (first != 50.0)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 50),
    seed=st.integers(0, 10_000),
    max_num_seqs=st.integers(1, 8),
    kv_tokens=st.integers(400, 3000),
    c_frac=st.sampled_from([0.0, 0.8, 5.0]),
    cap=st.sampled_from([1, None]),
)
def test_invariants_under_memory_pressure_with_bad_predictions(
    n, seed, max_num_seqs, kv_tokens, c_frac, cap
):
    rng = np.random.default_rng(seed)
    lengths = list(zip(rng.integers(1, 200, n).tolist(), rng.integers(1, 200, n).tolist()))
    reqs = make_requests(lengths, arrivals=np.cumsum(rng.exponential(1 / 50.0, n)).tolist())
    factory = lambda: Gittins(c_frac=c_frac, max_preemptions=cap, recompute_weight=0.0)
    run_checked(factory, reqs, noisy_oracle(reqs, 1.0, seed),
                {"max_num_seqs": max_num_seqs, "block_size": 4}, math.ceil(kv_tokens / 4))  # fmt: skip


@pytest.mark.parametrize("params, field", [
    ({"c_frac": -1}, "c_frac"),
    ({"max_preemptions": -2}, "max_preemptions"),
    ({"min_gap": math.nan}, "min_gap"),
    ({"recompute_weight": -0.5}, "recompute_weight"),
])  # fmt: skip
def test_bad_config_names_the_field(params, field):
    with pytest.raises(ValueError, match=rf"^{field}: "):
        POLICIES.create("gittins", **params)
    with pytest.raises(ValueError, match=rf"policy_params\.{field}"):
        SimConfig(policy="gittins", policy_params=params).policy_factory()


def test_missing_prediction_is_a_clear_error():
    reqs = make_requests([(2, 5), (2, 5)], arrivals=[0.0, 0.0])
    with pytest.raises(ValueError, match="request 'r0' has no length prediction"):
        simulate(reqs, SimConfig(policy="gittins"))
