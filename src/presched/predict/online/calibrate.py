"""Online conformal recalibration of predicted quantiles, censoring-aware.

Each completed request gives, per quantile level tau_j, a conformity score in log space

    s_j = log y - log q_hat_j          (y the true length, q_hat_j the base predictor's quantile)

and the calibrated quantile of a new request is `q_hat_j * exp(offset_j)`, offset_j the
tau_j-quantile of the recent scores with split conformal's finite-sample correction (the
ceil((n + 1) tau)-th smallest of n scores; `presched.predict.conformal` does the same offline).

A request cut by `max_tokens` is **censored**: its true length is only known to be >= c, so its
score is only a lower bound, s_j >= log c - log q_hat_j. Dropping such requests would bias every
offset down (the long ones are the ones cut); counting c as the length biases them down too.
The scores' distribution is instead estimated with **Kaplan-Meier**, which gives a censored score's
mass to the scores above it:

    S(t) = prod over event scores s_(i) <= t of (1 - d_i / r_i)     (r_i = scores >= s_(i))
    offset_j = the smallest event score with 1 - S >= tau_j (n + 1) / n

With no censored score, 1 - S(s_(k)) = k / n and this is exactly the split-conformal rank. A
level that Kaplan-Meier cannot reach (the top of the distribution all censored) takes the
largest score seen (a lower bound of the true offset: the best the data supports).

Scores live per group (the served model, or model and tenant) in ring buffers of `window` rows;
a group with fewer than `min_group` rows borrows the pooled offsets of all groups, and the pool
with fewer than `min_group` rows leaves the base's quantiles unchanged. At most `max_groups`
groups are kept (memory: `window` x levels floats each): a new group beyond that drops the one
whose last row is the oldest, whose requests then use the pooled offsets (and start it again).
Offsets are recomputed every `every` new rows of a group (amortised cost: one sort per level per
`every` completions).

Each row carries the caller's `stamp` (the learner's: how many completions the drift alarm had
seen when the row came). `forget_before(stamp, min_keep)` keeps, in each group and in the pool,
the rows stamped `stamp` or later, and at least the last `min_keep` (the learner calls it on a
drift alarm so that recalibration restarts from the rows after the change instead of averaging
across it; each group keeps its own rows since the change, whatever the other groups' traffic).
`forget(group, keep)` keeps a group's (and the pool's) last `keep` rows.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Sequence

import numpy as np


def km_quantiles(scores: np.ndarray, censored: np.ndarray, levels: Sequence[float]) -> np.ndarray:
    """Per-level conformal quantile of right-censored scores (n, L) -> (L,), as in the module doc.
    `censored[i]` = row i's scores are lower bounds. Vectorised over levels (one sort)."""
    s = np.asarray(scores, dtype=float)
    c = np.asarray(censored, dtype=bool)
    n, n_lv = s.shape
    if n == 0:
        raise ValueError("no calibration scores")
    target = np.minimum(np.asarray(levels, dtype=float) * (n + 1) / n, 1.0)
    if not c.any():  # split conformal: the ceil((n + 1) tau)-th smallest
        k = np.clip(np.ceil(target * n - 1e-9).astype(int), 1, n)
        return np.sort(s, axis=0)[k - 1, np.arange(n_lv)]
    # events before censored ones at equal scores (the usual KM convention)
    order = np.lexsort((np.broadcast_to(c[:, None], s.shape), s), axis=0)
    ss = np.take_along_axis(s, order, axis=0)
    cc = c[order]
    at_risk = (n - np.arange(n))[:, None]
    surv = np.cumprod(np.where(cc, 1.0, 1.0 - 1.0 / at_risk), axis=0)
    hit = ~cc & (1.0 - surv >= target[None, :] - 1e-12)
    first = np.argmax(hit, axis=0)
    cols = np.arange(n_lv)
    return np.where(hit.any(axis=0), ss[first, cols], ss[-1, cols])


class _Ring:
    def __init__(self, window: int, n_levels: int) -> None:
        self.scores = np.zeros((window, n_levels))
        self.censored = np.zeros(window, dtype=bool)
        self.stamps = np.zeros(window, dtype=np.int64)
        self.n = 0
        self.next = 0
        self.since = 0  # rows added since the offsets were last computed
        self.offsets: np.ndarray | None = None

    def add(self, score: np.ndarray, censored: bool, stamp: int = 0) -> None:
        w = self.scores.shape[0]
        self.scores[self.next] = score
        self.censored[self.next] = censored
        self.stamps[self.next] = stamp
        self.next = (self.next + 1) % w
        self.n = min(self.n + 1, w)
        self.since += 1

    def _order(self) -> np.ndarray | slice:
        w = self.scores.shape[0]
        return slice(0, self.n) if self.n < w else (np.arange(w) + self.next) % w  # oldest first

    def rows(self) -> tuple[np.ndarray, np.ndarray]:
        idx = self._order()
        return self.scores[idx], self.censored[idx]

    def rows_since(self, stamp: int) -> int:
        """Rows stamped `stamp` or later (stamps never decrease: the newest rows)."""
        return int(np.count_nonzero(self.stamps[self._order()] >= stamp))

    def keep_last(self, keep: int) -> None:
        idx = self._order()
        s, c, t = self.scores[idx], self.censored[idx], self.stamps[idx]
        k = len(s) - min(keep, len(s))
        s, c, t = s[k:].copy(), c[k:].copy(), t[k:].copy()
        self.scores[:] = 0
        self.censored[:] = False
        self.stamps[:] = 0
        self.n = self.next = len(s)
        self.scores[: self.n], self.censored[: self.n], self.stamps[: self.n] = s, c, t
        self.next %= self.scores.shape[0]
        self.offsets = None
        self.since = self.n


