"""`LengthEstimate`: predicted output-length distributions for a batch of requests.

A prediction is a distribution, not a number. Each row (one request) holds:

- `quantiles[i, j]`: the `LEVELS[j]`-quantile of the request's output length (tokens),
  non-decreasing in j (enforced at construction);
- `point[i]`: the predictor's point estimate (its best single guess, e.g. a mean or median);
- `rank_score[i]`: a finite score whose order is the predicted order of lengths (larger =
  longer); rankers (ListMLE) set only this meaningfully; others use `point`;
- `lower[i]`: the smallest length the row allows (the first knot of its CDF): 1 token unless
  given; an estimate of the total length given L > g (probe-refine) has g + 1. Quantiles and
  point are raised to at least `lower` at construction.

From the quantiles, the distribution is the piecewise-linear CDF through the knots
(lower, 0) and (q_j, LEVELS[j]), with mass below LEVELS[0] spread uniformly on [lower, q_0]
(survival 1 below `lower`) and mass above LEVELS[-1] on an exponential tail through the last
two knots (exact for exponential tails). That gives
`survival(x) = P(L > x)`, `quantile(p)` at any level, and `mean_remaining(g) = E[L - g | L > g]`
(what SRPT-style policies need as a request generates).
`estimate[i]` is a one-request view (`RequestEstimate`) to attach to a running request
(`seq.estimate`); drivers may replace it at any step.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from functools import cached_property

import numpy as np

LEVELS: tuple[float, ...] = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)
"""Quantile levels every predictor reports."""

_LEVELS = np.asarray(LEVELS)
_TAIL_LOG = float(np.log((1 - LEVELS[-2]) / (1 - LEVELS[-1])))
_FS = [0.0, *LEVELS]  # CDF at the knots (1 token, then each quantile)
_SS = [1.0 - f for f in _FS]  # survival at the knots
_MID = [(a + b) / 2 for a, b in zip(_SS, _SS[1:])]  # mean survival over each linear piece


@dataclass(frozen=True, eq=False)
class LengthEstimate:
    quantiles: np.ndarray
    point: np.ndarray
    rank_score: np.ndarray
    lower: np.ndarray | None = None  # None: 1 token for every row

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
        if not np.isfinite(rank).all():  # a NaN key breaks the heap order of `rank` / stat=rank
            raise ValueError("rank_score must be finite")
        if self.lower is None:
            lower = np.ones(n)
        else:
            lower = np.asarray(self.lower, dtype=float).reshape(-1)
            if lower.shape != (n,) or not np.isfinite(lower).all():
                raise ValueError(f"lower: expected {n} finite values (the smallest length of each row)")
            lower = np.maximum(lower, 1.0)
        q = np.maximum.accumulate(np.maximum(q, lower[:, None]), axis=1)  # monotone, >= lower
        object.__setattr__(self, "quantiles", q)
        object.__setattr__(self, "point", np.maximum(point, lower))
        object.__setattr__(self, "rank_score", rank)
        object.__setattr__(self, "lower", lower)

    @classmethod
    def from_quantiles(cls, quantiles: np.ndarray, point: np.ndarray | None = None,
                       lower: np.ndarray | None = None) -> "LengthEstimate":  # fmt: skip
        """Point defaults to the median; rank score to the point; lower to 1 token."""
        q = np.asarray(quantiles, dtype=float)
        p = q[:, LEVELS.index(0.5)] if point is None else np.asarray(point, dtype=float)
        return cls(q, p, p, lower)

    def __len__(self) -> int:
        return self.quantiles.shape[0]

    def __getitem__(self, i: int) -> "RequestEstimate":
        return RequestEstimate(self.quantiles[i], float(self.point[i]), float(self.rank_score[i]),
                               float(self.lower[i]))  # fmt: skip

    def quantile(self, p: float) -> np.ndarray:
        """The p-quantile of each row (linear between knots; tails as in the module doc)."""
        return np.array([_quantile(row, lo, p) for row, lo in zip(self.quantiles, self.lower)])

    def survival(self, x: float | np.ndarray) -> np.ndarray:
        """P(L > x) for each row (x scalar, or one value per row)."""
        x = np.broadcast_to(np.asarray(x, dtype=float), (len(self),))
        return np.array([_survival(row, lo, xi) for row, lo, xi in zip(self.quantiles, self.lower, x)])

    def mean_remaining(self, generated: float | np.ndarray) -> np.ndarray:
        """E[L - g | L > g] for each row: expected tokens still to come after g were generated."""
        g = np.broadcast_to(np.asarray(generated, dtype=float), (len(self),))
        return np.array([_mean_remaining(row, lo, gi) for row, lo, gi in zip(self.quantiles, self.lower, g)])

    @classmethod
    def concat(cls, parts: list["LengthEstimate"]) -> "LengthEstimate":
        return cls(np.vstack([p.quantiles for p in parts]), np.concatenate([p.point for p in parts]),
                   np.concatenate([p.rank_score for p in parts]),
                   np.concatenate([p.lower for p in parts]))  # fmt: skip


@dataclass(frozen=True, eq=False)
class RequestEstimate:
    """One request's predicted length distribution (see the module doc). Methods run in pure
    Python on knots built once per request (a few microseconds each): schedulers call them on
    their hot path."""

    quantiles: np.ndarray
    point: float
    rank_score: float
    lower: float = 1.0  # the smallest length allowed (g + 1 for an estimate given L > g)

    @cached_property
    def dist(self) -> "Dist":
        return Dist(self.quantiles, self.lower)

    @property
    def mean(self) -> float:
        """E[L]."""
        return self.dist.mean_remaining(0.0)

    def quantile(self, p: float) -> float:
        return self.dist.quantile(p)

    def survival(self, x: float) -> float:
        return self.dist.survival(x)

    def mean_remaining(self, generated: float) -> float:
        return self.dist.mean_remaining(generated)

    def quantile_remaining(self, generated: float, p: float) -> float:
        return self.dist.quantile_remaining(generated, p)

    def gittins(self, generated: float) -> float:
        return self.dist.gittins(generated)


class Dist:
    """The distribution behind one row of quantiles: CDF knots (x_j, F_j) from (lower, 0)
    (`lower` 1 token unless given; survival 1 below it) through every (q_j, LEVELS[j]), quantiles
    below `lower` raised to it, linear in between, exponential tail of mean excess `tail` beyond
    the last knot. Right-continuous: where knots coincide the CDF jumps."""

    __slots__ = ("xs", "fs", "ss", "tail", "suffix")

    def __init__(self, q, lower: float = 1.0) -> None:
        lo = float(lower)
        xs = [lo, *(q.tolist() if isinstance(q, np.ndarray) else map(float, q))]
        if xs[1] < lo:  # quantiles are non-decreasing: raise the ones below `lower`
            xs = [v if v > lo else lo for v in xs]
        self.xs, self.fs, self.ss = xs, _FS, _SS  # the level lists are shared, never mutated
        # exponential tail through the last two knots: for S(x) = c e^{-x/m},
        # q99 - q95 = m ln((1 - 0.95) / (1 - 0.99))
        self.tail = tail = max((xs[-1] - xs[-2]) / _TAIL_LOG, 1.0)
        # suffix[j] = integral of S from x_j to infinity (trapezoids of the linear pieces)
        acc = _SS[-1] * tail
        suffix = [acc]
        for j in range(len(xs) - 2, -1, -1):
            acc += _MID[j] * (xs[j + 1] - xs[j])
            suffix.append(acc)
        suffix.reverse()
        self.suffix = suffix

    def survival(self, x: float) -> float:
        """P(L > x)."""
        xs = self.xs
        if x < xs[0]:
            return 1.0
        if x >= xs[-1]:
            return self.ss[-1] * math.exp(-(x - xs[-1]) / self.tail)
        j = bisect_right(xs, x) - 1
        x0, x1 = xs[j], xs[j + 1]
        return self.ss[j] + (self.ss[j + 1] - self.ss[j]) * (x - x0) / (x1 - x0)

    def quantile(self, p: float) -> float:
        """The smallest x with P(L <= x) >= p (linear between knots, exponential tail)."""
        if not 0 <= p < 1:
            raise ValueError(f"quantile level must be in [0, 1), got {p}")
        fs, xs = self.fs, self.xs
        if p > fs[-1]:
            return xs[-1] + self.tail * math.log((1 - fs[-1]) / (1 - p))
        j = bisect_left(fs, p)
        if j == 0 or fs[j] == p:
            return xs[j]
        f0, f1 = fs[j - 1], fs[j]
        return xs[j - 1] + (xs[j] - xs[j - 1]) * (p - f0) / (f1 - f0)

    def _integral_from(self, g: float) -> float:
        """Integral of S from g to infinity."""
        xs = self.xs
        if g < xs[0]:
            return xs[0] - g + self.suffix[0]
        if g >= xs[-1]:
            return self.survival(g) * self.tail
        j = bisect_right(xs, g) - 1
        return (self.survival(g) + self.ss[j + 1]) / 2 * (xs[j + 1] - g) + self.suffix[j + 1]

    def mean_remaining(self, g: float) -> float:
        """E[L - g | L > g] = integral of S from g to infinity / S(g)."""
        s_g = self.survival(g)
        if s_g <= 1e-12:
            return self.tail  # beyond the model's support: the tail's mean excess
        return self._integral_from(g) / s_g

    def quantile_remaining(self, g: float, p: float) -> float:
        """The p-quantile of L - g given L > g: Q(1 - (1 - p) S(g)) - g (at least 1 token)."""
        s_g = self.survival(g)
        if s_g <= 1e-12:  # beyond the model's support: the tail's quantile, at least 1 token
            return max(self.tail * math.log(1 / (1 - p)), 1.0)
        return max(self.quantile(min(1 - (1 - p) * s_g, 1 - 1e-12)) - g, 1.0)

    def gittins(self, g: float) -> float:
        """Gittins index of a job that has received g tokens of service:
        sup over horizons D of P(L - g <= D | L > g) / E[min(L - g, D) | L > g], i.e. the best
        completion probability per unit of expected service. Higher runs first; its inverse
        is an "effective remaining size" (= L - g for a known length). Within a linear piece of
        S the hazard rate grows, so the sup is attained at a knot or at D -> infinity."""
        s_g = self.survival(g)
        if s_g <= 1e-12:
            return 1.0 / self.tail
        xs, ss = self.xs, self.ss
        best = s_g / self._integral_from(g)  # D -> infinity: completion certain
        j = bisect_right(xs, g)  # first knot above g
        if j < len(xs):
            # integral of S from g to x_j, then accumulate knot to knot
            if g < xs[0]:
                area = xs[0] - g
                j = 0
                s_prev, x_prev = 1.0, xs[0]
            else:
                s_prev = ss[j]
                area = (s_g + s_prev) / 2 * (xs[j] - g)
                x_prev = xs[j]
            if area > 0:
                best = max(best, (s_g - s_prev) / area)
            for k in range(j + 1, len(xs)):
                area += (s_prev + ss[k]) / 2 * (xs[k] - x_prev)
                s_prev, x_prev = ss[k], xs[k]
                if area > 0:
                    r = (s_g - s_prev) / area
                    if r > best:
                        best = r
        return best


# --- vectorised forms over rows (LengthEstimate) ----------------------------------------------------
def _survival(q: np.ndarray, lower: float, x: float) -> float:
    return Dist(q, lower).survival(x)


def _quantile(q: np.ndarray, lower: float, p: float) -> float:
    return Dist(q, lower).quantile(p)


def _mean_remaining(q: np.ndarray, lower: float, g: float) -> float:
    return Dist(q, lower).mean_remaining(g)
