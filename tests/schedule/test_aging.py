"""`aging`: static key stat + rate * arrival; its starvation bound (real engine instance, 1 s per
step: a request with o output tokens is served in o steps)."""

from __future__ import annotations

import pytest
from builders import make_engine, make_estimates, make_requests, run_engine
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schedule.test_rank import build, streams

from presched.schedule import POLICIES
from presched.schedule.aging import Aging
from presched.sim.seq import Seq


def starts(seqs):
    return {s.id: s.first_scheduled for s in seqs}


def test_rate_trades_length_against_waiting_time():
    # r0 runs 0-9; r1 (predicted 9 tokens) arrives at 0.1, r2 (1 token) at 5.0.
    # keys at rate 1: r1 9 + 0.1 = 9.1, r2 1 + 5 = 6 -> r2 first; at rate 3: 9.3 vs 16 -> r1 first
    reqs = make_requests([(4, 9), (4, 9), (4, 1)], [0.0, 0.1, 5.0])
    est = make_estimates([9, 9, 1])

    def run(rate):
        return starts(run_engine(make_engine(Aging(rate=rate, stat="median"), max_num_seqs=1), reqs, est))

    assert run(1) == {"r0": 0.0, "r2": 9.0, "r1": 10.0}
    assert run(3) == {"r0": 0.0, "r1": 9.0, "r2": 18.0}


def test_key_is_static_no_rekeying():
    pol = Aging(rate=2.0, stat="median")
    assert not pol.dynamic and type(pol).rekey_at is POLICIES.get("fcfs").rekey_at
    seq = Seq(make_requests([(4, 5)], [3.0])[0], 0)
    seq.estimate = make_estimates([7])[0]
    assert pol.priority(seq, now=3.0) == pol.priority(seq, now=100.0) == 7 + 2 * 3.0


def adversarial_stream(n_short=40):
    """s0 at t=0 (2 tokens); the long request L (10 tokens) at t=0.1; then one short (2 tokens)
    every second: twice what one slot serves."""
    lengths = [(4, 2), (4, 10)] + [(4, 2)] * n_short
    arrivals = [0.0, 0.1] + [float(k) for k in range(1, n_short + 1)]
    return make_requests(lengths, arrivals), make_estimates([o for _, o in lengths])


def test_starvation_bound_under_a_stream_of_shorter_requests():
    # rate 1 token/s: tau_L = 0.1 + (10 - 1) / 1 = 9.1. Shorts k with 2 + k < 10.1 (k <= 8)
    # overtake L; every later one queues behind it. One slot, T = 2 s per short:
    # start(L) <= a_L + T * (1 + #{shorts arriving before tau_L}) = 0.1 + 2 * (1 + 9) = 20.1
    reqs, est = adversarial_stream()
    seqs = run_engine(make_engine(Aging(rate=1.0, stat="median"), max_num_seqs=1), reqs, est)
    long = seqs[1]
    assert long.first_scheduled <= 0.1 + 2 * (1 + 9)
    assert long.first_scheduled == 18.0  # s0, then s1..s8 (2 s each), then L
    assert all(s.first_scheduled > long.first_scheduled for s in seqs[10:])  # s9.. behind it


def test_rate_zero_is_shortest_predicted_first_and_starves():
    reqs, est = adversarial_stream()
    seqs = run_engine(make_engine(Aging(rate=0.0, stat="median"), max_num_seqs=1), reqs, est)
    assert seqs[1].first_scheduled >= 40.0
    assert seqs[1].first_scheduled == max(s.first_scheduled for s in seqs)


def test_bad_config_names_the_field():
    for params, field in (({"rate": -1}, "rate"), ({"rate": float("inf")}, "rate"),
                          ({"rate": "fast"}, "rate"), ({"stat": "q42"}, "stat")):  # fmt: skip
        with pytest.raises(ValueError, match=rf"^{field}: "):
            POLICIES.create("aging", **params)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=streams(100, 60), rate=st.floats(0.1, 20), slots=st.integers(1, 6),
       blocks=st.integers(40, 100))  # fmt: skip
def test_property_nothing_arriving_after_tau_overtakes(stream, rate, slots, blocks):
    """The bound's core, under any engine shape and KV pressure: a request arriving after
    tau_X = a_X + (s_X - 1) / rate never starts before X. With one slot, also
    start(X) <= a_X + T * (1 + #{Y arriving before tau_X, not started by a_X}).
    Every request finishes once; fast-forward gives the step-by-step timelines."""
    reqs, est = build(stream)
    runs = []
    for ff in (True, False):
        eng = make_engine(Aging(rate=rate), num_blocks=blocks, block_size=4, max_num_seqs=slots,
                          fast_forward=ff)  # fmt: skip
        seqs = run_engine(eng, reqs, est)
        assert all(s.generated == s.target for s in seqs) and len(eng.finished) == len(seqs)
        runs.append([v for s in seqs for v in (s.first_scheduled, s.finish, s.preemptions)])
        T = max(s.finish - s.first_scheduled for s in seqs)
        for x in seqs:
            tau = x.arrival + (est[x.index].mean - 1) / rate
            assert not any(y.arrival > tau and y.first_scheduled < x.first_scheduled for y in seqs)
            if slots == 1 and not any(s.preemptions for s in seqs):
                n = sum(y is not x and y.arrival < tau and y.first_scheduled >= x.arrival
                        for y in seqs)  # fmt: skip
                assert x.first_scheduled <= x.arrival + T * (1 + n) + 1e-9
    assert runs[0] == pytest.approx(runs[1])
