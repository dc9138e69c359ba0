"""`mlfq`: skip-join, demotion, optional preemption (real engine instance, 1 s per step: a
request with o output tokens is served in o steps). Quanta in these tests: 4, 8, 16, 32 tokens,
a prompt token costs one output token (prompt_weight=1)."""

from __future__ import annotations

import pytest
from builders import make_engine, make_estimates, make_requests, run_engine
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from presched.predict.noisy_oracle import noisy_oracle
from presched.schedule import POLICIES
from presched.schedule.mlfq import MLFQ


def mlfq(**kw):
    return MLFQ(**{"num_levels": 4, "base_quantum": 4, "prompt_weight": 1.0, **kw})


def starts(seqs):
    return {s.id: s.first_scheduled for s in seqs}


def test_skip_join_level_from_the_prompt():
    pol = mlfq()
    assert pol.quanta == [4, 8, 16, 32]
    assert [pol.join_level(pol.prompt_weight * p) for p in (1, 4, 5, 10, 32, 500)] == [0, 0, 1, 2, 3, 3]
    # r1 (prompt 10) joins level 2, r2 (prompt 2) level 0: r2 starts first although later
    reqs = make_requests([(1, 5), (10, 1), (2, 1)], [0.0, 0.5, 1.0])
    assert starts(run_engine(make_engine(mlfq(), max_num_seqs=1), reqs)) == {
        "r0": 0.0, "r2": 5.0, "r1": 6.0}  # fmt: skip
    # FIFO within a level: with prompt_weight 0 everyone is at level 0
    assert starts(run_engine(make_engine(mlfq(prompt_weight=0.0), max_num_seqs=1), reqs)) == {
        "r0": 0.0, "r1": 5.0, "r2": 6.0}  # fmt: skip


class Recorder(MLFQ):
    """Records r0's level at each event."""

    def __init__(self, **kw):
        super().__init__(**{"num_levels": 4, "base_quantum": 4, "prompt_weight": 1.0, **kw})
        self.levels = []

    def on_arrival(self, seq, now):
        super().on_arrival(seq, now)
        if seq.id != "r0":
            self.levels.append((now, self.level(self.r0)))
        else:
            self.r0 = seq


# r0 (prompt 1, 10 tokens) runs alone from t=0: usage 1 (its prompt) + 1 per token, quantum 4.
# r1 (prompt 1, 2 tokens) arrives at 1.5, r2 (prompt 1, 1 token) at 5.5.
LONG = make_requests([(1, 10), (1, 2), (1, 1)], [0.0, 1.5, 5.5])


def test_demotion_after_the_quantum_at_the_next_event():
    pol = Recorder(preempt=False)
    seqs = run_engine(make_engine(pol, max_num_seqs=1), LONG)
    # at 1.5 r0 has used 2 of 4; by 5.5 it used 6: demoted to level 1 (2 used of 8)
    assert pol.levels == [(1.5, 0), (5.5, 1)]
    assert starts(seqs) == {"r0": 0.0, "r1": 10.0, "r2": 12.0}  # non-preemptive: FIFO by level
    assert not pol._state and not pol._due  # cleaned up on finish


def test_preemption_a_new_short_request_preempts_a_demoted_long_one():
    seqs = run_engine(make_engine(mlfq(preempt=True, recompute_weight=0.0), max_num_seqs=1), LONG)
    r0, r1, r2 = seqs
    # t=2: r1 and r0 both at level 0 -> no preemption. r0 is past its quantum from t=3, which
    # takes effect at the next event (r2 arrives at 5.5); at t=6 r1 (level 0) preempts r0 (level 1)
    assert r0.preemptions == 1 and r1.preemptions == 0
    assert starts(seqs) == {"r0": 0.0, "r1": 6.0, "r2": 8.0}
    # r0 resumes at 9: one step recomputes its 7 tokens and samples the 7th; 3 more steps
    assert r1.finish == 8.0 and r2.finish == 9.0 and r0.finish == 13.0


