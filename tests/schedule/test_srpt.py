"""`srpt` and `trail`: predicted remaining time, progressive refinement, limited preemption.
Driven through a real engine instance; with constant_steps every step takes 1 s, so a request
alone in the engine has generated t tokens at time t."""

from __future__ import annotations

import math

import numpy as np
import pytest
from builders import linear_steps, make_engine, make_estimates, make_requests, run_engine
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sim.test_invariants import check_run

from presched.predict.estimate import LengthEstimate
from presched.predict.noisy_oracle import noisy_oracle
from presched.schedule import POLICIES
from presched.schedule.srpt import SRPT, TRAIL
from presched.sim.cluster import Cluster
from presched.sim.config import EngineConfig
from presched.sim.setup import SimConfig, simulate


def run_checked(policy_factory, reqs, est, shape, num_blocks):
    """Run with and without fast-forward; check every invariant of tests/sim/test_invariants.py
    (each request finishes exactly once with its true length, KV within capacity and freed, ...)
    and that both runs give the same timelines. Returns the seqs of the fast-forwarded run."""
    runs = []
    for ff in (True, False):
        cluster = Cluster(EngineConfig(**shape), num_blocks, linear_steps(),
                          policy_factory, None, 1, fast_forward=ff)  # fmt: skip
        runs.append(check_run(cluster, reqs, est))
    for a, b in zip(*runs):
        assert a.preemptions == b.preemptions
        assert (a.first_scheduled, a.finish) == pytest.approx(
            (b.first_scheduled, b.finish), rel=1e-9
        )
    return runs[0]


def test_preempts_a_long_request_for_a_short_one_early_in_its_life():
    # r0 (prompt 2, predicted and true 50) runs alone; r1 (2 tokens) arrives at 5.5. At t=6 r0 has
    # 5 tokens, ~43 predicted left > ~2 + recompute (2 + 6): preempted; r1 runs 6..8.
    reqs = make_requests([(2, 50), (2, 2)], arrivals=[0.0, 5.5])
    r0, r1 = run_engine(make_engine("srpt", max_num_seqs=1), reqs, make_estimates([50, 2]))
    assert r0.preemptions == 1 and r1.preemptions == 0
    assert (r1.first_scheduled, r1.finish) == (6.0, 8.0)
    assert r0.finish == 8.0 + 50 - 6  # recompute at 8 (prompt + 6 tokens), then 44 more tokens


@pytest.mark.parametrize("arrival, preempted", [(37.5, True), (38.5, False)])
def test_never_preempts_after_c_frac_of_the_initial_prediction(arrival, preempted):
    # P0 = E[L] of r0's prediction = 47.56; c_frac 0.8 -> preemptible while g < 38.048. r1 arrives
    # just before r0's 38th token (decision at t=38, g=38) or just before its 39th (t=39, g=39).
    # recompute_weight 0, so only the c_frac window decides.
    est = make_estimates([50, 2])
    assert 0.8 * est[0].mean == pytest.approx(38.048)
    reqs = make_requests([(2, 50), (2, 2)], arrivals=[0.0, arrival])
    policy = SRPT(c_frac=0.8, recompute_weight=0.0)
    r0, r1 = run_engine(make_engine(policy, max_num_seqs=1), reqs, est)
    if preempted:
        assert r0.preemptions == 1 and (r1.first_scheduled, r1.finish) == (38.0, 40.0)
        assert r0.finish == 52.0
    else:
        assert r0.preemptions == 0 and (r0.finish, r1.first_scheduled) == (50.0, 50.0)


def test_c_frac_zero_only_reorders():
    reqs = make_requests([(2, 50), (2, 2)], arrivals=[0.0, 5.5])
    r0, r1 = run_engine(make_engine(SRPT(c_frac=0), max_num_seqs=1), reqs, make_estimates([50, 2]))
    assert r0.preemptions == 0 and r1.first_scheduled == 50.0


def test_recompute_weight_charges_the_victims_tokens_and_trail_does_not():
    # r0 has a 200-token prompt: recomputing it costs ~205 tokens > the ~41 r1 would gain.
    reqs = make_requests([(200, 50), (2, 2)], arrivals=[0.0, 5.5])
    est = make_estimates([50, 2])
    r0, r1 = run_engine(make_engine("srpt", max_num_seqs=1), reqs, est)
    assert r0.preemptions == 0 and r1.first_scheduled == 50.0
    r0, r1 = run_engine(make_engine("trail", max_num_seqs=1), reqs, est)
    assert r0.preemptions == 1 and r1.first_scheduled == 6.0


