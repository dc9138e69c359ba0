"""Prefill/decode disaggregation (sim/disagg.py): hand-checked timelines, invariants on random
workloads (hypothesis), fast-forward exactness, the comparison with a colocated engine, config
errors."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from builders import (StepChecks, constant_steps, fed_tokens, linear_steps, make_estimates,
                      make_requests)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sim.test_invariants import engine_shapes, itl_gaps

from presched.metrics import summarize
from presched.schedule import POLICIES
from presched.schedule.routers import ROUTERS
from presched.sim import Cluster, DisaggCluster, DisaggConfig, EngineConfig, SimConfig, simulate
from presched.sim.steptime import StepTimeConfig, StepTimeModel, get_model


def fcfs():
    return POLICIES.create("fcfs")


def pd(reqs, prefill=None, decode=None, blocks=(1000, 1000), step_model=None, num=(1, 1),
       router="round-robin", policy=fcfs, kv_bytes=0.0, bandwidth=math.inf, latency=0.0,
       fast_forward=True, estimates=None):  # fmt: skip
    """Run `reqs` on a P/D cluster; returns (result, cluster)."""
    cluster = DisaggCluster(
        prefill or EngineConfig(), decode or EngineConfig(), blocks[0], blocks[1],
        step_model or constant_steps(), policy, ROUTERS.create(router), ROUTERS.create(router),
        num[0], num[1], kv_bytes, bandwidth, latency, fast_forward,
    )  # fmt: skip
    return cluster.run(reqs, estimates=estimates), cluster


def colocated(reqs, step_model=None, blocks=1000, **engine):
    return Cluster(EngineConfig(**engine), blocks, step_model or constant_steps(), fcfs).run(reqs)


def times(s):
    return (s.first_scheduled, s.first_token, s.finish)


# --- hand-checked timelines (every step 1 s) ---------------------------------------------------
def test_timeline_with_a_transfer():
    # Transfer = 0.25 s + prompt 4 tokens x 1 B / (8 B/s) = 0.75 s.
    # Prefill: 0-1 A's prompt -> A tok1 @1, KV at decode @1.75. B (arrives 0.5) joins at the
    # next step: 1-2 B's prompt -> B tok1 @2, KV @2.75.
    # Decode: 1.75-2.75 A feeds tok1 -> tok2 @2.75 (ITL 1.75: the transfer is in it). B is added
    # at 2.75 (the next step starts then): 2.75-3.75 A tok3 (done), B tok2 (done).
    reqs = make_requests([(4, 3), (4, 2)], arrivals=[0.0, 0.5])
    res, cl = pd(reqs, kv_bytes=1.0, bandwidth=8.0, latency=0.25)
    a, b = res.seqs
    assert times(a) == (0.0, 1.0, 3.75) and a.kv_ready == 1.75
    assert times(b) == (1.0, 2.0, 3.75) and b.kv_ready == 2.75
    assert (a.max_itl, b.max_itl) == (1.75, 1.75)
    assert sorted(res.itl.values()[0].tolist()) == [1.0, 1.75, 1.75]  # A: 1.75, 1; B: 1.75
    assert (a.prefill_instance, a.instance, b.instance) == (0, 1, 1)
    assert res.roles == ["prefill", "decode"] and res.busy_seconds == [2.0, 2.0]
    assert res.kv_transfer_bytes == 8.0
    assert list(res.records.ttft) == [1.0, 1.5] and list(res.records.output_tokens) == [3, 2]
    # colocated, the same requests finish at 3 (golden test): P/D adds the transfer
    assert [s.finish for s in colocated(reqs).seqs] == [3.0, 3.0]


def test_a_one_token_reply_ends_on_the_prefill_instance():
    reqs = make_requests([(4, 1), (4, 2)], arrivals=[0.0, 0.0])
    res, cl = pd(reqs, kv_bytes=1.0, bandwidth=8.0)
    one, two = res.seqs
    assert times(one) == (0.0, 1.0, 1.0) and one.instance == 0 and one.kv_ready is None
    assert times(two) == (0.0, 1.0, 2.5) and two.instance == 1  # KV @1.5, then one step
    assert res.kv_transfer_bytes == 4.0 and cl.decode[0].finished == [two]


def test_preempted_on_decode_it_recomputes_locally():
    # Decode KV: 4 blocks of 2 tokens. A and B (prompt 2, 4 tokens) prefill together (0-1) and
    # reach decode @1 (no transfer time). @1 both admitted with blocks for prompt + 1 = 3
    # tokens (2 each): 1-2 tok2, 2-3 tok3. @3 each needs a 3rd block, none free: B (the latest
    # admitted) is preempted, losing 4 tokens of KV; 3-4 A tok4 (done). @4 B re-prefills
    # prompt + 3 generated = 5 tokens on the decode instance and samples tok4 @5.
    reqs = make_requests([(2, 4), (2, 4)], arrivals=[0.0, 0.0])
    res, cl = pd(reqs, decode=EngineConfig(block_size=2), blocks=(1000, 4))
    a, b = res.seqs
    assert times(a) == (0.0, 1.0, 4.0) and (a.preemptions, a.recomputed_tokens) == (0, 0)
    assert times(b) == (0.0, 1.0, 5.0) and (b.preemptions, b.recomputed_tokens) == (1, 4)
    assert cl.decode[0].sched.num_preemptions == 1 and cl.prefill[0].sched.num_preemptions == 0
    assert cl.decode[0].sched.kv.peak_used == 4


def test_sparse_arrivals_match_colocated_plus_the_transfer():
    # No queueing anywhere: P/D gives a colocated engine's timeline, every token after the first
    # delayed by exactly the transfer (the decode instance is idle when the KV arrives).
    rng = np.random.default_rng(5)
    lengths = list(zip(rng.integers(1, 300, 30).tolist(), rng.integers(1, 40, 30).tolist()))
    reqs = make_requests(lengths, arrivals=(np.arange(30) * 100.0).tolist())
    col = colocated(reqs, linear_steps(), blocks=2000)
    for latency in (0.0, 0.004):
        res, _ = pd(reqs, step_model=linear_steps(), blocks=(2000, 2000), latency=latency,
                    kv_bytes=1000.0, bandwidth=1e8)  # fmt: skip
        for p, c in zip(res.seqs, col.seqs):
            assert (p.first_scheduled, p.first_token) == (c.first_scheduled, c.first_token)
            shift = 0.0 if c.target == 1 else latency + p.prompt_tokens * 1e-5
            assert p.finish == pytest.approx(c.finish + shift, abs=1e-9)


def loaded(rate, outputs=(200, 800), n=300, seed=0):
    rng = np.random.default_rng(seed)
    lengths = list(zip(rng.integers(64, 1024, n).tolist(), rng.integers(*outputs, n).tolist()))
    return make_requests(lengths, arrivals=np.cumsum(rng.exponential(1 / rate, n)).tolist())


ENGINE = EngineConfig(max_num_seqs=32, max_num_batched_tokens=2048)


def pd_loaded(reqs):
    return pd(reqs, prefill=ENGINE, decode=ENGINE, blocks=(20000, 20000), step_model=linear_steps())


def test_ttft_does_not_depend_on_decode_load():
    # The point of disaggregation: a prompt never waits behind decode batches. The same prompts
    # and arrivals with short or long replies get identical TTFTs on a prefill instance, while a
    # colocated engine's TTFT explodes once long decodes fill its batch slots.
    short, long = loaded(8.0, outputs=(2, 10)), loaded(8.0)
    pd_s, _ = pd_loaded(short)
    pd_l, _ = pd_loaded(long)
    assert np.array_equal(pd_s.records.ttft, pd_l.records.ttft)
    col_s = Cluster(ENGINE, 20000, linear_steps(), fcfs).run(short)
    col_l = Cluster(ENGINE, 20000, linear_steps(), fcfs).run(long)
    assert col_l.records.ttft.mean() > 10 * col_s.records.ttft.mean()


@pytest.mark.parametrize("rate", [4.0, 8.0])
def test_one_plus_one_beats_one_colocated_engine_on_ttft(rate):
    # Free transfers; light (4/s) and heavy (8/s: the colocated engine's slots are full) decode
    # load. P/D is never worse on mean TTFT, and an order of magnitude better when loaded.
    reqs = loaded(rate)
    res, _ = pd_loaded(reqs)
    col = Cluster(ENGINE, 20000, linear_steps(), fcfs).run(reqs)
    ttft, cttft = res.records.ttft, col.records.ttft
    assert ttft.mean() <= cttft.mean() and res.records.e2el.mean() <= col.records.e2el.mean()
    if rate == 8.0:
        assert ttft.mean() < cttft.mean() / 10
        assert np.percentile(ttft, 99) < np.percentile(cttft, 99) / 10


def test_simconfig_wires_the_model_kv_size_and_the_link():
    # Fitted step model with 1 s steps; Llama-3.1-8B: 131,072 KV bytes per token.
    step = StepTimeConfig(kind="fitted", coefficients=dict(
        a_prefill=1.0, b_prefill=0, c_prefill=0, a_decode=1.0, b_decode=0, c_decode=0))  # fmt: skip
    d = DisaggConfig(num_prefill=2, num_decode=3, kv_transfer_gbps=100.0, transfer_latency_ms=2.0,
                     prefill_engine=EngineConfig(max_num_batched_tokens=16384, num_blocks=500),
                     decode_router="least-requests")  # fmt: skip
    cfg = SimConfig(step_time=step, engine=EngineConfig(num_blocks=700), disaggregated=d)
    reqs = make_requests(n=40, seed=1, rate=5.0)
    res = simulate(reqs, cfg)
    assert res.roles == ["prefill"] * 2 + ["decode"] * 3 and res.num_blocks == [500] * 2 + [700] * 3
    kv = get_model("llama-3.1-8b").kv_bytes_per_token
    for s in res.seqs:
        if s.target > 1:
            transfer = 2e-3 + s.prompt_tokens * kv * 8 / 100e9
            assert s.kv_ready - s.first_token == pytest.approx(transfer)
            assert s.prefill_instance in (0, 1) and s.instance in (2, 3, 4)
    out = summarize(res.records, res.itl.values())  # metrics work unchanged
    assert out["completed"] == 40
    assert out["mean_ttft_ms"] == pytest.approx(res.records.ttft.mean() * 1e3)
    assert res.itl.num_gaps == sum(s.target - 1 for s in res.seqs)


# --- invariants on random workloads --------------------------------------------------------------
class StepProbe(StepTimeModel):
    """Records the largest prefill chunk of any step it timed (for decode instances)."""

    def __init__(self, model):
        self.model, self.max_prefill = model, 0

    def step_time(self, p, pairs, pc, b, c):
        self.max_prefill = max(self.max_prefill, p)
        return self.model.step_time(p, pairs, pc, b, c)

    def decode_line(self, b, c):
        return self.model.decode_line(b, c)


def check_pd(reqs, shapes, blocks, num, policy, router, link, ff, estimates):
    cl = DisaggCluster(
        EngineConfig(**shapes[0]), EngineConfig(**shapes[1]), blocks[0], blocks[1], linear_steps(),
        lambda: POLICIES.create(policy), ROUTERS.create(router), ROUTERS.create(router),
        num[0], num[1], kv_bytes_per_token=link[0], transfer_bandwidth=link[1],
        transfer_latency=link[2], fast_forward=ff,
    )  # fmt: skip
    checks = [StepChecks(inst) for inst in cl.instances]  # budget, blocks, KV balance per step
    probes = [StepProbe(inst.step_model) for inst in cl.decode]
    for inst, probe in zip(cl.decode, probes):
        inst.step_model = probe
    res = cl.run(reqs, estimates=estimates)
    seqs = res.seqs
    assert sorted(s.id for s in seqs) == sorted(r.id for r in reqs)
    # every request leaves its prefill instance once, and finishes once: on a decode instance
    # unless its reply is one token
    pre = [s for inst in cl.prefill for s in inst.finished]
    dec = [s for inst in cl.decode for s in inst.finished]
    assert len(pre) == len({id(s) for s in pre}) == len(seqs)
    assert len(dec) == len({id(s) for s in dec}) == sum(s.target > 1 for s in seqs)
    for s in seqs:
        assert s.generated == s.target and s.last_token == s.finish and s.blocks == 0
        assert s.arrival <= s.first_scheduled <= s.first_token <= s.finish
        assert s.prefill_instance < num[0]
        if s.target > 1:
            assert s.instance >= num[0]
            assert s.kv_ready == s.first_token + (link[2] + s.prompt_tokens * link[0] / link[1])
        if s.preemptions == 0:
            assert s.recomputed_tokens == 0
    # KV never over capacity, all returned; engines drained
    assert sum(c.steps for c in checks) >= 1
    fed_tokens(checks, seqs)
    for inst, check in zip(cl.instances, checks):
        kv = inst.sched.kv
        assert check.peak_used <= kv.num_blocks and kv.free == kv.num_blocks
        assert not inst.sched.running and not inst.sched.waiting
    # a decode instance runs prefill work only to recompute what it lost to preemption
    for inst, probe in zip(cl.decode, probes):
        if inst.sched.num_preemptions == 0:
            assert probe.max_prefill == 0
    assert res.itl.num_gaps == sum(s.target - 1 for s in seqs)
    assert len(res.busy_seconds) == len(res.roles) == num[0] + num[1]
    rows = [(s.first_scheduled, s.first_token, s.kv_ready, s.finish, s.max_itl, s.preemptions)
            for s in seqs]
    return rows, itl_gaps(res)


def check_both_ways(reqs, shapes, blocks, num, policy, router, link):
    # SLOs (TTFT 0.5 s, E2E 1 s + 50 ms per token) for the policies that need one; ignored by others
    reqs = [replace(r, slo_ttft=0.5, slo_e2e=1.0 + 0.05 * r.output_tokens) for r in reqs]
    estimates = make_estimates([r.output_tokens for r in reqs], sigma=0.5)
    on, gaps_on = check_pd(reqs, shapes, blocks, num, policy, router, link, True, estimates)
    off, gaps_off = check_pd(reqs, shapes, blocks, num, policy, router, link, False, estimates)
    for a, b in zip(on, off):
        assert a[5] == b[5]
        assert a[:2] == pytest.approx(b[:2], rel=1e-9, abs=1e-9)
        assert a[3:5] == pytest.approx(b[3:5], rel=1e-9, abs=1e-9)
    assert gaps_on == pytest.approx(gaps_off, rel=1e-9, abs=1e-12)  # the ITL log, gap by gap


shapes = engine_shapes  # the colocated invariant tests' engine shapes
links = st.sampled_from([(0, math.inf, 0), (131072.0, 50e9, 0.001), (1e6, 1e9, 0.0)])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shapes=st.tuples(shapes, shapes), kv=st.integers(2600, 20000), n=st.integers(1, 50),
       seed=st.integers(0, 10_000), num=st.tuples(st.integers(1, 3), st.integers(1, 3)),
       policy=st.sampled_from(POLICIES.names()), router=st.sampled_from(ROUTERS.names()),
       link=links)  # fmt: skip
def test_invariants_hold_and_fast_forward_is_exact(shapes, kv, n, seed, num, policy, router, link):
    blocks = tuple(math.ceil(kv / s["block_size"]) for s in shapes)
    reqs = make_requests(n=n, seed=seed, rate=20.0)
    check_both_ways(reqs, shapes, blocks, num, policy, router, link)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shapes=st.tuples(shapes, shapes), kv=st.integers(400, 3000), n=st.integers(1, 60),
       seed=st.integers(0, 10_000), num=st.tuples(st.integers(1, 2), st.integers(1, 3)),
       policy=st.sampled_from(POLICIES.names()), router=st.sampled_from(ROUTERS.names()),
       rate=st.sampled_from([5.0, 50.0, 500.0]), link=links)  # fmt: skip
def test_invariants_under_tight_memory(shapes, kv, n, seed, num, policy, router, rate, link):
    # up to 400 tokens per request in 400-3000 tokens of KV: decode preemption on most examples
    rng = np.random.default_rng(seed)
    lengths = list(zip(rng.integers(1, 200, n).tolist(), rng.integers(1, 200, n).tolist()))
    reqs = make_requests(lengths, arrivals=np.cumsum(rng.exponential(1 / rate, n)).tolist())
    blocks = tuple(math.ceil(kv / s["block_size"]) for s in shapes)
    check_both_ways(reqs, shapes, blocks, num, policy, router, link)


def test_same_inputs_same_result():
    reqs = make_requests(n=300, seed=3, rate=30.0)
    cfg = SimConfig(engine=EngineConfig(max_num_seqs=8), disaggregated=DisaggConfig(
        num_prefill=2, num_decode=2, decode_router="least-work"))  # fmt: skip
    a, b = simulate(reqs, cfg), simulate(reqs, cfg)
    for col in ("first_scheduled", "first_token", "finish", "preemptions", "instance"):
        assert np.array_equal(getattr(a.records, col), getattr(b.records, col))


# --- bad configuration ---------------------------------------------------------------------------
@pytest.mark.parametrize("bad, field", [
    ({"num_prefill": 0}, "disaggregated.num_prefill"),
    ({"num_decode": -1}, "disaggregated.num_decode"),
    ({"decode_router": "nope"}, "disaggregated.decode_router"),
    ({"prefill_router": "nope"}, "disaggregated.prefill_router"),
    ({"kv_transfer_gbps": 0}, "disaggregated.kv_transfer_gbps"),
    ({"transfer_latency_ms": -1}, "disaggregated.transfer_latency_ms"),
    ({"prefill_engine": {"max_num_seqs": 0}}, "disaggregated.prefill_engine.max_num_seqs"),
    ({"num_decoders": 2}, "disaggregated.num_decoders"),
])  # fmt: skip
def test_bad_config_names_the_field(bad, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        SimConfig.model_validate({"disaggregated": bad})


def test_bad_layout_and_params_name_the_field():
    with pytest.raises(ValueError, match="num_instances"):
        SimConfig(num_instances=4, disaggregated=DisaggConfig(num_prefill=1, num_decode=2))
    SimConfig(num_instances=3, disaggregated=DisaggConfig(num_prefill=1, num_decode=2))  # agrees
    cfg = SimConfig(disaggregated=DisaggConfig(decode_router_params={"bogus": 1}))
    with pytest.raises(ValueError, match="disaggregated.decode_router_params"):
        simulate(make_requests(n=2), cfg)
    with pytest.raises(ValueError, match="decode_router"):
        DisaggCluster(EngineConfig(), EngineConfig(), 10, 10, constant_steps(), fcfs, num_decode=2)
    with pytest.raises(ValueError, match="transfer_bandwidth"):
        DisaggCluster(EngineConfig(), EngineConfig(), 10, 10, constant_steps(), fcfs,
                      transfer_bandwidth=0)


def test_a_request_too_big_for_the_decode_kv_is_refused_clearly():
    with pytest.raises(ValueError, match="exceeds the KV cache"):
        pd(make_requests([(100, 50)], arrivals=[0.0]), blocks=(1000, 8))
