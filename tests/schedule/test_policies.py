"""Policies driven step by step through a real engine instance (1 s per step)."""

from __future__ import annotations

import numpy as np
import pytest
from builders import first_kv_victim, make_engine, make_requests, run_engine

from presched.registry import UnknownNameError
from presched.schedule import POLICIES, Policy
from presched.schedule.oracle import OracleSRPT
from presched.sim.config import EngineConfig
from presched.sim.setup import SimConfig, simulate


def start_order(seqs):
    return [s.id for s in sorted(seqs, key=lambda s: (s.first_scheduled, s.index))]


LENGTHS = [(4, 9), (4, 3), (4, 6), (4, 1)]  # r0..r3, all arrive at t=0 while one slot is busy


def test_fcfs_serves_in_arrival_order():
    reqs = make_requests(LENGTHS, arrivals=[0.0, 0.1, 0.2, 0.3])
    assert start_order(run_engine(make_engine("fcfs", max_num_seqs=1), reqs)) == ["r0", "r1", "r2", "r3"]


def test_sjf_oracle_serves_shortest_true_length_first():
    reqs = make_requests(LENGTHS, arrivals=[0.0, 0.1, 0.1, 0.1])
    # r0 starts alone at t=0; then shortest first: r3 (1), r1 (3), r2 (6)
    assert start_order(run_engine(make_engine("sjf-oracle", max_num_seqs=1), reqs)) == ["r0", "r3", "r1", "r2"]


def test_srpt_oracle_preempts_a_long_request_for_a_short_one():
    # r0 (prompt 2, 50 tokens) runs alone; r1 (prompt 2, 2 tokens) arrives at t=5.5.
    # r0 has 45 left after 5 tokens; 45 > 2 + recompute cost (2 + 5) -> r0 is preempted.
    reqs = make_requests([(2, 50), (2, 2)], arrivals=[0.0, 5.5])
    r0, r1 = run_engine(make_engine("srpt-oracle", max_num_seqs=1), reqs)
    assert r0.preemptions == 1
    assert r1.first_scheduled == 6.0 and r1.finish == 8.0
    assert r0.finish > r1.finish and r0.generated == 50


def test_srpt_recompute_weight_prevents_unprofitable_preemption():
    # Same case, but the recompute cost is charged at 10 tokens per token: no preemption.
    reqs = make_requests([(2, 50), (2, 2)], arrivals=[0.0, 5.5])
    r0, r1 = run_engine(make_engine(OracleSRPT(recompute_weight=10.0), max_num_seqs=1), reqs)
    assert r0.preemptions == 0 and r1.first_scheduled == r0.finish


def test_fcfs_never_preempts_to_admit():
    reqs = make_requests([(2, 50), (2, 2)], arrivals=[0.0, 5.5])
    r0, r1 = run_engine(make_engine("fcfs", max_num_seqs=1), reqs)
    assert r0.preemptions == 0 and r1.first_scheduled == r0.finish


def test_kv_victim_fcfs_latest_arrival_oracle_most_remaining():
    assert first_kv_victim("fcfs") == "r2"  # the latest arrival (all at t=0: the last admitted)
    assert first_kv_victim("sjf-oracle") == "r1"  # 6 tokens left, the most
    assert first_kv_victim("srpt-oracle") == "r1"


def test_oracle_srpt_beats_fcfs_on_a_saturated_workload():
    # 2000 requests, heavy-tailed lengths, 16 slots, arrivals above capacity for a while.
    reqs = make_requests(n=2000, seed=7, rate=45.0)
    base = SimConfig(engine=EngineConfig(max_num_seqs=16))
    fcfs = simulate(reqs, base).records.e2el.mean()
    srpt = simulate(reqs, base.model_copy(update={"policy": "srpt-oracle"})).records.e2el.mean()
    sjf = simulate(reqs, base.model_copy(update={"policy": "sjf-oracle"})).records.e2el.mean()
    assert srpt < 0.8 * fcfs
    assert sjf < 0.8 * fcfs


def test_registry_lists_and_refuses_unknown_names():
    assert {"fcfs", "sjf-oracle", "srpt-oracle"} <= set(POLICIES.names())
    with pytest.raises(UnknownNameError, match="unknown policy 'nope'; known: .*fcfs"):
        POLICIES.create("nope")
    assert POLICIES.create("srpt-oracle").oracle and not POLICIES.create("fcfs").oracle


class Recorder(Policy):
    """Records the hooks the engine calls, to check the documented call order."""

    name = "recorder"

    def __init__(self):
        self.events = []

    def on_arrival(self, seq, now):
        self.events.append(("arrival", seq.id, now))

    def on_schedule(self, seq, now):
        self.events.append(("schedule", seq.id, now))

    def on_tokens(self, seq, n, now):
        self.events.append(("tokens", seq.id, n))

    def on_preempt(self, seq, now):
        self.events.append(("preempt", seq.id, now))

    def on_finish(self, seq, now):
        self.events.append(("finish", seq.id, now))


@pytest.mark.parametrize("fast_forward", [True, False])
def test_hooks_called_in_documented_order_and_tokens_add_up(fast_forward):
    rec = Recorder()
    reqs = make_requests([(4, 7), (4, 3)], arrivals=[0.0, 0.5])
    run_engine(make_engine(rec, fast_forward=fast_forward), reqs)
    for rid, length in (("r0", 7), ("r1", 3)):
        ev = [e for e in rec.events if e[1] == rid]
        assert [e[0] for e in ev][:2] == ["arrival", "schedule"] and ev[-1][0] == "finish"
        assert sum(e[2] for e in ev if e[0] == "tokens") == length


def test_dynamic_policy_is_reprioritised_at_each_decision():
    class Aging(Policy):
        """Lower priority for longer prompts, but a boost for requests older than 3 s."""

        name = "aging-test"
        dynamic = True

        def priority(self, seq, now):
            return -1e9 if now - seq.arrival > 3 else seq.prompt_tokens

    reqs = make_requests([(2, 4), (50, 1), (2, 1), (2, 1), (2, 1), (2, 1)],
                         arrivals=[0.0, 0.1, 0.2, 1.2, 2.2, 3.2])  # fmt: skip
    seqs = run_engine(make_engine(Aging(), max_num_seqs=1), reqs)
    # the long prompt r1 would starve behind the stream of short ones, but ages past 3 s
    assert seqs[1].first_scheduled < seqs[4].first_scheduled
    static = run_engine(make_engine("fcfs", max_num_seqs=1), reqs)
    assert np.isfinite([s.finish for s in static]).all()


def test_fcfs_victim_is_the_latest_arrival_not_a_readmitted_older_request():
    from types import SimpleNamespace

    old = SimpleNamespace(arrival=1.0)  # re-admitted after a preemption: last in running order
    new = SimpleNamespace(arrival=5.0)
    assert POLICIES.create("fcfs").victim([new, old], now=9.0) is new
    tie_a, tie_b = SimpleNamespace(arrival=2.0), SimpleNamespace(arrival=2.0)
    assert POLICIES.create("fcfs").victim([tie_a, tie_b], now=9.0) is tie_b  # last admitted