def test_follows_the_prediction_not_the_truth():
    # r1 is truly the shortest but predicted the longest: it runs last.
    reqs = make_requests([(4, 9), (4, 1), (4, 6), (4, 3)], arrivals=[0.0, 0.1, 0.2, 0.3])
    est = make_estimates([9, 30, 2, 5])
    seqs = run_engine(make_engine(SRPT(c_frac=0), max_num_seqs=1), reqs, est)
    assert [s.first_scheduled for s in seqs] == [0.0, 18.0, 9.0, 15.0]


def bimodal(low: float, high: float) -> np.ndarray:
    """Quantiles of a request that is 90 % likely to stop by `low` tokens, else runs to ~`high`."""
    return np.array([low] * 9 + [high, high], dtype=float)


def estimates(rows) -> LengthEstimate:
    q = np.array(rows, dtype=float)
    med = q[:, 4]
    return LengthEstimate(q, med, med)


def record_victims(policy) -> list:
    victims, hook = [], policy.on_preempt

    def on_preempt(seq, now):
        victims.append((seq.id, seq.generated, now))
        hook(seq, now)

    policy.on_preempt = on_preempt
    return victims


def test_refinement_makes_an_outlived_prediction_the_kv_victim():
    # r0 (prompt 2) is predicted ~10 tokens (90 %), r1 (prompt 7) a sure 40; both truly run 60.
    # 7 blocks of 10 tokens: at t=29 r0 (first in the batch) needs its 4th block and none is
    # free. r0 has outlived its prediction: refined, ~200 tokens left; r1 ~11: r0 is the victim.
    # Counting a point estimate down instead (stat 'point': max(10 - g, 1) = 1 vs 40 - g = 11)
    # makes r1 the victim.
    reqs = make_requests([(2, 60), (7, 60)], arrivals=[0.0, 0.0])
    est = estimates([bimodal(10, 300), [40] * 11])
    for stat, expected in (("mean", "r0"), ("q90", "r0"), ("point", "r1")):
        policy = SRPT(stat=stat, c_frac=0)
        victims = record_victims(policy)
        seqs = run_engine(make_engine(policy, num_blocks=7, block_size=10), reqs, est)
        assert victims[0] == (expected, 29, 29.0), stat
        assert all(s.generated == 60 for s in seqs)
    # the refined remaining of r0 grew as it outlived its prediction
    r0 = seqs[0]
    r0.generated = 0
    p_fresh = SRPT().priority(r0, 0.0)
    r0.generated = victims[0][1]
    assert SRPT().priority(r0, 0.0) > 5 * p_fresh


def test_refinement_picks_the_outlived_request_as_the_victim_to_admit():
    # Two running requests (2 slots): r0 predicted ~10 but outlives it, r1 a sure 40. At t=20.5
    # a 3-token request arrives: r0 (refined: ~210 left) is preempted, not r1 (~20 left).
    reqs = make_requests([(2, 60), (2, 40), (2, 3)], arrivals=[0.0, 0.0, 20.5])
    est = estimates([bimodal(10, 300), [40] * 11, [3] * 11])
    seqs = run_engine(make_engine(SRPT(c_frac=3.0), max_num_seqs=2), reqs, est)
    assert [s.preemptions for s in seqs] == [1, 0, 0]
    assert seqs[2].first_scheduled == 21.0


@pytest.mark.parametrize("fast_forward", [True, False])
def test_decision_is_retaken_when_the_head_or_batch_changes(fast_forward):
    # r0 (bimodal: ~10 or ~300) runs alone; c (a sure 30) arrives at 5.5: at t=6 r0's refined
    # remaining (26.9) is below c's (28.6): no preemption. From t=10 r0 has outlived ~10 and is
    # re-estimated at ~217 left, but nothing happens until the head changes: r2 (a sure 5)
    # arrives at 20.5 and preempts r0 at t=21. The same with and without fast-forward.
    reqs = make_requests([(2, 100), (2, 30), (2, 5)], arrivals=[0.0, 5.5, 20.5])
    est = estimates([bimodal(10, 300), [30] * 11, [5] * 11])
    r0, c, r2 = run_engine(
        make_engine("srpt", max_num_seqs=1, fast_forward=fast_forward), reqs, est
    )
    assert r0.preemptions == 1
    assert (r2.first_scheduled, r2.finish) == (21.0, 26.0)
    assert (c.first_scheduled, c.finish) == (26.0, 56.0)
    assert r0.finish == 56.0 + 100 - 21


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(2, 40),
    seed=st.integers(0, 10_000),
    max_num_seqs=st.integers(1, 4),
    cap=st.sampled_from([0, 1, 2]),
    c_frac=st.sampled_from([0.8, 5.0]),
    weight=st.sampled_from([0.0, 1.0]),
)
def test_no_request_is_preempted_more_than_max_preemptions(
    n, seed, max_num_seqs, cap, c_frac, weight
):
    # ample KV: every preemption is one srpt chose to admit a shorter request (bad predictions)
    reqs = make_requests(n=n, seed=seed, rate=50.0)
    est = noisy_oracle(reqs, sigma=1.5, seed=seed)
    factory = lambda: SRPT(c_frac=c_frac, max_preemptions=cap, recompute_weight=weight)
    seqs = run_checked(factory, reqs, est, {"max_num_seqs": max_num_seqs}, num_blocks=4000)
    assert max(s.preemptions for s in seqs) <= cap