def test_recompute_guard_blocks_unprofitable_preemption():
    # quantum gap 8 - 4 = 4 < recompute cost 1 * (prompt 1 + 6 generated) = 7
    seqs = run_engine(make_engine(mlfq(preempt=True, recompute_weight=1.0), max_num_seqs=1), LONG)
    assert [s.preemptions for s in seqs] == [0, 0, 0]
    assert starts(seqs) == {"r0": 0.0, "r1": 10.0, "r2": 12.0}


def test_no_predictor_needed_and_victim_is_the_lowest_priority():
    pol = mlfq()
    reqs = make_requests([(1, 3), (20, 3), (1, 3)], [0.0, 0.0, 0.0])  # levels 0, 3, 0
    seqs = run_engine(make_engine(pol), reqs)
    assert all(s.generated == s.target for s in seqs)
    for s in seqs:
        pol.on_arrival(s, 1.0)
    assert pol.victim(seqs, now=1.0) is seqs[1]
    assert pol.victim([seqs[0], seqs[2]], now=1.0) is seqs[2]  # same level and entry: last admitted


def test_bad_config_names_the_field():
    bad = [({"num_levels": 0}, "num_levels"), ({"num_levels": 2.5}, "num_levels"),
           ({"base_quantum": 0}, "base_quantum"), ({"quantum_ratio": 0.5}, "quantum_ratio"),
           ({"prompt_weight": -1}, "prompt_weight"), ({"preempt": "yes"}, "preempt"),
           ({"recompute_weight": float("nan")}, "recompute_weight")]  # fmt: skip
    for params, field in bad:
        with pytest.raises(ValueError, match=rf"^{field}: "):
            POLICIES.create("mlfq", **params)


streams = st.lists(st.tuples(st.integers(1, 100), st.integers(1, 60), st.floats(0, 3)),
                   min_size=1, max_size=25)  # fmt: skip


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=streams, slots=st.integers(1, 6), blocks=st.integers(40, 100),
       q0=st.integers(1, 16), w=st.sampled_from([0.0, 0.1, 1.0]),
       rw=st.sampled_from([0.0, 1.0, 5.0, 8.0]), within=st.sampled_from([None, "mean"]),
       sigma=st.sampled_from([0.0, 1.0]))  # fmt: skip
def test_property_preemptive_complete_and_fast_forward_exact(stream, slots, blocks, q0, w, rw, within, sigma):
    """With preemption on and KV pressure, FIFO or predictive inside a level (presched's default
    policy is the latter, with preemption): every request finishes exactly once with its length,
    and fast-forward (demotions applied at events) gives the step-by-step timelines."""
    t, arrivals = 0.0, []
    for *_, gap in stream:
        t += gap
        arrivals.append(t)
    reqs = make_requests([(p, o) for p, o, _ in stream], arrivals)
    runs = []
    for ff in (True, False):
        pol = MLFQ(num_levels=5, base_quantum=q0, prompt_weight=w, preempt=True,
                   recompute_weight=rw, within=within)  # fmt: skip
        eng = make_engine(pol, num_blocks=blocks, block_size=4, max_num_seqs=slots, fast_forward=ff)
        seqs = run_engine(eng, reqs, noisy_oracle(reqs, sigma, seed=len(reqs)))
        assert all(s.generated == s.target for s in seqs)
        assert len(eng.finished) == len({id(s) for s in eng.finished}) == len(seqs)
        assert not pol._state and not pol._due
        runs.append([v for s in seqs for v in (s.first_scheduled, s.finish, s.preemptions)])
    assert runs[0] == pytest.approx(runs[1])


