"""Invariants that every simulated run keeps (docs/invariants.md), checked on random
workloads and engine shapes (hypothesis), including memory pressure that forces preemption."""

from __future__ import annotations

import math

import numpy as np
import pytest
from builders import StepChecks, fed_tokens, linear_steps, make_requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from presched.predict.noisy_oracle import noisy_oracle
from presched.schedule import POLICIES
from presched.schedule.routers import ROUTERS
from presched.sim.cluster import Cluster
from presched.sim.config import EngineConfig
from presched.sim.setup import SimConfig, build_cluster, simulate


# options that some policies need on a generic workload (every other policy runs as registered)
POLICY_PARAMS = {"slo": {"e2e_slo_s": 20.0}}


def make_policy(name: str):
    return POLICIES.create(name, **POLICY_PARAMS.get(name, {}))


def check_run(cluster: Cluster, requests, estimates=None) -> list:
    """`run_and_check`, returning the seqs."""
    return run_and_check(cluster, requests, estimates).seqs


def run_and_check(cluster: Cluster, requests, estimates=None):
    """Run and check every invariant, at every step (`StepChecks`) and at the end; returns the
    result. Length-aware policies get noisy predictions (sigma 1) unless `estimates` are given."""
    probes = [StepChecks(inst) for inst in cluster.instances]
    if estimates is None:
        estimates = noisy_oracle(requests, 1.0, seed=len(requests))
    res = cluster.run(requests, estimates=estimates)
    seqs = res.seqs
    # each request finishes exactly once, with exactly its true length
    assert sorted(s.id for s in seqs) == sorted(r.id for r in requests)
    finished = [s for inst in cluster.instances for s in inst.finished]
    assert len(finished) == len(requests) == len({id(s) for s in finished})
    for s in seqs:
        assert s.generated == s.target
        assert s.arrival <= s.first_scheduled <= s.first_token <= s.finish
        assert s.last_token == s.finish
        assert s.blocks == 0
    # KV never over capacity; everything freed at the end; engines drained
    for inst, probe in zip(cluster.instances, probes):
        assert probe.peak_used <= inst.sched.kv.num_blocks
        assert inst.sched.kv.free == inst.sched.kv.num_blocks
        assert not inst.sched.running and not inst.sched.waiting
    assert sum(p.steps for p in probes) >= 1  # the per-step checks ran
    fed_tokens(probes, seqs)
    # the ITL log accounts for every gap between consecutive tokens
    assert res.itl.num_gaps == sum(s.target - 1 for s in seqs)
    v, w = res.itl.values()
    assert (v > 0).all() and (w >= 1).all() and int(w.sum()) == res.itl.num_gaps
    return res


def itl_gaps(res) -> np.ndarray:
    """Every inter-token gap of a run, sorted (the ITL log expanded by weight)."""
    v, w = res.itl.values()
    return np.sort(np.repeat(v, w))


def check_both_ways(reqs, shape, kv_tokens, policy, router, instances):
    """Run with and without fast-forward, check the invariants of both, and check that
    fast-forward (an optimisation, not an approximation) gives the same timelines, the same
    inter-token gaps (the ITL log, gap by gap) and the same largest gap per request."""
    engine = EngineConfig(**shape)
    num_blocks = math.ceil(kv_tokens / engine.block_size)
    runs, gaps = [], []
    for ff in (True, False):
        cluster = Cluster(engine, num_blocks, linear_steps(), lambda: make_policy(policy),
                          ROUTERS.create(router), instances, fast_forward=ff)  # fmt: skip
        res = run_and_check(cluster, reqs)
        runs.append([(s.first_scheduled, s.first_token, s.finish, s.max_itl, s.preemptions)
                     for s in res.seqs])
        gaps.append(itl_gaps(res))
    for a, b in zip(*runs):
        assert a[4] == b[4]
        assert a[:4] == pytest.approx(b[:4], rel=1e-9, abs=1e-9)
    assert gaps[0] == pytest.approx(gaps[1], rel=1e-9, abs=1e-12)


