"""slo: feasible requests first (shortest or least slack), infeasible ones after in arrival order.

With `constant_steps()` every step lasts 1 s: prefill = 1 s, tpot = 1 s, so a request of L tokens
started at s finishes at s + L (its prefill step samples the first token): service = L."""

from __future__ import annotations

from dataclasses import replace

import pytest
from builders import constant_steps, make_engine, make_estimates, make_requests, run_engine

from presched.schedule import POLICIES
from presched.schedule.interface import EngineInfo
from presched.sim.seq import Seq

# r0 (L 6) runs alone from t=0 to 6; r1..r4 wait. t* = arrival + slo_e2e - L:
#   r1 L 4, slo 8  -> t* 4.1 (infeasible at 6)   r2 L 2, slo 20 -> t* 18.2
#   r3 L 3, slo 12 -> t* 9.3                     r4 L 1, slo 2  -> t* 1.4 (infeasible at 6)
CASE = [(6, 100.0, 0.0), (4, 8.0, 0.1), (2, 20.0, 0.2), (3, 12.0, 0.3), (1, 2.0, 0.4)]


def case_requests():
    reqs = make_requests([(4, L) for L, _, _ in CASE], arrivals=[a for _, _, a in CASE])
    return [replace(r, slo_e2e=slo) for r, (_, slo, _) in zip(reqs, CASE)]


def run(policy):
    reqs = case_requests()
    est = make_estimates([r.output_tokens for r in reqs])
    seqs = run_engine(make_engine(policy, max_num_seqs=1), reqs, estimates=est)
    order = [s.id for s in sorted(seqs, key=lambda s: s.first_scheduled)]
    met = sum(s.finish - s.arrival <= s.request.slo_e2e for s in seqs)
    return order, met


def test_feasible_first_then_infeasible_in_arrival_order():
    # shortest feasible first: r2 (6->8), r3 (8->11, E2E 10.7 <= 12); then r1, r4 by arrival
    assert run(POLICIES.create("slo")) == (["r0", "r2", "r3", "r1", "r4"], 3)
    # least slack first: r3 (t* 9.3) before r2 (t* 18.2)
    assert run(POLICIES.create("slo", order="slack")) == (["r0", "r3", "r2", "r1", "r4"], 3)
    # FCFS meets 2 (r0, r2); SJF starts the hopeless r4 first
    assert run("fcfs") == (["r0", "r1", "r2", "r3", "r4"], 2)
    assert run("sjf")[0] == ["r0", "r4", "r2", "r3", "r1"]


def attached(**kw):
    kw.setdefault("stat", "median")  # = the value of a make_estimates row (its mean is a bit lower)
    pol = POLICIES.create("slo", **kw)
    pol.attach(EngineInfo(step_model=constant_steps(), max_num_seqs=1))
    return pol


def queued(pol, specs):
    """specs: (L, slo_e2e, arrival); returns the queue and the seqs pushed at their arrival."""
    reqs = make_requests([(4, L) for L, _, _ in specs], arrivals=[a for _, _, a in specs])
    est = make_estimates([L for L, _, _ in specs])
    q = pol.new_queue()
    seqs = []
    for i, (r, (_, slo, a)) in enumerate(zip(reqs, specs)):
        s = Seq(replace(r, slo_e2e=slo), i)
        s.estimate = est[i]
        q.push(s, a)
        seqs.append(s)
    return q, seqs


@pytest.mark.parametrize("order", ["shortest", "slack"])
def test_rekey_exactly_when_a_request_becomes_infeasible(order):
    # a: L 2, SLO 5 -> t* = 3; b: L 4, SLO 100 -> t* = 96. a leads until t = 3, then goes last.
    pol = attached(order=order)
    q, (a, b) = queued(pol, [(2, 5.0, 0.0), (4, 100.0, 0.0)])
    assert q.next_rekey() == 3.0  # known at push
    q.update(2.999)
    assert q.peek() is a
    q.update(3.0)
    assert q.peek() is b and q.next_rekey() == 96.0  # a has no timer left: it cannot recover
    assert pol.priority(a, 3.0) == float("inf")


