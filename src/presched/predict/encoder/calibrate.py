"""Calibration on held-out (validation) rows: isotonic score→length maps and conformal offsets.

- `pav(y, w)`: weighted isotonic (non-decreasing) regression by pool-adjacent-violators.
- `ScoreMap.fit(score, samples, target)`: rows sorted by score into equal-count bins; per bin the
  empirical quantiles (at `LEVELS`) of the rows' pooled samples and the median of their mean
  lengths; each column made non-decreasing in score by `pav`; prediction interpolates linearly in
  score between bin centres (flat beyond the ends). Turns a ranker's score into a distribution.
- `conformal_offsets(resid, groups)`: split-conformal residual quantiles at `LEVELS`, pooled and
  per group (served model); a group with too few residuals uses the pooled ones.
"""

from __future__ import annotations

import numpy as np

from presched.predict.estimate import LEVELS

_L = np.asarray(LEVELS)


def pav(y: np.ndarray, w: np.ndarray | None = None) -> np.ndarray:
    y = np.asarray(y, dtype=float)
    w = np.ones_like(y) if w is None else np.asarray(w, dtype=float)
    vals, wts, sizes = [], [], []
    for yi, wi in zip(y, w):
        vals.append(yi), wts.append(wi), sizes.append(1)
        while len(vals) > 1 and vals[-2] > vals[-1]:
            v2, w2, s2 = vals.pop(), wts.pop(), sizes.pop()
            v1, w1, s1 = vals.pop(), wts.pop(), sizes.pop()
            ww = w1 + w2
            vals.append((v1 * w1 + v2 * w2) / ww), wts.append(ww), sizes.append(s1 + s2)
    return np.repeat(vals, sizes)


class ScoreMap:
    def __init__(self, centres: np.ndarray, table: np.ndarray, point: np.ndarray) -> None:
        self.centres = np.asarray(centres, dtype=float)  # (B,) increasing bin-centre scores
        self.table = np.asarray(table, dtype=float)  # (B, len(LEVELS))
        self.point = np.asarray(point, dtype=float)  # (B,)

    @classmethod
    def fit(
        cls, score: np.ndarray, samples: np.ndarray, target: np.ndarray, bins: int = 50
    ) -> ScoreMap:
        order = np.argsort(score, kind="stable")
        bins = max(1, min(bins, len(order) // 20 or 1))
        parts = np.array_split(order, bins)
        centres = np.array([score[p].mean() for p in parts])
        table = np.array([np.quantile(_finite(samples[p]), _L) for p in parts])
        point = np.array([np.median(target[p]) for p in parts])
        n = np.array([len(p) for p in parts], dtype=float)
        table = np.stack([pav(table[:, j], n) for j in range(len(_L))], axis=1)
        table = np.maximum.accumulate(table, axis=1)
        return cls(centres, table, pav(point, n))

    def __call__(self, score: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(quantiles (n, len(LEVELS)), point (n,)) for scores."""
        s = np.asarray(score, dtype=float)
        if len(self.centres) == 1:
            return np.tile(self.table[0], (len(s), 1)), np.full(len(s), self.point[0])
        q = np.stack([np.interp(s, self.centres, self.table[:, j]) for j in range(len(_L))], axis=1)
        return q, np.interp(s, self.centres, self.point)


def _finite(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=float).reshape(-1)
    return x[np.isfinite(x)]


def conformal_offsets(
    resid: np.ndarray, groups: np.ndarray, n_groups: int, min_count: int = 200
) -> np.ndarray:
    """(n_groups, len(LEVELS)) residual quantiles; row g uses group g's residuals when it has at
    least `min_count`, else the pooled ones. `resid` and `groups` are flat, one per sample."""
    ok = np.isfinite(resid)
    resid, groups = resid[ok], groups[ok]
    pooled = np.quantile(resid, _L)
    out = np.tile(pooled, (n_groups, 1))
    for g in range(n_groups):
        r = resid[groups == g]
        if r.size >= min_count:
            out[g] = np.quantile(r, _L)
    return out
