from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from presched.predict import LEVELS, LengthEstimate

L = np.asarray(LEVELS)


def exp_estimate(mean: float, n: int = 1) -> LengthEstimate:
    """Exact quantiles of 1 + Exp(mean - 1), a distribution with a known closed form."""
    q = 1 + (mean - 1) * -np.log(1 - L)
    return LengthEstimate.from_quantiles(np.tile(q, (n, 1)))


def test_construction_enforces_monotone_quantiles_and_at_least_one_token():
    est = LengthEstimate.from_quantiles(np.array([[5, 3, 4, 10, 9, 20, 30, 40, 50, 60, 0.2]], float) * 1)
    assert np.all(np.diff(est.quantiles[0]) >= 0) and est.quantiles.min() >= 1
    with pytest.raises(ValueError, match="quantiles: expected shape"):
        LengthEstimate(np.ones((2, 3)), np.ones(2), np.ones(2))
    with pytest.raises(ValueError, match="finite"):
        LengthEstimate.from_quantiles(np.full((1, len(LEVELS)), np.nan))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_rank_score_that_is_not_finite_is_refused_naming_it(bad):
    # a NaN key breaks the heap order of `rank` and `sjf stat=rank` for every request
    q = np.full((2, len(LEVELS)), 50.0)
    with pytest.raises(ValueError, match="rank_score must be finite"):
        LengthEstimate(q, np.full(2, 50.0), np.array([1.0, bad]))


def test_survival_and_quantile_invert_each_other_at_the_knots():
    est = exp_estimate(200.0)
    for p, q in zip(LEVELS, est.quantiles[0]):
        assert est.survival(q)[0] == pytest.approx(1 - p, abs=1e-9)
        assert est.quantile(p)[0] == pytest.approx(q)
    assert est.survival(0.5)[0] == 1.0
    assert est.quantile(0.999)[0] > est.quantiles[0, -1]  # exponential tail past q99


def test_mean_remaining_of_an_exponential_is_memoryless():
    # Exp tail: E[L - g | L > g] ~ mean - 1 for any g; the piecewise-linear body approximates it
    est = exp_estimate(300.0)
    m0 = est.mean_remaining(0)[0]
    assert m0 == pytest.approx(300.0, rel=0.05)  # E[L] = 300
    for g in (100, 400, 1500, 5000):
        assert est.mean_remaining(g)[0] == pytest.approx(299.0, rel=0.12)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(1, 5000), min_size=len(LEVELS), max_size=len(LEVELS)),
       st.floats(0, 8000))  # fmt: skip
def test_survival_is_a_valid_tail_function(qs, x):
    est = LengthEstimate.from_quantiles(np.array([sorted(qs)]))
    s = est.survival(x)[0]
    assert 0 <= s <= 1
    assert est.survival(x + 10)[0] <= s + 1e-12
    assert est.mean_remaining(x)[0] > 0


def test_rows_and_views():
    a, b = exp_estimate(100.0), exp_estimate(900.0)
    both = LengthEstimate.concat([a, b])
    assert len(both) == 2 and both[1].point > both[0].point
    one = both[1]
    assert one.quantile(0.5) == pytest.approx(both.quantile(0.5)[1])
    assert one.survival(500) == pytest.approx(both.survival(500)[1])
    assert one.mean_remaining(50) == pytest.approx(both.mean_remaining(50)[1])


@given(st.lists(st.floats(2, 500), min_size=11, max_size=11), st.floats(0, 3000))
def test_mean_remaining_matches_numeric_integration(steps, g):
    """The closed form against the definition, integral of S from g / S(g), on a grid (knots
    kept apart so the trapezoid rule sees no jumps)."""
    est = LengthEstimate.from_quantiles(np.array([np.cumsum(steps)]))[0]
    s_g = est.survival(g)
    if s_g < 1e-6:
        return
    xs = np.linspace(g, est.quantile(0.9999999) + 50 * est.dist.tail, 400001)
    sv = np.array([est.survival(x) for x in xs[::50]])
    num = np.trapezoid(sv, xs[::50]) / s_g
    assert est.mean_remaining(g) == pytest.approx(num, rel=0.02, abs=1.0)


def test_gittins_of_a_known_length_is_srpt():
    est = LengthEstimate.from_quantiles(np.full((1, len(LEVELS)), 100.0))[0]
    # the knots put 10 % of the mass on [1, 100] and the rest at 100: near-deterministic
    assert 1 / est.gittins(99.0) == pytest.approx(1.0, abs=0.02)
    assert 1 / est.gittins(50.0) == pytest.approx(50.0, rel=0.1)
    assert est.quantile_remaining(30, 0.5) == 70


def test_gittins_prefers_a_likely_short_job_over_a_longer_mean():
    # a: usually 10 tokens, sometimes 2000 (heavy tail); b: always about 200 tokens
    a = LengthEstimate.from_quantiles(np.array([[5, 6, 7, 8, 10, 12, 15, 20, 1500, 1800, 2000.0]]))[0]
    b = LengthEstimate.from_quantiles(np.full((1, len(LEVELS)), 200.0))[0]
    assert a.mean > b.mean * 0.9  # a's mean is not much shorter ...
    assert a.gittins(0) > b.gittins(0)  # ... but its index says: try it first
    # once a has run past its short mode without finishing, it drops behind b
    assert a.gittins(25) < b.gittins(0)


