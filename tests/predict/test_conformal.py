from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import norm

from presched.predict.conformal import (
    ConformalQuantiles,
    apply,
    conformal_rank_quantile,
    fit_offsets,
)
from presched.predict.estimate import LEVELS

L = np.asarray(LEVELS)


def _data(n, rng, hetero=True):
    """log y = mu + sigma * eps, eps ~ N(0, 1): the true quantiles are known."""
    mu = rng.uniform(3, 7, n)
    sigma = rng.uniform(0.2, 1.0, n) if hetero else np.full(n, 0.5)
    return mu, sigma, np.exp(mu + sigma * rng.standard_normal(n))


@pytest.mark.parametrize("use_scale", [False, True])
def test_point_plus_offsets_covers_every_level(use_scale):
    rng = np.random.default_rng(0)
    mu, sig, y = _data(10000, rng)
    off = fit_offsets(np.exp(mu), y, LEVELS, scale=sig if use_scale else None)
    mu2, sig2, y2 = _data(20000, rng)
    q = apply(np.exp(mu2), off, scale=sig2 if use_scale else None)
    cover = (y2[:, None] <= q).mean(axis=0)
    assert np.abs(cover - L).max() < 0.02
    assert np.all(np.diff(q, axis=1) >= 0)
    if use_scale:  # normalised scores recover the standard normal quantiles
        assert np.abs(off - norm.ppf(L)).max() < 0.1


def test_cqr_fixes_biased_crossing_quantiles_and_keeps_them_monotone():
    rng = np.random.default_rng(1)
    mu, sig, y = _data(4000, rng)
    noisy = lambda m, s: np.exp(m[:, None] + 0.7 * s[:, None] * norm.ppf(L)[::-1] + 0.3)
    off = fit_offsets(noisy(mu, sig), y, LEVELS)
    mu2, sig2, y2 = _data(20000, rng)
    q = apply(noisy(mu2, sig2), off)
    assert np.all(np.diff(q, axis=1) >= 0)
    cover = (y2[:, None] <= q).mean(axis=0)
    assert np.abs(cover - L).max() < 0.03


def test_groups_get_their_own_offsets_and_unseen_groups_fall_back():
    rng = np.random.default_rng(2)
    n = 6000
    g = np.where(rng.random(n) < 0.5, "narrow", "wide")
    mu = rng.uniform(3, 6, n)
    y = np.exp(mu + np.where(g == "narrow", 0.2, 1.0) * rng.standard_normal(n))
    cq = ConformalQuantiles(LEVELS, min_group=500).fit(np.exp(mu), y, groups=g)
    assert set(cq.groups) == {"narrow", "wide"}
    g2 = np.where(rng.random(n) < 0.5, "narrow", "wide")
    mu2 = rng.uniform(3, 6, n)
    y2 = np.exp(mu2 + np.where(g2 == "narrow", 0.2, 1.0) * rng.standard_normal(n))
    q = cq.apply(np.exp(mu2), groups=g2)
    for name in ("narrow", "wide"):
        sel = g2 == name
        assert np.abs((y2[sel, None] <= q[sel]).mean(axis=0) - L).max() < 0.03
    unseen = cq.apply(np.exp(mu2[:3]), groups=["other"] * 3)
    assert np.allclose(unseen, apply(np.exp(mu2[:3]), cq.global_offsets))
    again = ConformalQuantiles.from_state(*cq.state())
    assert np.array_equal(again.apply(np.exp(mu2), groups=g2), q)


def test_rank_quantile_and_errors():
    assert conformal_rank_quantile(np.arange(1, 10), 0.5) == 5  # ceil(10 * 0.5) = 5th smallest
    assert conformal_rank_quantile(np.arange(1, 10), 0.99) == 9
    with pytest.raises(ValueError, match="pred_q"):
        fit_offsets(np.ones((3, 2)), np.ones(3), LEVELS)
    with pytest.raises(ValueError, match="scale"):
        apply(np.ones(3), np.zeros(len(LEVELS)), scale=np.array([1.0, -1.0, 1.0]))


# the rank k = ceil((n + 1) tau), clipped to [1, n], written out by hand for n = 1..5
RANKS = {  # n: {tau: k}
    1: {0.05: 1, 0.5: 1, 0.95: 1},
    2: {0.05: 1, 0.3: 1, 0.34: 2, 0.5: 2, 0.66: 2, 0.67: 2, 0.95: 2},
    3: {0.05: 1, 0.25: 1, 0.26: 2, 0.5: 2, 0.75: 3, 0.95: 3},
    4: {0.05: 1, 0.2: 1, 0.21: 2, 0.4: 2, 0.5: 3, 0.6: 3, 0.8: 4, 0.95: 4},
    5: {0.05: 1, 0.1: 1, 0.2: 2, 0.5: 3, 0.6: 4, 0.8: 5, 0.84: 5, 0.95: 5},
}


@pytest.mark.parametrize("n", sorted(RANKS))
def test_rank_is_ceil_of_n_plus_one_times_tau_for_small_n(n):
    # scores 10, 20, ..., shuffled: the k-th smallest is 10 k
    scores = np.random.default_rng(n).permutation(10.0 * np.arange(1, n + 1))
    for tau, k in RANKS[n].items():
        assert k == min(max(math.ceil((n + 1) * tau - 1e-12), 1), n)  # the table is the formula
        assert conformal_rank_quantile(scores, tau) == 10.0 * k, (n, tau)


def test_offsets_on_three_calibration_points_are_the_ranked_residuals():
    # log residuals log(y / q) = log 2, log 4, log 8 (point predictions of 1): rank
    # ceil(4 tau): tau 0.25 -> 1st, 0.5 -> 2nd, 0.7 -> 3rd, 0.95 -> 3rd (clipped)
    off = fit_offsets(np.ones(3), np.array([8.0, 2.0, 4.0]), [0.25, 0.5, 0.7, 0.95])
    assert np.allclose(np.exp(off), [2.0, 4.0, 8.0, 8.0])
    assert np.allclose(apply(np.array([10.0]), off), [[20.0, 40.0, 80.0, 80.0]])
