"""A hybrid attention / Mamba model's per-sequence state in the simulator: each running request
holds `engine.state_blocks` blocks from admission to finish or preemption (vLLM's MambaManager:
one block per Mamba group), so admission is limited by memory; dense models are unchanged."""

from __future__ import annotations

import pytest
from builders import StepChecks, fingerprint, linear_steps, make_engine, make_requests, run_engine
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from presched.schedule import POLICIES
from presched.sim import SimConfig, simulate
from presched.sim.config import DisaggConfig, EngineConfig
from presched.sim.scheduler import Scheduler
from presched.sim.seq import Seq

NEMOTRON = dict(model="nemotron-nano-9b-v2", hardware="h100-sxm")


def test_a_hybrid_engine_gets_vllms_block_size_and_state_blocks():
    cfg = SimConfig(step_time=NEMOTRON)
    engine = cfg.engine_for()
    assert (engine.block_size, engine.state_blocks, cfg.num_blocks()) == (1312, 7, 2653)
    assert cfg.engine.block_size == 16 and cfg.engine.state_blocks is None  # the config as given
    ignored = SimConfig(step_time=NEMOTRON, engine=EngineConfig(state_blocks=0)).engine_for()
    assert (ignored.block_size, ignored.state_blocks) == (1312, 0)  # set: kept
    dense = SimConfig()
    assert dense.engine_for() is dense.engine and dense.engine.state_blocks is None


def admitted(engine: EngineConfig, num_blocks: int, n: int, prompt: int) -> int:
    """Requests running after one step with n prompts waiting and room for all in the budget."""
    sched = Scheduler(engine, num_blocks, POLICIES.create("fcfs"))
    for i, r in enumerate(make_requests([(prompt, 100)] * n, [0.0] * n)):
        sched.add(Seq(r, i), 0.0)
    sched.schedule(0.0)
    return len(sched.running)


def test_a_hybrid_engine_admits_fewer_sequences_than_with_its_state_ignored():
    cfg = SimConfig(step_time=NEMOTRON,
                    engine=EngineConfig(max_num_seqs=4096, max_num_batched_tokens=2**22))
    engine, blocks = cfg.engine_for(), cfg.num_blocks()  # 2653 blocks of 1312 tokens, 7 of state
    ignored = engine.model_copy(update={"state_blocks": 0})
    # a 1000-token prompt (+100 out) needs one attention block; with its state 8 blocks
    assert admitted(engine, blocks, 600, 1000) == 2653 // 8 == 331
    assert admitted(ignored, blocks, 600, 1000) == 600
    # with vLLM's default 256 seats: 3000 + 100 tokens take 3 attention blocks, 10 with the
    # state (room for 265: the seats bind); 4000 + 100 take 4, 11 with the state: memory binds
    seats = engine.model_copy(update={"max_num_seqs": 256})
    assert admitted(seats, blocks, 300, 3000) == 256
    assert admitted(seats, blocks, 300, 4000) == 2653 // 11 == 241
    assert admitted(ignored.model_copy(update={"max_num_seqs": 256}), blocks, 300, 4000) == 256


def test_state_blocks_come_back_at_finish_and_preemption():
    engine = EngineConfig(block_size=4, state_blocks=3, max_num_batched_tokens=64)
    sched = Scheduler(engine, 20, POLICIES.create("fcfs"))
    a, b = (Seq(r, i) for i, r in enumerate(make_requests([(8, 4), (5, 4)], [0.0, 0.0])))
    sched.add(a, 0.0)
    sched.add(b, 0.0)
    sched.schedule(0.0)
    assert (a.blocks, b.blocks, sched.kv.free) == (2, 2, 20 - 2 * (2 + 3))
    assert sched.kv.peak_used == 10
    sched._preempt(b, 0.0)  # by recompute: its KV blocks and its state go back
    assert (b.blocks, sched.kv.free) == (0, 15)
    sched.finish(a)
    assert sched.kv.free == 20 == sched.kv.num_blocks


def test_state_blocks_at_or_above_the_cache_are_refused_naming_the_field():
    with pytest.raises(ValueError, match=r"^engine.state_blocks: 7 blocks .* of the 7"):
        Scheduler(EngineConfig(state_blocks=7), 7, POLICIES.create("fcfs"))
    with pytest.raises(ValidationError, match="state_blocks"):
        EngineConfig(state_blocks=-1)
    sched = Scheduler(EngineConfig(block_size=4, state_blocks=3), 10, POLICIES.create("fcfs"))
    (r,) = make_requests([(26, 4)], [0.0])  # needs KV for 29 tokens > (10 - 3) x 4
    with pytest.raises(ValueError, match=r"\(28 tokens besides its state blocks\)"):
        sched.add(Seq(r, 0), 0.0)


