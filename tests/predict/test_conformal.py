from __future__ import annotations

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
