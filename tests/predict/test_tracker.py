"""ErrorTracker: rolling prediction-error metrics, checked against scipy and brute force."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import kendalltau

from presched.predict.estimate import RequestEstimate
from presched.predict.tracker import ErrorTracker


def est(point: float, score: float | None = None, spread: float = 0.0) -> RequestEstimate:
    q = np.array([point * math.exp(spread * z) for z in (-1.28, -0.84, -0.52, -0.25, 0, 0.25,
                                                        0.52, 0.84, 1.28, 1.64, 2.33)])  # fmt: skip
    return RequestEstimate(q, float(point), float(point if score is None else score))


def brute_discordance(scores, trues):
    c = d = 0
    for i in range(len(scores)):
        for j in range(i + 1, len(scores)):
            s = np.sign(scores[i] - scores[j]) * np.sign(trues[i] - trues[j])
            c += s > 0
            d += s < 0
    return d / (c + d) if c + d else math.nan


pairs = st.lists(
    st.tuples(st.integers(1, 8), st.integers(1, 8)), min_size=0, max_size=40
)  # small ranges: many ties


@settings(max_examples=150, deadline=None)
@given(pairs, st.integers(2, 12))
def test_tau_and_discordance_match_scipy_and_brute_force_over_the_window(data, window):
    t = ErrorTracker(window=window)
    for k, (score, true) in enumerate(data):
        t.add(est(score), true)
        live = data[max(0, k + 1 - window) : k + 1]
        s = np.array([p for p, _ in live], float)
        y = np.array([v for _, v in live], float)
        assert t.n == len(live)
        ref_tau = kendalltau(s, y).statistic if len(live) > 1 else math.nan
        if math.isnan(ref_tau):
            assert math.isnan(t.kendall_tau)
        else:
            assert t.kendall_tau == pytest.approx(ref_tau, abs=1e-12)
        ref_d = brute_discordance(s, y)
        assert (math.isnan(ref_d) and math.isnan(t.discordance)) or t.discordance == pytest.approx(
            ref_d
        )
        assert t.mae == pytest.approx(np.mean(np.abs(s - y)))
        assert t.rel_mae == pytest.approx(np.mean(np.abs(s - y)) / np.mean(y))


def test_discordance_is_one_minus_tau_over_two_without_ties_and_extremes():
    t = ErrorTracker(window=50)
    for v in range(1, 21):
        t.add(est(v), v)  # perfect order
    assert t.kendall_tau == 1.0 and t.discordance == 0.0
    r = ErrorTracker(window=50)
    for v in range(1, 21):
        r.add(est(21 - v), v)  # reversed
    assert r.kendall_tau == -1.0 and r.discordance == 1.0
    rng = np.random.default_rng(3)
    m = ErrorTracker(window=30)
    for s, y in zip(rng.permutation(30), rng.permutation(30)):
        m.add(est(float(s) + 1), float(y) + 1)
    assert m.discordance == pytest.approx((1 - m.kendall_tau) / 2)


def test_window_evicts_the_oldest_pairs():
    t = ErrorTracker(window=5)
    for v in range(1, 6):
        t.add(est(v), 6 - v)  # 5 reversed pairs
    assert t.discordance == 1.0 and t.total == 5
    for v in range(10, 15):
        t.add(est(v), v)  # 5 good pairs push the reversed ones out
    assert t.n == 5 and t.total == 10
    assert t.discordance == 0.0 and t.mae == 0.0
    t.add(est(100), 1)  # one bad pair: 4 of the 10 pairs involve it, all discordant
    assert t.discordance == pytest.approx(4 / 10)


def test_coverage_counts_true_lengths_below_the_predicted_quantile():
    t = ErrorTracker(window=10, levels=(0.9,))
    # median 100, spread 0.5: q90 = 100 * e^(0.5 * 1.28) ~ 190, q50 = 100
    for y in (50, 80, 99, 150, 180, 250, 400, 100, 120, 60):
        t.add(est(100, spread=0.5), y)
    q90 = est(100, spread=0.5).quantile(0.9)
    assert q90 == pytest.approx(100 * math.exp(0.64))
    assert t.coverage(0.9) == pytest.approx(8 / 10)  # 250 and 400 exceed q90
    assert t.coverage(0.5) == pytest.approx(5 / 10)  # computed on demand: 50, 80, 99, 100, 60
    assert t.coverage_error(0.9) == pytest.approx(0.1)


def test_empty_tracker_gives_nan_without_crashing():
    t = ErrorTracker()
    snap = t.snapshot()
    assert snap["samples"] == 0
    for k in (
        "mae_tokens",
        "rel_mae",
        "kendall_tau",
        "discordance",
        "coverage_q50",
        "coverage_q90",
    ):
        assert math.isnan(snap[k]), k
    assert math.isnan(t.coverage(0.7))
    t.add(est(5), 5)  # one pair: no comparable pairs yet
    assert math.isnan(t.kendall_tau) and math.isnan(t.discordance) and t.mae == 0.0


def test_add_is_linear_in_the_window_not_quadratic():
    import time

    def per_add(window):
        t = ErrorTracker(window=window)
        rng = np.random.default_rng(0)
        es = [est(float(v)) for v in rng.integers(1, 1000, 3 * window)]
        ys = rng.integers(1, 1000, 3 * window)
        for e, y in zip(es[:window], ys[:window]):
            t.add(e, y)
        t0 = time.perf_counter()
        for e, y in zip(es[window:], ys[window:]):
            t.add(e, y)
        return (time.perf_counter() - t0) / (2 * window)

    # A ratio of two runs on the same machine, not a speed: a 16x longer window costs at most
    # 16x per add when add is linear in the window (measured ~1.5x: the constant dominates),
    # 256x when quadratic (~1.6e7 pair checks per add at 4000). A slow machine slows both.
    assert per_add(4000) < 40 * per_add(250)


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match="field 'window'"):
        ErrorTracker(window=1)
    with pytest.raises(ValueError, match="field 'levels'"):
        ErrorTracker(levels=(1.5,))