@st.composite
def tight_runs(draw):
    n = draw(st.integers(2, 10))
    lengths = [(draw(st.integers(1, 40)), draw(st.integers(1, 30))) for _ in range(n)]
    arrivals = sorted(draw(st.lists(st.sampled_from([0.0, 0.01, 0.05, 0.2]), min_size=n,
                                    max_size=n)))  # fmt: skip
    bs, state = draw(st.sampled_from([1, 4, 16])), draw(st.integers(1, 4))
    most = max(-(-(p + o) // bs) for p, o in lengths)
    engine = dict(num_blocks=most + state + draw(st.integers(0, 8)), block_size=bs,
                  state_blocks=state, max_num_seqs=draw(st.integers(1, 6)),
                  max_num_batched_tokens=draw(st.integers(8, 64)))
    return lengths, arrivals, engine, draw(st.sampled_from(["fcfs", "srpt-oracle", "vtc"]))


@settings(max_examples=60, deadline=None, derandomize=True)
@given(tight_runs())
def test_every_block_and_state_block_comes_back_in_runs_under_pressure(run):
    # every step: free + each running request's blocks + state_blocks per running request =
    # num_blocks (StepChecks); at the end everything is free, with and without fast-forward
    lengths, arrivals, engine, policy = run
    reqs = make_requests(lengths, arrivals)
    results = []
    for ff in (True, False):
        inst = make_engine(policy, step_model=linear_steps(), fast_forward=ff, **engine)
        checks = StepChecks(inst)
        seqs = run_engine(inst, reqs)
        assert all(s.generated == s.target and s.blocks == 0 for s in seqs)
        assert inst.sched.kv.free == inst.sched.kv.num_blocks and checks.steps >= 1
        assert checks.peak_used <= engine["num_blocks"]
        results.append([v for s in seqs for v in (s.first_token, s.finish, s.preemptions)])
    assert results[0] == pytest.approx(results[1])


def test_a_run_under_pressure_preempts_and_frees_every_state_block():
    reqs = make_requests([(30, 40)] * 6, [0.0] * 6)
    inst = make_engine("fcfs", num_blocks=24, step_model=linear_steps(), block_size=4,
                       state_blocks=2, max_num_batched_tokens=256)  # fmt: skip
    checks = StepChecks(inst)
    seqs = run_engine(inst, reqs)
    assert sum(s.preemptions for s in seqs) > 0 and checks.steps > 0
    assert inst.sched.kv.free == 24 and all(s.generated == 40 for s in seqs)


def test_prefix_caching_and_disaggregation_keep_the_state_balance():
    from presched.workload.prefix import with_hashes

    toks = [list(range(20)) + [100 + i] * 6 for i in range(6)]  # a shared 20-token prefix
    reqs = [with_hashes(r, t, 4) for r, t in zip(make_requests([(26, 12)] * 6, [0.0] * 6), toks)]
    inst = make_engine("fcfs", num_blocks=30, step_model=linear_steps(), block_size=4,
                       state_blocks=3, enable_prefix_caching=True)  # fmt: skip
    seqs = run_engine(inst, reqs)
    kv = inst.sched.kv
    assert sum(s.cached_tokens for s in seqs) > 0 and sum(s.preemptions for s in seqs) > 0
    assert kv.free == kv.num_blocks and kv.evictable == sum(n.blocks for n in kv.nodes())
    cfg = SimConfig(step_time=NEMOTRON, disaggregated=DisaggConfig(num_prefill=1, num_decode=1))
    res = simulate(make_requests([(2000, 50)] * 20, [0.0] * 20), cfg)
    assert all(s.generated == 50 for s in res.seqs)


def test_a_dense_model_runs_as_before():
    reqs = make_requests(n=300, seed=3, rate=40.0)
    base = simulate(reqs, SimConfig(engine=EngineConfig(num_blocks=600)))
    zero = simulate(reqs, SimConfig(engine=EngineConfig(num_blocks=600, state_blocks=0)))
    assert base.num_preemptions > 0 and fingerprint(zero) == fingerprint(base)
