"""fallback reads the online learner's drift alarm (`EngineInfo.drift_alarm`): while it is raised
the conservative order runs, when it clears the predictive one returns.

The simulator runs no learner, so its `EngineInfo` has no alarm; here the policy is attached
again with an alarm that reads the simulated instance's own completion count (raised from the
5th completion to the 10th), standing in for the gateway's learner (tests/serve/
test_gateway_learn.py raises a real one over HTTP)."""

from __future__ import annotations

from builders import make_engine, make_estimates, make_requests, queued, run_engine

from presched.schedule import POLICIES
from presched.schedule.interface import EngineInfo

BURST = [9, 3, 6, 1]  # queued behind a 20-token head; sjf runs them 1, 3, 6, 9


def three_bursts():
    lengths, arrivals = [], []
    for b in range(3):  # each burst ends before the next arrives: completions 1-5, 6-10, 11-15
        for j, o in enumerate([20, *BURST]):
            lengths.append((4, o))
            arrivals.append(200.0 * b + 0.1 * j)
    reqs = make_requests(lengths, arrivals=arrivals)
    return reqs, make_estimates([r.output_tokens for r in reqs])  # exact: the tracker stays calm


def run(alarm_between=(5, 10), **params):
    reqs, est = three_bursts()
    pol = POLICIES.create("fallback", inner="sjf", min_samples=50, window=50, **params)
    inst = make_engine(pol, max_num_seqs=1)
    lo, hi = alarm_between
    pol.attach(EngineInfo(max_num_seqs=1, drift_alarm=lambda: lo <= len(inst.finished) < hi))
    seqs = run_engine(inst, reqs, estimates=est)

    def order(b):
        burst = seqs[5 * b + 1 : 5 * b + 5]
        return [s.target for s in sorted(burst, key=lambda s: s.first_scheduled)]

    return pol, [order(b) for b in range(3)]


def test_the_alarm_switches_to_the_conservative_order_and_back():
    pol, orders = run()
    assert orders[0] == [1, 3, 6, 9]  # no alarm: sjf on the predictions
    assert orders[1] == BURST  # alarm raised: fcfs, arrival order
    assert orders[2] == [1, 3, 6, 9]  # cleared: sjf again
    assert [m for _, _, m in pol.switches] == ["conservative", "predictive"]
    assert pol.tracked == "predictive"  # the tracker never objected: the alarm did it


def test_drift_alarm_false_ignores_it():
    pol, orders = run(drift_alarm=False)
    assert orders == [[1, 3, 6, 9]] * 3 and pol.switches == []


def test_the_alarm_and_the_tracker_combine():
    # the tracker says conservative: the alarm clearing does not bring sjf back
    pol = POLICIES.create("fallback", inner="sjf", min_samples=2, window=2)
    raised = [True]
    pol.attach(EngineInfo(drift_alarm=lambda: raised[0]))
    q, seqs = queued(pol, [9, 3, 6], 3.0)
    assert pol.mode == "conservative" and q.peek() is seqs[0]  # alarm: arrival order
    raised[0] = False
    q.update(3.0)
    assert pol.mode == "predictive" and q.peek() is seqs[1]  # cleared: shortest prediction
    pol.tracked = "conservative"  # as the hysteresis rule would set it on bad predictions
    raised[0] = True
    q.update(3.0)
    raised[0] = False
    q.update(3.0)
    assert pol.mode == "conservative" and q.peek() is seqs[0]