engine_shapes = st.fixed_dictionaries({
    "max_num_seqs": st.integers(1, 16),
    "max_num_batched_tokens": st.integers(32, 2048),
    "enable_chunked_prefill": st.booleans(),
    "long_prefill_token_threshold": st.sampled_from([0, 0, 64]),
    "block_size": st.sampled_from([1, 4, 16]),
})  # fmt: skip


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shape=engine_shapes,
    kv_tokens=st.integers(2600, 20000),
    policy=st.sampled_from(POLICIES.names()),
    n=st.integers(1, 60),
    seed=st.integers(0, 10_000),
    instances=st.integers(1, 3),
    router=st.sampled_from(ROUTERS.names()),
)
def test_invariants_hold_and_fast_forward_is_exact(shape, kv_tokens, policy, n, seed, instances, router):
    check_both_ways(make_requests(n=n, seed=seed, rate=20.0), shape, kv_tokens, policy, router, instances)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    shape=engine_shapes,
    kv_tokens=st.integers(400, 3000),
    policy=st.sampled_from(POLICIES.names()),
    n=st.integers(1, 80),
    seed=st.integers(0, 10_000),
    instances=st.integers(1, 3),
    router=st.sampled_from(ROUTERS.names()),
    rate=st.sampled_from([5.0, 50.0, 500.0]),
)
def test_invariants_under_tight_memory(shape, kv_tokens, policy, n, seed, instances, router, rate):
    # requests of up to 400 tokens in 400-3000 tokens of KV: preemption on most examples
    rng = np.random.default_rng(seed)
    lengths = list(zip(rng.integers(1, 200, n).tolist(), rng.integers(1, 200, n).tolist()))
    reqs = make_requests(lengths, arrivals=np.cumsum(rng.exponential(1 / rate, n)).tolist())
    check_both_ways(reqs, shape, kv_tokens, policy, router, instances)


def test_memory_pressure_preempts_and_still_completes(data_dir):
    from presched.workload.config import WorkloadConfig, build_workload

    reqs = build_workload(WorkloadConfig(source="azure-conv", num_requests=400, rate=40.0))
    cfg = SimConfig(engine=EngineConfig(num_blocks=1200, max_num_seqs=64))
    for policy in POLICIES.names():
        runs = []
        for ff in (True, False):
            cluster = build_cluster(cfg.model_copy(update={
                "policy": policy, "policy_params": POLICY_PARAMS.get(policy, {}), "fast_forward": ff}))
            seqs = check_run(cluster, reqs)
            if policy != "kv-admission":  # it admits by predicted memory to avoid exactly this
                assert sum(s.preemptions for s in seqs) > 0, policy
            runs.append(([s.finish for s in seqs], [s.preemptions for s in seqs]))
        assert runs[0][1] == runs[1][1]
        assert runs[0][0] == pytest.approx(runs[1][0], rel=1e-9)


def test_request_larger_than_kv_is_refused_clearly():
    reqs = make_requests([(5000, 10)], arrivals=[0.0])
    with pytest.raises(ValueError, match="exceeds the KV cache"):
        simulate(reqs, SimConfig(engine=EngineConfig(num_blocks=100)))


def test_same_inputs_same_result():
    reqs = make_requests(n=500, seed=3, rate=30.0)
    cfg = SimConfig(policy="srpt-oracle", engine=EngineConfig(max_num_seqs=8))
    a, b = simulate(reqs, cfg), simulate(reqs, cfg)
    for col in ("first_scheduled", "first_token", "finish", "preemptions"):
        assert np.array_equal(getattr(a.records, col), getattr(b.records, col))


@pytest.mark.parametrize("a0", [1.6885355304091472, 2.0208173470316306, 0.1, 7.3])
def test_arrival_tied_with_a_step_start_lands_on_the_same_side_in_both_modes(a0):
    # 1 s steps from a0; r1 arrives at a0 + 2.0, the start of r0's third step up to rounding
    # (step-by-step sums 1 + 1, fast-forward multiplies, the trace adds 2.0): both modes must
    # treat it as AT the step start (Instance.TIE), so r1 joins that step in both
    from builders import constant_steps, make_engine, run_engine

    reqs = make_requests([(1, 5), (1, 2)], arrivals=[a0, a0 + 2.0])
    runs = [[t for s in run_engine(
        make_engine("fcfs", step_model=constant_steps(), max_num_seqs=2, fast_forward=ff), reqs)
        for t in (s.first_scheduled, s.first_token, s.finish)] for ff in (True, False)]  # fmt: skip
    assert runs[0] == pytest.approx(runs[1], rel=1e-12)
    assert runs[0][3] == pytest.approx(a0 + 2.0)  # r1 starts with that step
