"""Length buckets and the distribution a bucket classifier's probabilities describe.

    b = Buckets.fit(edges, training_samples)
    soft = b.soft_labels(samples)            # (n, K): share of each row's samples per bucket
    q = b.quantiles(probs)                   # (n, len(LEVELS)) from (n, K) probabilities
    m = b.mean(probs)                        # expected length

The predicted distribution is a mixture over buckets: bucket k carries probability p_k and,
inside it, the empirical distribution of the training samples that fell in it (21 knots, linear
between them: a mixture of piecewise-uniforms; an empty bucket is uniform on its range, an empty
open last bucket uniform on [lo, 2·lo]). Quantiles invert the mixture CDF on the union of knots.

Edge makers: `s3_edges` (S3: 10 equal-width buckets; the last one open-ended) and
`percentile_edges` (SSJF: classes cut at the p25/p50/p75/p99 of the training lengths).
"""

from __future__ import annotations

import numpy as np

from presched.predict.estimate import LEVELS

_L = np.asarray(LEVELS)
_GRID = np.linspace(0.0, 1.0, 21)


def s3_edges(samples: np.ndarray, n_buckets: int = 10, upper: float | None = None) -> np.ndarray:
    """[0, w, 2w, ..., (K-1)w, inf] with w = upper / K; `upper` defaults to the training
    samples' 99th percentile rounded up to a multiple of 10·K tokens."""
    if upper is None:
        step = 10 * n_buckets
        upper = float(np.ceil(np.quantile(samples, 0.99) / step) * step)
    w = upper / n_buckets
    return np.concatenate([np.arange(n_buckets) * w, [np.inf]])


def percentile_edges(samples: np.ndarray, percentiles=(25, 50, 75, 99)) -> np.ndarray:
    """[0, p25, p50, p75, p99, inf] of the training samples (SSJF's 5 classes)."""
    cuts = np.percentile(samples, percentiles)
    edges = np.concatenate([[0.0], cuts, [np.inf]])
    if np.any(np.diff(edges) <= 0):
        raise ValueError(f"percentile edges are not increasing ({edges}); too few distinct lengths")
    return edges


class Buckets:
    def __init__(self, edges: np.ndarray, knots: np.ndarray, means: np.ndarray) -> None:
        self.edges = np.asarray(edges, dtype=float)
        self.knots = np.asarray(knots, dtype=float)  # (K, 21): within-bucket quantiles
        self.means = np.asarray(means, dtype=float)  # (K,)
        k = len(self.edges) - 1
        # strictly increasing knots per bucket so that the CDF interpolation is well defined
        jitter = np.arange(_GRID.size) * 1e-6
        self._kn = self.knots + jitter
        self._x = np.unique(self._kn)
        self._F = np.stack(
            [np.interp(self._x, self._kn[i], _GRID, left=0.0, right=1.0) for i in range(k)]
        )

    @property
    def n(self) -> int:
        return len(self.edges) - 1

    @classmethod
    def fit(cls, edges: np.ndarray, samples: np.ndarray) -> Buckets:
        edges = np.asarray(edges, dtype=float)
        samples = np.asarray(samples, dtype=float)
        b = np.searchsorted(edges, samples, side="right") - 1
        knots, means = [], []
        for k in range(len(edges) - 1):
            lo, hi = edges[k], edges[k + 1]
            s = samples[b == k]
            if s.size:
                knots.append(np.quantile(s, _GRID))
                means.append(s.mean())
            else:
                hi = hi if np.isfinite(hi) else 2 * max(lo, 1.0)
                knots.append(lo + (hi - lo) * _GRID)
                means.append((lo + hi) / 2)
        return cls(edges, np.array(knots), np.array(means))

    def index(self, lengths: np.ndarray) -> np.ndarray:
        return np.clip(np.searchsorted(self.edges, lengths, side="right") - 1, 0, self.n - 1)

    def soft_labels(self, samples: np.ndarray) -> np.ndarray:
        """(n, S) samples with NaN padding -> (n, K) share of each row's samples per bucket."""
        ok = np.isfinite(samples)
        idx = self.index(np.where(ok, samples, 0.0))
        out = np.zeros((samples.shape[0], self.n))
        rows = np.repeat(np.arange(samples.shape[0]), samples.shape[1]).reshape(samples.shape)
        np.add.at(out, (rows[ok], idx[ok]), 1.0)
        return out / np.maximum(out.sum(1, keepdims=True), 1.0)

    def mean(self, probs: np.ndarray) -> np.ndarray:
        return probs @ self.means

    def quantiles(self, probs: np.ndarray, levels: np.ndarray = _L) -> np.ndarray:
        cdf = np.maximum.accumulate(probs @ self._F, axis=1)  # (n, G)
        cdf[:, -1] = 1.0
        out = np.empty((probs.shape[0], len(levels)))
        rows = np.arange(probs.shape[0])
        for j, a in enumerate(levels):
            i = np.argmax(cdf >= a, axis=1)
            i0 = np.maximum(i - 1, 0)
            c0, c1 = cdf[rows, i0], cdf[rows, i]
            x0, x1 = self._x[i0], self._x[i]
            t = np.where(c1 > c0, (a - c0) / np.where(c1 > c0, c1 - c0, 1.0), 1.0)
            out[:, j] = x0 + np.clip(t, 0.0, 1.0) * (x1 - x0)
        return out