def test_the_preemption_cap_binds():
    reqs = make_requests(n=300, seed=1, rate=50.0)
    est = noisy_oracle(reqs, sigma=1.5, seed=1)
    uncapped = lambda: SRPT(c_frac=5.0, max_preemptions=None, recompute_weight=0.0)
    seqs = run_checked(uncapped, reqs, est, {"max_num_seqs": 4}, num_blocks=4000)
    assert max(s.preemptions for s in seqs) > 2
    capped = lambda: SRPT(c_frac=5.0, max_preemptions=2, recompute_weight=0.0)
    seqs = run_checked(capped, reqs, est, {"max_num_seqs": 4}, num_blocks=4000)
    assert max(s.preemptions for s in seqs) == 2


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 50),
    seed=st.integers(0, 10_000),
    max_num_seqs=st.integers(1, 8),
    block_size=st.sampled_from([1, 16]),
    kv_tokens=st.integers(400, 3000),
    sigma=st.sampled_from([0.0, 1.0]),
    policy=st.sampled_from(["srpt", "trail"]),
)
def test_invariants_under_memory_pressure(
    n, seed, max_num_seqs, block_size, kv_tokens, sigma, policy
):
    rng = np.random.default_rng(seed)
    lengths = list(zip(rng.integers(1, 200, n).tolist(), rng.integers(1, 200, n).tolist()))
    reqs = make_requests(lengths, arrivals=np.cumsum(rng.exponential(1 / 50.0, n)).tolist())
    shape = {"max_num_seqs": max_num_seqs, "block_size": block_size}
    run_checked(lambda: POLICIES.create(policy), reqs, noisy_oracle(reqs, sigma, seed),
                shape, math.ceil(kv_tokens / block_size))  # fmt: skip


def test_trail_has_the_papers_defaults():
    t = TRAIL()
    assert (t.name, t.stat, t.c_frac, t.max_preemptions, t.min_gap, t.recompute_weight) == (
        "trail", "mean", 0.8, None, 0.0, 0.0)  # fmt: skip
    s = SRPT()
    assert (s.stat, s.c_frac, s.max_preemptions, s.min_gap, s.recompute_weight) == (
        "mean", 2.0, 4, 0.0, 1.0)  # fmt: skip


@pytest.mark.parametrize("params, field", [
    ({"c_frac": -0.1}, "c_frac"),
    ({"c_frac": math.inf}, "c_frac"),
    ({"max_preemptions": -1}, "max_preemptions"),
    ({"max_preemptions": 1.5}, "max_preemptions"),
    ({"min_gap": -1}, "min_gap"),
    ({"recompute_weight": "high"}, "recompute_weight"),
    ({"stat": "q42"}, "stat"),
    ({"stat": "rank"}, "stat"),
])  # fmt: skip
@pytest.mark.parametrize("name", ["srpt", "trail"])
def test_bad_config_names_the_field(name, params, field):
    with pytest.raises(ValueError, match=rf"^{field}: "):
        POLICIES.create(name, **params)
    with pytest.raises(ValueError, match=rf"policy_params\.{field}"):
        SimConfig(policy=name, policy_params=params).policy_factory()


def test_missing_prediction_is_a_clear_error():
    reqs = make_requests([(2, 5), (2, 5)], arrivals=[0.0, 0.0])
    with pytest.raises(ValueError, match="request 'r0' has no length prediction"):
        simulate(reqs, SimConfig(policy="srpt"))
