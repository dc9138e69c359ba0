"""The drift alarm on synthetic streams: quiet while calibrated, fast after a shift."""

from __future__ import annotations

import numpy as np
from scipy.stats import norm

from presched.predict.estimate import LEVELS
from presched.predict.online import DriftAlarm, pit

Z = norm.ppf(LEVELS)


def lognormal_q(median: float, sigma: float) -> np.ndarray:
    return median * np.exp(sigma * Z)


def test_pit_is_the_predicted_cdf():
    q = lognormal_q(100, 1.0)
    assert pit(q, q[LEVELS.index(0.5)]) == 0.5 and abs(pit(q, q[-1]) - 0.99) < 1e-12
    assert pit(q, 1.0) == 0.0 and 0.99 < pit(q, 10 * q[-1]) < 1.0


def run(alarm, ys, q):
    fired = []
    for i, y in enumerate(ys):
        if alarm.add(q, y, q[LEVELS.index(0.9)]):
            fired.append(i + 1)
    return fired


def test_quiet_while_calibrated_then_fast_after_a_shift():
    rng = np.random.default_rng(0)
    q = lognormal_q(100, 1.0)
    before = 100 * np.exp(rng.normal(0, 1.0, 3000))
    after = 300 * np.exp(rng.normal(0, 1.0, 500))  # answers 3x longer
    alarm = DriftAlarm()
    assert run(alarm, before, q) == []
    fired = run(alarm, after, q)
    assert fired and fired[0] <= 40
    assert 3000 - 5 <= alarm.changes[0] <= 3000 + fired[0]
    assert alarm.active and alarm.statistic < 1  # sums restart after an alarm


def test_shorter_answers_and_a_wider_spread_raise_it_too():
    rng = np.random.default_rng(1)
    q = lognormal_q(100, 1.0)
    assert run(DriftAlarm(), 30 * np.exp(rng.normal(0, 1.0, 300)), q)[0] <= 40
    # same median, twice the spread: the PIT mean holds, coverage of q90 drops to ~74 %
    fired = run(DriftAlarm(), 100 * np.exp(rng.normal(0, 2.0, 1000)), q)
    assert fired and fired[0] <= 250


def test_state_round_trip():
    rng = np.random.default_rng(2)
    q = lognormal_q(100, 1.0)
    a = DriftAlarm()
    run(a, 100 * np.exp(rng.normal(0.3, 1.0, 50)), q)
    b = DriftAlarm.from_state(a.state())
    ys = 100 * np.exp(rng.normal(1, 1.0, 100))
    assert run(a, ys, q) == run(b, ys, q) and a.state() == b.state()


def test_pit_starts_at_the_estimates_lower_bound():
    # an estimate given L > g (probe-refine: lower = g + 1) has no mass at or below g: its PIT
    # is 0 there and the mass below q10 lies on [lower, q10], not [1, q10]
    q = lognormal_q(300, 0.3)
    lower = 200.0
    assert pit(q, lower, lower) == 0.0 and pit(q, 150.0, lower) == 0.0
    mid = (lower + q[0]) / 2
    assert abs(pit(q, mid, lower) - LEVELS[0] / 2) < 1e-12
    assert pit(q, mid) > LEVELS[0] / 2  # from 1 token, more mass lay below mid
    assert pit(q, q[4], lower) == pit(q, q[4])  # above q10 nothing changes


def run_cut(alarm, ys, q, cuts):
    """`run` with each answer cut at its max_tokens: the cut ones go in censored."""
    fired = []
    for i, (y, c) in enumerate(zip(ys, cuts)):
        if alarm.add(q, min(y, c), q[LEVELS.index(0.9)], censored=y >= c):
            fired.append(i + 1)
    return fired


def test_censored_answers_count_with_what_their_bound_tells():
    """A calibrated stream with ~30 % of the answers cut by max_tokens: skipping the cut ones
    (the long ones) left only short answers and raised 18 false alarms in 6,000; counting their
    conditional means keeps it quiet and still catches answers 3x longer under the same cuts."""
    rng = np.random.default_rng(3)
    q = lognormal_q(100, 1.0)
    ys = 100 * np.exp(rng.normal(0, 1.0, 6000))
    cuts = rng.uniform(20, 400, 6000)
    assert np.mean(ys >= cuts) > 0.25
    alarm = DriftAlarm()
    assert run_cut(alarm, ys, q, cuts) == []
    assert abs(alarm.coverage - 0.9) < 0.06  # the expected coverage of the cut rows fills the window
    longer = 300 * np.exp(rng.normal(0, 1.0, 500))
    fired = run_cut(alarm, longer, q, rng.uniform(20, 400, 500))
    assert fired and fired[0] <= 60
    # the skipped version of the same stream does alarm (what this guards against)
    skip = DriftAlarm()
    assert any(skip.add(q, y, q[LEVELS.index(0.9)]) for y, c in zip(ys, cuts) if y < c)


def test_a_censored_row_past_the_levels_quantile_is_not_covered():
    q = lognormal_q(100, 1.0)
    a = DriftAlarm(window=2)
    a.add(q, q[LEVELS.index(0.9)] * 2, q[LEVELS.index(0.9)], censored=True)  # cut past q90: L > q90
    a.add(q, q[LEVELS.index(0.5)], q[LEVELS.index(0.9)], censored=True)  # cut at the median
    assert a.coverage == (0.0 + (0.9 - 0.5) / (1 - 0.5)) / 2


def test_a_stream_that_keeps_alarming_keeps_a_bounded_state():
    """Answers 30x longer than predicted alarm again after every reset: 6,000 of them raise
    hundreds of alarms; the lists keep the newest KEPT_ALARMS, `num_alarms` counts all, and a
    state saved before the count existed resumes with its list's length."""
    from presched.predict.online.drift import KEPT_ALARMS

    q = lognormal_q(100, 1.0)
    a = DriftAlarm()
    fired = run(a, np.full(6000, 3000.0), q)
    assert a.num_alarms == len(fired) > KEPT_ALARMS
    assert len(a.alarms) == len(a.changes) == KEPT_ALARMS and a.alarms[-1] == fired[-1]
    back = DriftAlarm.from_state(a.state())
    assert back.num_alarms == a.num_alarms and list(back.alarms) == list(a.alarms)
    old = a.state()
    del old["num_alarms"]
    assert DriftAlarm.from_state(old).num_alarms == KEPT_ALARMS
