"""`rank`: ranking order, starvation promotion at arrival + starvation_s, and its bound
(real engine instance, 1 s per step: a request with o output tokens is served in o steps)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from builders import make_engine, make_estimates, make_requests, run_engine
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from presched.schedule import POLICIES
from presched.schedule.rank import Rank


def starts(seqs):
    return {s.id: s.first_scheduled for s in seqs}


# r0 runs 0-9 alone; r1..r3 wait from t=0.1 with predicted lengths 6, 3, 1
LENGTHS = [(4, 9), (4, 6), (4, 3), (4, 1)]
ARRIVALS = [0.0, 0.1, 0.1, 0.1]
EST = make_estimates([9, 6, 3, 1])


def test_without_promotion_shortest_predicted_first():
    seqs = run_engine(make_engine(Rank(starvation_s=None), max_num_seqs=1),
                      make_requests(LENGTHS, ARRIVALS), EST)  # fmt: skip
    assert starts(seqs) == {"r0": 0.0, "r3": 9.0, "r2": 10.0, "r1": 13.0}


def test_promoted_requests_go_first_in_arrival_order():
    # at t=9 nobody is promoted (0.1 + 9.5 = 9.6): r3 (shortest) runs 9-10; at t=10 r1 and r2
    # are promoted and go FIFO: r1 before r2 although r2 is predicted shorter
    seqs = run_engine(make_engine(Rank(starvation_s=9.5), max_num_seqs=1),
                      make_requests(LENGTHS, ARRIVALS), EST)  # fmt: skip
    assert starts(seqs) == {"r0": 0.0, "r3": 9.0, "r1": 10.0, "r2": 16.0}
    assert [s.finish for s in seqs] == [9.0, 16.0, 19.0, 10.0]


def test_any_length_statistic_can_rank():
    # the point estimate says r1 is the shortest, the rank score (reversed) says r3
    est = make_estimates([9, 1, 3, 6])
    seqs = run_engine(make_engine(Rank(stat="point", starvation_s=None), max_num_seqs=1),
                      make_requests(LENGTHS, ARRIVALS), est)  # fmt: skip
    assert starts(seqs) == {"r0": 0.0, "r1": 9.0, "r2": 15.0, "r3": 18.0}


def adversarial_stream(n_short=40):
    """s0 at t=0 (2 tokens); the long request L (10 tokens) at t=0.1; then one short (2 tokens,
    predicted shorter than L) every second: twice what one slot serves, so the queue only grows."""
    lengths = [(4, 2), (4, 10)] + [(4, 2)] * n_short
    arrivals = [0.0, 0.1] + [float(k) for k in range(1, n_short + 1)]
    return make_requests(lengths, arrivals), make_estimates([o for _, o in lengths])


def test_starvation_bound_under_a_stream_of_shorter_requests():
    reqs, est = adversarial_stream()
    seqs = run_engine(make_engine(Rank(starvation_s=5.0), max_num_seqs=1), reqs, est)
    long = seqs[1]
    # promoted at 5.1 while s2 runs (4-6); it starts when the slot frees
    assert long.first_scheduled <= 0.1 + 5.0 + 2.0  # arrival + starvation_s + one service time
    assert long.first_scheduled == 6.0
    assert all(s.generated == s.target for s in seqs)


@pytest.mark.parametrize("policy", [Rank(starvation_s=None), "sjf-oracle", "sjf"])
def test_without_promotion_the_long_request_starves(policy):
    reqs, est = adversarial_stream()
    seqs = run_engine(make_engine(policy, max_num_seqs=1), reqs, est)
    assert seqs[1].first_scheduled >= 40.0  # not before the stream of short requests ends
    assert seqs[1].first_scheduled == max(s.first_scheduled for s in seqs)


def test_kv_victim_is_the_largest_key():
    pol = Rank(stat="point", starvation_s=10.0)
    est = make_estimates([50, 5, 500, 1])
    old_long, young_short, young_long, old = (
        SimpleNamespace(arrival=a, generated=0, estimate=est[i], request=None)
        for i, a in enumerate([0.0, 8.0, 9.0, 1.0]))  # fmt: skip
    # at t=12: old_long and old are promoted (protected); among the others the longest goes
    assert pol.victim([old_long, young_short, young_long, old], now=12.0) is young_long
    # all promoted: the latest arrival goes
    assert pol.victim([old_long, old], now=12.0) is old


def test_bad_config_names_the_field():
    bad = [({"starvation_s": -1}, "starvation_s"), ({"starvation_s": "10"}, "starvation_s"),
           ({"stat": "q42"}, "stat")]  # fmt: skip
    for params, field in bad:
        with pytest.raises(ValueError, match=rf"^{field}: "):
            POLICIES.create("rank", **params)


def test_needs_a_prediction():
    with pytest.raises(ValueError, match="has no length prediction"):
        run_engine(make_engine("rank", max_num_seqs=1), make_requests(LENGTHS, ARRIVALS))


def streams(prompt: int, output: int):
    """(prompt, output, gap to the previous arrival, prediction unrelated to the output)."""
    return st.lists(st.tuples(st.integers(1, prompt), st.integers(1, output), st.floats(0, 3),
                              st.floats(1, 50)), min_size=1, max_size=25)  # fmt: skip


def build(stream):
    t, arrivals = 0.0, []
    for _, _, gap, _ in stream:
        t += gap
        arrivals.append(t)
    reqs = make_requests([(p, o) for p, o, _, _ in stream], arrivals)
    return reqs, make_estimates([e for *_, e in stream])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=streams(300, 12), starvation=st.floats(0, 20))
def test_property_one_slot_wait_bound(stream, starvation):
    """One slot, no memory pressure. Once X is promoted (arrival + S) only older requests may
    start before it, so, with T the longest service time,
    first_scheduled(X) <= a_X + S + T * (1 + #{older Y not started at a_X + S})."""
    reqs, est = build(stream)
    seqs = run_engine(make_engine(Rank(starvation_s=starvation), max_num_seqs=1), reqs, est)
    T = max(s.finish - s.first_scheduled for s in seqs)
    for x in seqs:
        promo = x.arrival + starvation
        ahead = [y for y in seqs if (y.arrival, y.index) < (x.arrival, x.index)
                 and y.first_scheduled >= promo]  # fmt: skip
        assert x.first_scheduled <= promo + T * (1 + len(ahead)) + 1e-9
        for y in seqs:  # no younger request starts in [a_X + S, first_scheduled(X))
            assert not (y.arrival > x.arrival and promo <= y.first_scheduled < x.first_scheduled)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=streams(100, 60), starvation=st.floats(0, 20), slots=st.integers(2, 6),
       blocks=st.integers(40, 100))  # fmt: skip
def test_property_tight_memory_exact_and_complete(stream, starvation, slots, blocks):
    """Under KV pressure (preemptions): every request finishes once with its length, no younger
    request overtakes a promoted one, and fast-forward gives the step-by-step timelines."""
    reqs, est = build(stream)
    runs = []
    for ff in (True, False):
        eng = make_engine(Rank(starvation_s=starvation), num_blocks=blocks, block_size=4,
                          max_num_seqs=slots, fast_forward=ff)  # fmt: skip
        seqs = run_engine(eng, reqs, est)
        assert all(s.generated == s.target for s in seqs) and len(eng.finished) == len(seqs)
        runs.append([v for s in seqs for v in (s.first_scheduled, s.finish, s.preemptions)])
        for x in seqs:
            promo = x.arrival + starvation
            assert not any(y.arrival > x.arrival and promo <= y.first_scheduled < x.first_scheduled
                           for y in seqs)  # fmt: skip
    assert runs[0] == pytest.approx(runs[1])
