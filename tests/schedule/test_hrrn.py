"""`hrrn`: highest response ratio (wait + S) / S first, on predicted lengths (real engine
instance, 1 s per step: a request with o output tokens is served in o steps)."""

from __future__ import annotations

import math

import pytest
from builders import make_engine, make_estimates, make_requests, run_engine
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from presched.schedule import POLICIES
from presched.schedule.hrrn import HRRN
from presched.sim.seq import Seq


def starts(seqs):
    return {s.id: s.first_scheduled for s in seqs}


def case(first_len):
    """r0 runs alone from t=0 for `first_len` s; A (4 tokens) waits from t=1, B (1 token) from
    t=5. Ratios - 1: A (t - 1) / 4, B (t - 5) / 1; they cross at t = 19/3."""
    reqs = make_requests([(4, first_len), (4, 4), (4, 1)], [0.0, 1.0, 5.0])
    est = make_estimates([first_len, 4, 1])
    return run_engine(make_engine(HRRN(stat="median"), max_num_seqs=1), reqs, est)


def test_the_order_depends_on_when_the_decision_is_taken():
    # at t=6: A 5/4 = 1.25 > B 1/1 = 1 -> A first (like FCFS)
    assert starts(case(6)) == {"r0": 0.0, "r1": 6.0, "r2": 10.0}
    # at t=7: A 6/4 = 1.5 < B 2/1 = 2 -> B first (like SJF)
    assert starts(case(7)) == {"r0": 0.0, "r2": 7.0, "r1": 8.0}


def test_wakeup_is_the_next_time_the_head_is_overtaken():
    pol = HRRN(stat="median")
    reqs = make_requests([(4, 4), (4, 1), (4, 9)], [1.0, 5.0, 5.5])
    seqs = [Seq(r, i) for i, r in enumerate(reqs)]
    est = make_estimates([4, 1, 9])
    for s in seqs:
        s.estimate = est[s.index]
    assert pol.wakeup(5.5) is None  # nobody waiting
    for s in seqs:
        pol.on_arrival(s, s.arrival)
    # head at 5.5: A (1.125); B overtakes at 19/3; C (S=9) never overtakes A
    assert pol.wakeup(5.5) == pytest.approx(19 / 3)
    assert pol.wakeup(7.0) is None  # B is the head now and has the smallest S
    pol.on_schedule(seqs[1], 7.0)  # B leaves the queue: A is the head again, C never passes it
    assert pol.wakeup(7.0) is None


def test_a_steeper_request_tied_with_the_head_at_a_step_start_overtakes_at_the_next_step():
    # r0 runs from t=0 (1 s steps at 0, 1, 2, ...); H (85-token prompt: no room beside r0) waits
    # from 0.25 with S = 20, Y (fits) from 1.125 with S = 10: their ratios tie at t = 2.0, a step
    # start, and H wins the tie by arrival; Y overtakes right after and starts at t = 3. wakeup(2)
    # skipped that crossing (it took only crossings after `now`), so fast-forward ran to r0's end
    reqs = make_requests([(30, 30), (85, 10), (5, 10)], arrivals=[0.0, 0.25, 1.125])
    est = make_estimates([30.0, 20.0, 10.0])
    runs = []
    for ff in (True, False):
        eng = make_engine(HRRN(stat="median"), num_blocks=100, fast_forward=ff, max_num_seqs=4,
                          block_size=1)  # fmt: skip
        runs.append([(s.first_scheduled, s.finish) for s in run_engine(eng, reqs, est)])
    assert runs[0] == runs[1] == [(0.0, 30.0), (30.0, 40.0), (3.0, 13.0)]
    pol = HRRN(stat="median")
    seqs = [Seq(r, i) for i, r in enumerate(reqs)]
    for s in seqs[1:]:
        s.estimate = est[s.index]
        pol.on_arrival(s, s.arrival)
    assert pol.wakeup(1.5) == 2.0
    assert pol.wakeup(2.0) == math.nextafter(2.0, math.inf)


def test_is_dynamic_and_kv_victim_has_the_lowest_ratio():
    pol = HRRN(stat="median")
    assert pol.dynamic
    reqs = make_requests([(4, 4), (4, 40)], [0.0, 0.0])
    a, b = (Seq(r, i) for i, r in enumerate(reqs))
    est = make_estimates([4, 40])
    a.estimate, b.estimate = est[0], est[1]
    assert pol.victim([a, b], now=10.0) is b  # 10/40 < 10/4


def test_bad_config_names_the_field():
    for stat in ("rank", "q42"):
        with pytest.raises(ValueError, match=r"^stat: "):
            POLICIES.create("hrrn", stat=stat)


streams = st.lists(st.tuples(st.integers(1, 100), st.integers(1, 40), st.floats(0, 3),
                             st.floats(1, 50)), min_size=1, max_size=20)  # fmt: skip


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=streams, slots=st.integers(1, 6), blocks=st.integers(36, 100),
       chunked=st.booleans())  # fmt: skip
def test_property_complete_and_fast_forward_exact(stream, slots, blocks, chunked):
    """KV pressure, a small token budget: the head of the queue matters (a smaller prompt may fit
    where the head does not). Fast-forward ends decode runs at `wakeup`, so timelines match the
    step-by-step run; every request finishes once with its length."""
    t, arrivals = 0.0, []
    for *_, gap, _ in stream:
        t += gap
        arrivals.append(t)
    reqs = make_requests([(p, o) for p, o, _, _ in stream], arrivals)
    est = make_estimates([e for *_, e in stream])
    runs = []
    for ff in (True, False):
        eng = make_engine(HRRN(), num_blocks=blocks, block_size=4, max_num_seqs=slots,
                          max_num_batched_tokens=128, enable_chunked_prefill=chunked,
                          fast_forward=ff)  # fmt: skip
        seqs = run_engine(eng, reqs, est)
        assert all(s.generated == s.target for s in seqs) and len(eng.finished) == len(seqs)
        runs.append([v for s in seqs for v in (s.first_scheduled, s.finish, s.preemptions)])
    assert runs[0] == pytest.approx(runs[1])