def test_the_simulator_decides_at_the_rekey_time():
    # r0 (L 10) holds the slot; at t=0.5, a (L 2, SLO 5, t* 3.5) and b (L 3, SLO 100). The
    # fast-forwarded decode run of r0 ends at 3.5 (the re-key), but the slot only frees at 10:
    # a is infeasible by then, so b starts first.
    reqs = make_requests([(4, 10), (4, 2), (4, 3)], arrivals=[0.0, 0.5, 0.5])
    reqs = [replace(r, slo_e2e=s) for r, s in zip(reqs, (100.0, 5.0, 100.0))]
    est = make_estimates([10, 2, 3])
    inst = make_engine(attached(), max_num_seqs=1)
    _r0, a, b = run_engine(inst, reqs, estimates=est)
    assert b.first_scheduled == 10.0 and a.first_scheduled == 13.0
    f_inst = make_engine("fcfs", max_num_seqs=1)
    fcfs = run_engine(f_inst, reqs, estimates=est)
    assert fcfs[1].first_scheduled == 10.0
    assert inst.num_runs == f_inst.num_runs + 1  # r0's decode run was cut at the re-key time


def test_ttft_slo_and_defaults_and_step_model_times():
    pol = attached(ttft_slo_s=3.0)
    reqs = make_requests([(4, 10)], arrivals=[1.0])
    s = Seq(reqs[0], 0)
    s.estimate = make_estimates([10])[0]
    # TTFT: latest start 1 + 3 - 1 = 3 (the E2E term has no SLO)
    assert pol.plan(s, 1.0) == (3.0, 10.0)
    s.first_token, s.generated = 2.0, 4  # preempted after its first token: TTFT no longer binds
    assert pol.plan(s, 5.0)[0] == float("inf")
    bare = Seq(reqs[0], 0)
    bare.estimate = s.estimate
    with pytest.raises(ValueError, match="request 'r0' has no SLO.*'e2e_slo_s'"):
        attached().plan(bare, 0.0)
    pol2 = attached(e2e_slo_s=30.0, stat="point")
    # remaining predicted = max(10 - 4, 1) = 6 tokens: service = 1 + 5 = 6; t* = 1 + 30 - 6
    assert pol2.plan(s, 5.0) == (25.0, 6.0)
    # a request's own SLO wins over the default
    own = Seq(replace(reqs[0], slo_e2e=12.0), 1)
    own.estimate = s.estimate
    assert pol2.plan(own, 1.0)[0] == 1 + 12 - 10


def test_gateway_without_step_model_needs_tpot():
    with pytest.raises(ValueError, match="field 'tpot_s'"):
        POLICIES.create("slo").attach(EngineInfo())
    pol = POLICIES.create(
        "slo", tpot_s=0.05, prefill_s_per_token=1e-3, e2e_slo_s=10.0, stat="median"
    )
    pol.attach(EngineInfo())
    s = Seq(make_requests([(200, 41)], arrivals=[0.0])[0], 0)
    s.estimate = make_estimates([41])[0]
    t_star, service = pol.plan(s, 0.0)
    assert service == pytest.approx(0.2 + 40 * 0.05) and t_star == pytest.approx(10 - 2.2)


def test_tpot_from_the_step_model_at_a_typical_batch():
    from builders import linear_steps

    pol = POLICIES.create("slo", e2e_slo_s=10.0)
    pol.attach(EngineInfo(step_model=linear_steps(), max_num_seqs=64))
    # 32 decoding requests of 1024 tokens: 0.006 + 5e-8 * 32768 + 2e-5 * 32
    assert pol.tpot == pytest.approx(0.006 + 5e-8 * 32 * 1024 + 2e-5 * 32)


def test_bad_config_names_the_field():
    for kwargs, field in [
        ({"order": "edf"}, "order"), ({"stat": "q42"}, "stat"), ({"e2e_slo_s": 0}, "e2e_slo_s"),
        ({"ttft_slo_s": -1}, "ttft_slo_s"), ({"tpot_s": "fast"}, "tpot_s"),
        ({"prefill_s_per_token": 0}, "prefill_s_per_token"), ({"batch": 0}, "batch"),
        ({"context": 0}, "context"),
    ]:  # fmt: skip
        with pytest.raises(ValueError, match=rf"^{field}: "):
            POLICIES.create("slo", **kwargs)


def test_a_rank_score_is_no_length_stat_rank_is_refused():
    # the ranker's score (e.g. log length) read as tokens made a 2000-token request look
    # feasible for a 5 s SLO at 20 ms a token; hrrn and srpt refuse it the same way
    with pytest.raises(ValueError, match=r"^stat: "):
        POLICIES.create("slo", stat="rank", e2e_slo_s=5.0, tpot_s=0.02)