class OnlineConformal:
    def __init__(self, levels: Sequence[float], window: int = 500, min_group: int = 50, every: int = 25,
                 max_groups: int = 1000) -> None:  # fmt: skip
        if window < 2 or min_group < 1 or every < 1 or max_groups < 1:
            raise ValueError("window must be >= 2, min_group, every and max_groups >= 1")
        self.levels = tuple(float(v) for v in levels)
        self.window, self.min_group, self.every, self.max_groups = window, min_group, every, max_groups
        self.groups: OrderedDict[str, _Ring] = OrderedDict()  # least recently added to first
        self.pool = _Ring(window, len(self.levels))

    def add(self, group: str, base_q: np.ndarray, length: float, censored: bool = False,
            log_q: np.ndarray | None = None, stamp: int = 0) -> None:  # fmt: skip
        """One completion: `base_q` the base predictor's quantiles for it (or `log_q`, their
        logs, precomputed), `length` its true length (or, `censored`, the length it was cut at);
        `stamp` the caller's clock for `forget_before` (never decreasing)."""
        if log_q is None:
            log_q = np.log(np.maximum(base_q, 1.0))
        score = math.log(max(length, 1.0)) - log_q
        ring = self.groups.get(group)
        if ring is None:
            ring = self.groups[group] = _Ring(self.window, len(self.levels))
            if len(self.groups) > self.max_groups:
                self.groups.popitem(last=False)
        else:
            self.groups.move_to_end(group)
        ring.add(score, censored, stamp)
        self.pool.add(score, censored, stamp)

    def _offsets(self, ring: _Ring) -> np.ndarray | None:
        if ring.n < self.min_group:
            return None
        if ring.offsets is None or ring.since >= self.every:
            ring.offsets = km_quantiles(*ring.rows(), self.levels)
            ring.since = 0
        return ring.offsets

    def offsets(self, group: str) -> np.ndarray:
        """The group's log offsets (L,): its own, else the pool's, else zeros."""
        ring = self.groups.get(group)
        off = self._offsets(ring) if ring is not None else None
        if off is None:
            off = self._offsets(self.pool)
        return np.zeros(len(self.levels)) if off is None else off

    def apply(self, base_q: np.ndarray, groups: Sequence[str]) -> np.ndarray:
        """Calibrated quantiles (n, L) for base quantiles (n, L), one group per row (sorted rows)."""
        cache: dict[str, np.ndarray] = {}
        off = np.array([cache[g] if g in cache else cache.setdefault(g, self.offsets(g)) for g in groups])
        off = off.reshape(len(groups), len(self.levels))
        return np.sort(np.maximum(base_q, 1.0) * np.exp(off), axis=1)

    def forget(self, group: str, keep: int) -> None:
        """Keep only the group's (and the pool's) last `keep` rows."""
        if group in self.groups:
            self.groups[group].keep_last(keep)
        self.pool.keep_last(keep)

    def forget_before(self, stamp: int, min_keep: int) -> None:
        """Keep, in each group and in the pool, its rows stamped `stamp` or later, and at least
        its last `min_keep`."""
        for ring in [*self.groups.values(), self.pool]:
            ring.keep_last(max(min_keep, ring.rows_since(stamp)))

    # --- persistence ---------------------------------------------------------------------------
    def state(self) -> tuple[dict[str, np.ndarray], dict]:
        names = list(self.groups)  # least recently added to first
        arrays = {}
        for i, ring in enumerate([self.pool, *(self.groups[n] for n in names)]):
            s, c = ring.rows()
            arrays[f"cal{i}_scores"], arrays[f"cal{i}_censored"] = s, c
            arrays[f"cal{i}_stamps"] = ring.stamps[ring._order()]
        return arrays, {"levels": list(self.levels), "window": self.window, "min_group": self.min_group,
                        "every": self.every, "max_groups": self.max_groups, "groups": names}  # fmt: skip

    @classmethod
    def from_state(cls, arrays: dict[str, np.ndarray], values: dict, window: int | None = None,
                   min_group: int | None = None, every: int | None = None,
                   max_groups: int | None = None) -> "OnlineConformal":  # fmt: skip
        """The saved rows; the parameters given (the caller's config) replace the saved ones: each
        ring keeps its newest `window` rows, and only the `max_groups` groups added to last."""
        oc = cls(values["levels"], window or values["window"], min_group or values["min_group"],
                 every or values["every"], max_groups or values.get("max_groups", 1000))  # fmt: skip
        names = values["groups"]  # least recently added to first: beyond max_groups, the oldest go
        rings = [(0, oc.pool)] + [(1 + j, oc.groups.setdefault(names[j], _Ring(oc.window, len(oc.levels))))
                                  for j in range(max(0, len(names) - oc.max_groups), len(names))]  # fmt: skip
        for i, ring in rings:  # a state saved before stamps existed: all 0 (the oldest)
            stamps = arrays.get(f"cal{i}_stamps", np.zeros(len(arrays[f"cal{i}_censored"]), dtype=np.int64))
            for s, c, t in zip(arrays[f"cal{i}_scores"], arrays[f"cal{i}_censored"], stamps):
                ring.add(s, bool(c), int(t))
        return oc
