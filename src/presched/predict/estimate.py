"""`LengthEstimate`: predicted output-length distributions for a batch of requests.

A prediction is a distribution, not a number. Each row (one request) holds:

- `quantiles[i, j]`: the `LEVELS[j]`-quantile of the request's output length (tokens),
  non-decreasing in j (enforced at construction);
- `point[i]`: the predictor's point estimate (its best single guess, e.g. a mean or median);
- `rank_score[i]`: a score whose order is the predicted order of lengths (larger = longer);
  rankers (ListMLE) set only this meaningfully; others use `point`.

From the quantiles, the distribution is the piecewise-linear CDF through the knots
(q_j, LEVELS[j]), with mass below LEVELS[0] spread uniformly on [1, q_0] and mass above
LEVELS[-1] on an exponential tail through the last two knots (exact for exponential tails). That gives
`survival(x) = P(L > x)`, `quantile(p)` at any level, and `mean_remaining(g) = E[L - g | L > g]`
(what SRPT-style policies need as a request generates).
`estimate[i]` is a one-request view (`RequestEstimate`) to attach to a running request
(`seq.estimate`); drivers may replace it at any step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

LEVELS: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)
"""Quantile levels every predictor reports."""

_LEVELS = np.asarray(LEVELS)
_TAIL_LOG = float(np.log((1 - LEVELS[-2]) / (1 - LEVELS[-1])))


@dataclass(frozen=True, eq=False)
class LengthEstimate:
    quantiles: np.ndarray
    point: np.ndarray
    rank_score: np.ndarray

    def __post_init__(self) -> None:
        q = np.asarray(self.quantiles, dtype=float)
        if q.ndim != 2 or q.shape[1] != len(LEVELS):
            raise ValueError(f"quantiles: expected shape (n, {len(LEVELS)}), got {q.shape}")
        n = q.shape[0]
        point = np.asarray(self.point, dtype=float).reshape(-1)
        rank = np.asarray(self.rank_score, dtype=float).reshape(-1)
        if point.shape != (n,) or rank.shape != (n,):
            raise ValueError(f"point and rank_score must have {n} entries")
        if not (np.isfinite(q).all() and np.isfinite(point).all()):
            raise ValueError("quantiles and point must be finite")
        q = np.maximum.accumulate(np.maximum(q, 1.0), axis=1)  # monotone, >= 1 token
        object.__setattr__(self, "quantiles", q)
        object.__setattr__(self, "point", np.maximum(point, 1.0))
        object.__setattr__(self, "rank_score", rank)

    @classmethod
    def from_quantiles(cls, quantiles: np.ndarray, point: np.ndarray | None = None) -> "LengthEstimate":
        """Point defaults to the median; rank score to the point."""
        q = np.asarray(quantiles, dtype=float)
        p = q[:, LEVELS.index(0.5)] if point is None else np.asarray(point, dtype=float)
        return cls(q, p, p)

    def __len__(self) -> int:
        return self.quantiles.shape[0]

    def __getitem__(self, i: int) -> "RequestEstimate":
        return RequestEstimate(self.quantiles[i], float(self.point[i]), float(self.rank_score[i]))

    def quantile(self, p: float) -> np.ndarray:
        """The p-quantile of each row (linear between knots; tails as in the module doc)."""
        return np.array([_quantile(row, p) for row in self.quantiles])

    def survival(self, x: float | np.ndarray) -> np.ndarray:
        """P(L > x) for each row (x scalar, or one value per row)."""
        x = np.broadcast_to(np.asarray(x, dtype=float), (len(self),))
        return np.array([_survival(row, xi) for row, xi in zip(self.quantiles, x)])

    def mean_remaining(self, generated: float | np.ndarray) -> np.ndarray:
        """E[L - g | L > g] for each row: expected tokens still to come after g were generated."""
        g = np.broadcast_to(np.asarray(generated, dtype=float), (len(self),))
        return np.array([_mean_remaining(row, gi) for row, gi in zip(self.quantiles, g)])

    @classmethod
    def concat(cls, parts: list["LengthEstimate"]) -> "LengthEstimate":
        return cls(np.vstack([p.quantiles for p in parts]), np.concatenate([p.point for p in parts]),
                   np.concatenate([p.rank_score for p in parts]))  # fmt: skip


@dataclass(frozen=True, eq=False)
class RequestEstimate:
    """One request's predicted length distribution (see the module doc)."""

    quantiles: np.ndarray
    point: float
    rank_score: float

    def quantile(self, p: float) -> float:
        return _quantile(self.quantiles, p)

    def survival(self, x: float) -> float:
        return _survival(self.quantiles, x)

    def mean_remaining(self, generated: float) -> float:
        return _mean_remaining(self.quantiles, generated)


# --- the distribution behind a row of quantiles --------------------------------------------------
def _knots(q: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
    """CDF knots (x, F) from 1 token (F = 0) through every quantile, and the tail's mean excess."""
    x = np.concatenate(([1.0], q))
    f = np.concatenate(([0.0], _LEVELS))
    # exponential tail beyond the last knot, through the last two knots: for S(x) = c e^{-x/m},
    # q99 - q95 = m ln((1 - 0.95) / (1 - 0.99))
    tail = max((q[-1] - q[-2]) / _TAIL_LOG, 1.0)
    return x, f, tail


def _survival(q: np.ndarray, x: float) -> float:
    xs, fs, tail = _knots(q)
    if x < xs[0]:
        return 1.0
    if x >= xs[-1]:
        return float((1 - fs[-1]) * np.exp(-(x - xs[-1]) / tail))
    return float(1 - np.interp(x, xs, fs))


def _quantile(q: np.ndarray, p: float) -> float:
    if not 0 <= p < 1:
        raise ValueError(f"quantile level must be in [0, 1), got {p}")
    xs, fs, tail = _knots(q)
    if p <= fs[-1]:
        # np.interp needs increasing x; fs is increasing, xs non-decreasing
        return float(np.interp(p, fs, xs))
    return float(xs[-1] + tail * np.log((1 - fs[-1]) / (1 - p)))


def _mean_remaining(q: np.ndarray, g: float) -> float:
    """E[L - g | L > g], integrating the survival function: ∫_g^∞ S(x) dx / S(g)."""
    xs, fs, tail = _knots(q)
    s_g = _survival(q, g)
    if s_g <= 1e-12:
        return tail  # beyond the model's support: the tail's mean excess
    total = 0.0
    if g < xs[-1]:
        # piecewise-linear S between knots above g
        pts = np.concatenate(([max(g, xs[0])], xs[xs > g]))
        svals = np.array([_survival(q, v) for v in pts])
        total += float(np.sum((svals[1:] + svals[:-1]) / 2 * np.diff(pts)))
        if g < xs[0]:
            total += xs[0] - g  # S = 1 below one token
        total += (1 - fs[-1]) * tail  # ∫ of the exponential tail from the last knot
    else:
        total = s_g * tail
    return total / s_g