def test_within_orders_a_level_by_predicted_remaining():
    # one slot; r0 runs; r1..r3 arrive together at the same level (same prompt): FIFO by
    # default, shortest predicted first with within="mean"
    reqs = make_requests([(4, 5), (4, 3), (4, 3), (4, 3)], arrivals=[0.0, 0.1, 0.2, 0.3])
    est = make_estimates([5, 30, 20, 10])
    fifo = run_engine(make_engine(MLFQ(), max_num_seqs=1), reqs, est)
    sjf = run_engine(make_engine(MLFQ(within="mean"), max_num_seqs=1), reqs, est)
    order = lambda seqs: [s.id for s in sorted(seqs, key=lambda s: s.first_scheduled)]  # noqa: E731
    assert order(fifo) == ["r0", "r1", "r2", "r3"]
    assert order(sjf) == ["r0", "r3", "r2", "r1"]


def test_within_refuses_an_unknown_statistic():
    with pytest.raises(ValueError, match=r"^within: "):
        MLFQ(within="average")


def _seqs(*prompts):
    from presched.sim.seq import Seq
    from presched.workload.request import Request

    return [Seq(Request(id=f"s{i}", prompt_tokens=p, output_tokens=50, arrival=0.0), i)
            for i, p in enumerate(prompts)]  # fmt: skip


@pytest.mark.parametrize("tokens, level, used", [
    (2, 0, 3),    # usage 1 + 2 = 3 < quantum 4: stays
    (3, 1, 0),    # usage exactly 4 = the quantum: demoted (>=, not >), nothing carried over
    (4, 1, 1),    # one over: demoted, 1 carried
    (11, 2, 0),   # 1 + 11 = 12 = 4 + 8: exactly through two quanta at once
    (10, 1, 7),   # 11 = 4 + 7 < 4 + 8: one level only
])  # fmt: skip
def test_demotion_boundary_is_usage_reaching_the_quantum(tokens, level, used):
    # quanta 4, 8, 16, 32; s0's prompt (1 token) costs 1: level 0, usage 1. Demotions apply at
    # the next event (s1's arrival)
    pol = mlfq()
    s0, s1 = _seqs(1, 1)
    pol.on_arrival(s0, 0.0)
    pol.on_tokens(s0, tokens, 1.0)
    assert pol.level(s0) == 0  # not before an event
    pol.on_arrival(s1, 2.0)
    st = pol._state[id(s0)]
    assert (st.level, st.used) == (level, used)
    assert st.since == (2.0 if level else 0.0)  # entry time of the new level: the event


def test_the_last_level_never_demotes_and_a_prompt_at_a_quantum_joins_that_level():
    pol = mlfq()
    s0, s1, s2 = _seqs(32, 33, 1)  # cost 32 = quantum(3): level 3; 33: no quantum covers it
    pol.on_arrival(s0, 0.0)
    pol.on_arrival(s1, 0.0)
    assert (pol.level(s0), pol.level(s1)) == (3, 3)
    pol.on_tokens(s0, 1000, 1.0)
    pol.on_arrival(s2, 2.0)
    assert pol.level(s0) == 3 and not pol._due


def test_preemption_needs_a_strictly_lower_level_and_a_gap_above_the_cost():
    # recompute cost = recompute_weight * prompt_weight * (prompt + generated) of the victim;
    # quanta 4, 8, 16, 32: level gap 0 -> 1 is 4, 0 -> 2 is 12
    s_run, s_new = _seqs(5, 1)  # running at level 1 (cost 5), candidate at level 0
    for rw, want in ((0.0, True), (4 / 5, False), (3.9 / 5, True)):  # gap 4 vs cost 5 * rw
        pol = mlfq(preempt=True, recompute_weight=rw)
        pol.on_arrival(s_run, 0.0)
        pol.on_arrival(s_new, 0.0)
        assert (pol.preempt_for(s_new, [s_run], 0.0) is s_run) == want, rw
    pol = mlfq(preempt=True, recompute_weight=0.0)
    same, new = _seqs(1, 1)  # both at level 0: never, even at no cost
    pol.on_arrival(same, 0.0)
    pol.on_arrival(new, 0.0)
    assert pol.preempt_for(new, [same], 0.0) is None
