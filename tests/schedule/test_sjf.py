"""`sjf`: shortest predicted job first, driven through a real engine instance (1 s per step)."""

from __future__ import annotations

import numpy as np
import pytest
from builders import first_kv_victim, make_engine, make_estimates, make_requests, run_engine
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schedule.test_srpt import run_checked

from presched.predict.estimate import LengthEstimate
from presched.predict.noisy_oracle import noisy_oracle
from presched.schedule import POLICIES
from presched.schedule.sjf import SJF
from presched.sim.seq import Seq
from presched.sim.setup import SimConfig, simulate


def start_order(seqs):
    return [s.id for s in sorted(seqs, key=lambda s: (s.first_scheduled, s.index))]


def test_serves_in_predicted_order():
    # one slot; r0 runs 0..9; r1..r3 wait. Predicted 3, 6, 1 -> r3 (9..10), r1 (10..13), r2
    reqs = make_requests([(4, 9), (4, 3), (4, 6), (4, 1)], arrivals=[0.0, 0.1, 0.2, 0.3])
    seqs = run_engine(make_engine("sjf", max_num_seqs=1), reqs, make_estimates([9, 3, 6, 1]))
    assert [(s.first_scheduled, s.finish) for s in seqs] == [(0, 9), (10, 13), (13, 19), (9, 10)]


def test_follows_a_wrong_prediction_not_the_truth():
    # r3 truly needs 1 token but is predicted 8; r2 truly 6, predicted 2: sjf runs r2, r1, r3
    reqs = make_requests([(4, 9), (4, 3), (4, 6), (4, 1)], arrivals=[0.0, 0.1, 0.2, 0.3])
    seqs = run_engine(make_engine("sjf", max_num_seqs=1), reqs, make_estimates([9, 5, 2, 8]))
    assert start_order(seqs) == ["r0", "r2", "r1", "r3"]
    assert [s.first_scheduled for s in seqs] == [0.0, 15.0, 9.0, 18.0]
    oracle = run_engine(make_engine("sjf-oracle", max_num_seqs=1), reqs)
    assert start_order(oracle) == ["r0", "r3", "r1", "r2"]


def test_stat_chooses_the_statistic():
    # r1: median 10 but uncertain (q90 ~ 36); r2: a sure 20. By median r1 first, by q90 r2 first.
    reqs = make_requests([(4, 5), (4, 5), (4, 5)], arrivals=[0.0, 0.1, 0.2])
    est = LengthEstimate.concat([make_estimates([5]), make_estimates([10], 1.0),
                                 make_estimates([20])])  # fmt: skip
    by = {stat: start_order(run_engine(make_engine(SJF(stat=stat), max_num_seqs=1), reqs, est))
          for stat in ("median", "q90", "point")}  # fmt: skip
    short_first, sure_first = ["r0", "r1", "r2"], ["r0", "r2", "r1"]
    assert by == {"median": short_first, "q90": sure_first, "point": short_first}


def test_requeued_request_is_ordered_by_its_predicted_remaining():
    seq = Seq(make_requests([(4, 100)], arrivals=[0.0])[0], 0)
    seq.estimate = make_estimates([50], 1.0)[0]
    policy = SJF()
    assert policy.priority(seq, 0.0) == pytest.approx(seq.estimate.mean)
    seq.generated = 80  # preempted after outliving its median: E[L - 80 | L > 80]
    assert policy.priority(seq, 0.0) == pytest.approx(seq.estimate.mean_remaining(80))
    assert SJF(stat="point").priority(seq, 0.0) == 1.0  # max(50 - 80, 1)


def test_kv_victim_is_the_largest_predicted_remaining_ties_to_the_latest_arrival():
    assert first_kv_victim(SJF(), make_estimates([3, 7, 4])) == "r1"
    assert first_kv_victim(SJF(), make_estimates([30, 7, 4])) == "r0"  # a wrong prediction decides
    assert first_kv_victim(SJF(), make_estimates([5, 5, 5])) == "r2"  # tie: latest (here: last admitted)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 60),
    seed=st.integers(0, 10_000),
    max_num_seqs=st.integers(1, 8),
    rate=st.sampled_from([5.0, 50.0, 500.0]),
    chunked=st.booleans(),
)
def test_exact_predictions_give_the_sjf_oracle_start_order(n, seed, max_num_seqs, rate, chunked):
    reqs = make_requests(n=n, seed=seed, rate=rate)
    est = make_estimates([r.target_tokens for r in reqs])
    shape = {"max_num_seqs": max_num_seqs, "enable_chunked_prefill": chunked}
    sjf = run_checked(lambda: POLICIES.create("sjf"), reqs, est, shape, num_blocks=10_000)
    oracle = run_checked(
        lambda: POLICIES.create("sjf-oracle"), reqs, None, shape, num_blocks=10_000
    )
    assert start_order(sjf) == start_order(oracle)
    assert [s.first_scheduled for s in sjf] == [s.first_scheduled for s in oracle]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 50),
    seed=st.integers(0, 10_000),
    max_num_seqs=st.integers(1, 8),
    kv_tokens=st.integers(400, 3000),
    stat=st.sampled_from(["mean", "q90", "point", "rank"]),
)
def test_invariants_under_memory_pressure_with_bad_predictions(
    n, seed, max_num_seqs, kv_tokens, stat
):
    rng = np.random.default_rng(seed)
    lengths = list(zip(rng.integers(1, 200, n).tolist(), rng.integers(1, 200, n).tolist()))
    reqs = make_requests(lengths, arrivals=np.cumsum(rng.exponential(1 / 50.0, n)).tolist())
    seqs = run_checked(lambda: SJF(stat=stat), reqs, noisy_oracle(reqs, 1.0, seed),
                       {"max_num_seqs": max_num_seqs, "block_size": 4}, kv_tokens // 4)  # fmt: skip
    assert all(s.generated == s.target for s in seqs)


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match=r"^stat: Input should be 'mean', 'point'.* \(got 'q42'\)"):
        POLICIES.create("sjf", stat="q42")
    with pytest.raises(ValueError, match=r"policy_params\.stat"):
        SimConfig(policy="sjf", policy_params={"stat": "mode"}).policy_factory()


def test_missing_prediction_is_a_clear_error():
    reqs = make_requests([(2, 5), (2, 5)], arrivals=[0.0, 0.0])
    with pytest.raises(ValueError, match="request 'r0' has no length prediction"):
        simulate(reqs, SimConfig(policy="sjf"))