def test_gittins_is_at_least_the_inverse_mean_remaining():
    est = LengthEstimate.from_quantiles(np.array([[20, 40, 60, 80, 100, 130, 170, 220, 300, 400, 700.0]]))[0]
    for g in (0, 50, 150, 400, 1000):
        assert est.gittins(g) >= 1 / est.mean_remaining(g) - 1e-12


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(1, 500), min_size=len(LEVELS), max_size=len(LEVELS)), st.floats(0, 20000))
def test_quantile_remaining_is_at_least_one_token_and_monotone_in_p(qs, g):
    # also once g is far past the predicted support (S(g) ~ 0: a request that outlived its
    # estimate), where the tail's own quantile is read
    est = LengthEstimate.from_quantiles(np.array([np.cumsum(qs)]))[0]
    rem = [est.quantile_remaining(g, p) for p in (0.0, *LEVELS)]
    assert min(rem) >= 1.0
    assert all(b >= a - 1e-9 for a, b in zip(rem, rem[1:]))


def test_quantile_remaining_beyond_the_support_is_the_tails():
    est = LengthEstimate.from_quantiles(np.full((1, len(LEVELS)), 100.0))[0]  # predicted at 100
    assert est.survival(150.0) < 1e-12  # still running at 150
    assert [est.quantile_remaining(150.0, p) for p in (0.0, 0.1, 0.5, 0.6)] == [1.0, 1.0, 1.0, 1.0]
    wide = LengthEstimate.from_quantiles(np.array([[5, 6, 7, 8, 10, 12, 15, 20, 30, 40, 80.0]]))[0]
    tail = wide.dist.tail  # (80 - 40) / ln 5
    assert wide.survival(5000.0) < 1e-12
    assert wide.quantile_remaining(5000.0, 0.9) == pytest.approx(tail * np.log(10))
    assert wide.quantile_remaining(5000.0, 0.01) == 1.0


REM = np.array([[3, 5, 8, 12, 17, 23, 31, 42, 60, 80, 140.0]])  # a remaining-length distribution


@pytest.mark.parametrize("g", [16.0, 64.0, 256.0])
def test_a_lower_bound_of_g_plus_1_is_the_remaining_distribution_shifted_by_g(g):
    # an estimate of the total length given L > g (probe-refine's): no mass at L <= g, and every
    # statistic of L - g | L > g is the remaining-length distribution's own (whose support
    # starts at 1 token), as if it had been predicted at g = 0
    total = LengthEstimate.from_quantiles(REM + g, lower=np.array([g + 1]))[0]
    rem = LengthEstimate.from_quantiles(REM)[0]
    assert total.lower == g + 1 and total.survival(g) == 1.0 and total.survival(g + 1) == 1.0
    assert total.quantile(0.0) == g + 1
    assert total.mean_remaining(g) == pytest.approx(rem.mean, rel=1e-12)
    assert total.mean == pytest.approx(g + rem.mean, rel=1e-12)
    for p in (0.05, *LEVELS, 0.995):
        assert total.quantile_remaining(g, p) == pytest.approx(rem.quantile(p), rel=1e-12)
        assert total.survival(g + rem.quantile(p)) == pytest.approx(1 - p, abs=1e-12)
    assert total.gittins(g) == pytest.approx(rem.gittins(0.0), rel=1e-12)
    # without it the CDF starts at 1 token: ~10 % of the mass at L <= g
    assert LengthEstimate.from_quantiles(REM + g)[0].survival(g) < 0.95


def test_lower_is_kept_by_rows_concat_and_the_batch_methods_and_raises_the_quantiles():
    a = LengthEstimate.from_quantiles(REM + 64, lower=np.array([65.0]))
    b = exp_estimate(300.0)  # lower 1 by default
    both = LengthEstimate.concat([a, b])
    np.testing.assert_array_equal(both.lower, [65.0, 1.0])
    assert both[0].lower == 65.0 and both[1].lower == 1.0
    np.testing.assert_allclose(both.survival(64.0), [1.0, b.survival(64.0)[0]])
    np.testing.assert_allclose(both.mean_remaining(64.0), [both[0].mean_remaining(64.0), b.mean_remaining(64.0)[0]])
    np.testing.assert_allclose(both.quantile(0.05), [both[0].quantile(0.05), b.quantile(0.05)[0]])
    assert both.quantile(0.05)[0] > 65.0
    # quantiles and point below the lower bound are raised to it; lower below 1 token is 1
    low = LengthEstimate(REM, np.array([2.0]), np.array([0.0]), lower=np.array([10.0]))
    assert low.quantiles.min() == 10.0 and low.point[0] == 10.0 and low[0].survival(9.9) == 1.0
    assert LengthEstimate.from_quantiles(REM, lower=np.array([0.0])).lower[0] == 1.0
    with pytest.raises(ValueError, match="lower: expected 1 finite values"):
        LengthEstimate.from_quantiles(REM, lower=np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match="lower: expected 1 finite values"):
        LengthEstimate.from_quantiles(REM, lower=np.array([np.nan]))
