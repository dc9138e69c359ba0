"""`ErrorTracker`: how good the length predictions of the last completed requests were.

A rolling window (default 200) of completed requests, each a (`RequestEstimate`, true length)
pair. Drivers (the `fallback` policy, the gateway's metrics) add one pair per completion and read:

- `mae`           mean |point - true| (tokens; point = the predictor's point estimate)
- `rel_mae`       mae / mean true length (scale-free)
- `coverage(p)`   fraction of requests with true <= the predicted p-quantile (calibrated: ~p)
- `coverage_error(p)`  |coverage(p) - p|
- `kendall_tau`   Kendall's tau-b between the predicted rank score and the true length
- `discordance`   discordant / (concordant + discordant) over pairs tied in neither value:
                  0 = perfect order, 0.5 = random, 1 = reversed; (1 - tau) / 2 without ties

Every value of an empty window (or one without comparable pairs) is nan.

Cost: `add` is O(window) with numpy (the new pair is compared with every pair in the window,
and an evicted pair with every remaining one, updating concordant / discordant / tie counts
incrementally), never O(window^2). Coverage at the `levels` given at construction is counted at
`add`; other levels are computed on demand (O(window) quantile calls).
"""

from __future__ import annotations

import math

import numpy as np

from presched.predict.estimate import RequestEstimate


class ErrorTracker:
    def __init__(self, window: int = 200, levels: tuple[float, ...] = (0.5, 0.9)) -> None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 2:
            raise ValueError(f"field 'window': must be an integer >= 2, got {window!r}")
        for p in levels:
            if not 0 < p < 1:
                raise ValueError(f"field 'levels': quantile levels must be in (0, 1), got {p!r}")
        self.window = window
        self.levels = tuple(levels)
        self._est: list[RequestEstimate | None] = [None] * window
        self._point = np.zeros(window)
        self._score = np.zeros(window)
        self._true = np.zeros(window)
        self._covered = np.zeros((len(self.levels), window), dtype=bool)
        self._next = 0  # ring position of the next pair
        self.n = 0  # pairs in the window
        self.total = 0  # pairs ever added
        # pair counts over the window (each unordered pair once)
        self.concordant = 0
        self.discordant = 0
        self._tied_score = 0  # pairs tied in the score (including both tied)
        self._tied_true = 0  # pairs tied in the true length (including both tied)

    def add(self, estimate: RequestEstimate, true_length: float) -> None:
        """Record one completed request: its estimate and its true output length."""
        w, i = self.window, self._next
        if self.n == w:  # evict the oldest pair (at the slot we overwrite)
            self._count(i, self._score[i], self._true[i], -1)
        else:
            self.n += 1
        score, y = float(estimate.rank_score), float(true_length)
        self._est[i] = estimate
        self._point[i] = float(estimate.point)
        self._score[i] = score
        self._true[i] = y
        for j, p in enumerate(self.levels):
            self._covered[j, i] = y <= estimate.quantile(p)
        self._count(i, score, y, +1)
        self._next = (i + 1) % w
        self.total += 1

    def _count(self, i: int, score: float, y: float, sign: int) -> None:
        """Add (sign=+1) or remove (-1) the pairs between slot i and every other live slot."""
        live = self._live_mask()
        live[i] = False
        ds = np.sign(self._score[live] - score)
        dy = np.sign(self._true[live] - y)
        prod = ds * dy
        self.concordant += sign * int(np.count_nonzero(prod > 0))
        self.discordant += sign * int(np.count_nonzero(prod < 0))
        self._tied_score += sign * int(np.count_nonzero(ds == 0))
        self._tied_true += sign * int(np.count_nonzero(dy == 0))

    def _live_mask(self) -> np.ndarray:
        m = np.zeros(self.window, dtype=bool)
        if self.n == self.window:
            m[:] = True
        else:  # before the window fills, slots 0 .. n-1 are live (n already counts slot i)
            m[: self.n] = True
        return m

    def _live(self, a: np.ndarray) -> np.ndarray:
        return a if self.n == self.window else a[: self.n]

    # --- metrics -----------------------------------------------------------------------
    @property
    def mae(self) -> float:
        if not self.n:
            return math.nan
        return float(np.mean(np.abs(self._live(self._point) - self._live(self._true))))

    @property
    def rel_mae(self) -> float:
        if not self.n:
            return math.nan
        mean_true = float(np.mean(self._live(self._true)))
        return self.mae / mean_true if mean_true > 0 else math.nan

    def coverage(self, level: float) -> float:
        """Fraction of the window with true length <= the predicted `level`-quantile."""
        if not self.n:
            return math.nan
        if level in self.levels:
            return float(np.mean(self._live(self._covered[self.levels.index(level)])))
        ests = self._est if self.n == self.window else self._est[: self.n]
        trues = self._live(self._true)
        return float(np.mean([y <= e.quantile(level) for e, y in zip(ests, trues)]))

    def coverage_error(self, level: float) -> float:
        return abs(self.coverage(level) - level)

    @property
    def kendall_tau(self) -> float:
        """Kendall's tau-b: (C - D) / sqrt((n0 - T_score) (n0 - T_true)), n0 = n (n - 1) / 2."""
        n0 = self.n * (self.n - 1) // 2
        denom = (n0 - self._tied_score) * (n0 - self._tied_true)
        if denom <= 0:
            return math.nan
        return (self.concordant - self.discordant) / math.sqrt(denom)

    @property
    def discordance(self) -> float:
        comparable = self.concordant + self.discordant
        return self.discordant / comparable if comparable else math.nan

    def snapshot(self) -> dict[str, float]:
        """The current values, flat, for a metrics exporter (names are Prometheus-safe)."""
        out = {
            "samples": float(self.n),
            "completed_total": float(self.total),
            "mae_tokens": self.mae,
            "rel_mae": self.rel_mae,
            "kendall_tau": self.kendall_tau,
            "discordance": self.discordance,
        }
        for p in self.levels:
            out[f"coverage_q{round(p * 100)}"] = self.coverage(p)
        return out
