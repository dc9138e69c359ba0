"""Split-conformal calibration of predicted quantiles (conformalised quantile regression).

Any predictor that produces a guess per quantile level (or one point and a spread) can make its
quantiles honest on held-out data with three calls:

    offsets = fit_offsets(pred_q_cal, y_cal, LEVELS)          # on a calibration set
    q = apply(pred_q_new, offsets)                            # on new requests

For level tau_j and calibration pairs (q_hat_ij, y_i), in log space by default:

    s_ij      = (log y_i - log q_hat_ij) / scale_i             # conformity score (scale = 1 if none)
    offset_j  = the ceil((n + 1) tau_j)-th smallest of s_.j    # split-conformal quantile
    q_ij(new) = exp(log q_hat_ij + scale_i * offset_j)

so that P(y <= q_j) ~= tau_j on exchangeable new data (finite-sample guarantee >= tau_j for
the upper levels; for a lower level tau the same rank gives coverage in [tau, tau + 1/(n+1)]).
`pred_q` may be (n, L) (one guess per level, as from quantile regressors: CQR) or (n,) (a
point: then the offsets are the residual quantiles, "normalised" by `scale` when one is given,
e.g. a predicted absolute residual). Rows are then sorted (the rearrangement of Chernozhukov et
al.), which keeps quantiles monotone without changing marginal coverage much.

`ConformalQuantiles` adds per-group offsets (e.g. per served model) where a group has at least
`min_group` calibration rows, falling back to the global offsets elsewhere (and for unseen
groups), and stores as plain arrays for the `.npz` model files.

Reference: Romano, Patterson, Candès, "Conformalized Quantile Regression", NeurIPS 2019;
Lei et al., "Distribution-Free Predictive Inference for Regression", JASA 2018 (normalised
scores).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np


def _as_2d(pred_q: np.ndarray, n_levels: int) -> np.ndarray:
    q = np.asarray(pred_q, dtype=float)
    if q.ndim == 1:
        q = np.repeat(q[:, None], n_levels, axis=1)
    if q.ndim != 2 or q.shape[1] != n_levels:
        raise ValueError(f"pred_q: expected shape (n,) or (n, {n_levels}), got {q.shape}")
    return q


def _scale(scale: np.ndarray | None, n: int) -> np.ndarray:
    if scale is None:
        return np.ones(n)
    s = np.asarray(scale, dtype=float).reshape(-1)
    if s.shape != (n,) or not (np.isfinite(s).all() and (s > 0).all()):
        raise ValueError(f"scale: expected {n} finite positive values")
    return s


def conformal_rank_quantile(scores: np.ndarray, level: float) -> float:
    """The ceil((n + 1) * level)-th smallest score (clipped to [1, n])."""
    s = np.sort(np.asarray(scores, dtype=float))
    n = s.size
    if n == 0:
        raise ValueError("no calibration scores")
    k = min(max(math.ceil((n + 1) * level), 1), n)
    return float(s[k - 1])


def fit_offsets(pred_q: np.ndarray, y: np.ndarray, levels: Sequence[float], scale: np.ndarray | None = None,
                log: bool = True) -> np.ndarray:  # fmt: skip
    """Per-level conformal offsets (len(levels),) from calibration predictions and targets."""
    levels = list(levels)
    y = np.asarray(y, dtype=float).reshape(-1)
    q = _as_2d(pred_q, len(levels))
    if q.shape[0] != y.size:
        raise ValueError(f"pred_q has {q.shape[0]} rows, y has {y.size}")
    ok = np.isfinite(y) & np.isfinite(q).all(axis=1)
    if log:
        ok &= (y > 0) & (q > 0).all(axis=1)
    if not ok.any():
        raise ValueError("y: no usable calibration targets")
    s = _scale(None if scale is None else np.asarray(scale, dtype=float)[ok], int(ok.sum()))
    if log:
        r = (np.log(y[ok])[:, None] - np.log(q[ok])) / s[:, None]
    else:
        r = (y[ok][:, None] - q[ok]) / s[:, None]
    return np.array([conformal_rank_quantile(r[:, j], lv) for j, lv in enumerate(levels)])


def apply(pred_q: np.ndarray, offsets: np.ndarray, scale: np.ndarray | None = None, log: bool = True) -> np.ndarray:
    """Calibrated quantiles (n, L): shift each level by its offset, then sort each row."""
    offsets = np.asarray(offsets, dtype=float)
    if offsets.ndim == 1:
        offsets = offsets[None, :]
    q = _as_2d(pred_q, offsets.shape[1])
    s = _scale(scale, q.shape[0])[:, None]
    out = np.exp(np.log(q) + s * offsets) if log else q + s * offsets
    return np.sort(out, axis=1)


class ConformalQuantiles:
    """Global + per-group split-conformal offsets (groups with >= `min_group` rows)."""

    def __init__(self, levels: Sequence[float], log: bool = True, min_group: int = 300) -> None:
        self.levels = tuple(float(v) for v in levels)
        self.log = log
        self.min_group = min_group
        self.global_offsets = np.zeros(len(self.levels))
        self.groups: dict[str, np.ndarray] = {}
        self.n_cal = 0

    def fit(self, pred_q: np.ndarray, y: np.ndarray, groups: Sequence[Hashable] | None = None,
            scale: np.ndarray | None = None) -> ConformalQuantiles:  # fmt: skip
        y = np.asarray(y, dtype=float).reshape(-1)
        self.n_cal = int(y.size)
        self.global_offsets = fit_offsets(pred_q, y, self.levels, scale, self.log)
        self.groups = {}
        if groups is not None:
            g = np.asarray([str(v) for v in groups])
            q = _as_2d(pred_q, len(self.levels))
            s = None if scale is None else np.asarray(scale, dtype=float)
            for name in np.unique(g):
                sel = g == name
                if sel.sum() >= self.min_group:
                    self.groups[str(name)] = fit_offsets(q[sel], y[sel], self.levels,
                                                         None if s is None else s[sel], self.log)  # fmt: skip
        return self

    def offsets_for(self, groups: Sequence[Hashable] | None, n: int) -> np.ndarray:
        if groups is None or not self.groups:
            return np.repeat(self.global_offsets[None, :], n, axis=0)
        return np.array([self.groups.get(str(v), self.global_offsets) for v in groups])

    def apply(self, pred_q: np.ndarray, groups: Sequence[Hashable] | None = None,
              scale: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
        q = _as_2d(pred_q, len(self.levels))
        off = self.offsets_for(groups, q.shape[0])
        s = _scale(scale, q.shape[0])[:, None]
        out = np.exp(np.log(q) + s * off) if self.log else q + s * off
        return np.sort(out, axis=1)

    # --- persistence (arrays + JSON values) ---
    def state(self, prefix: str = "conformal") -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        names = sorted(self.groups)
        arrays = {f"{prefix}_global": self.global_offsets,
                  f"{prefix}_groups": np.array([self.groups[n] for n in names]).reshape(len(names), len(self.levels))}  # fmt: skip
        values = {f"{prefix}": {"levels": list(self.levels), "log": self.log, "min_group": self.min_group,
                                "groups": names, "n_cal": self.n_cal}}  # fmt: skip
        return arrays, values

    @classmethod
    def from_state(cls, arrays: dict[str, np.ndarray], values: dict[str, Any], prefix: str = "conformal") -> ConformalQuantiles:
        v = values[prefix]
        c = cls(v["levels"], v["log"], v["min_group"])
        c.global_offsets = np.asarray(arrays[f"{prefix}_global"], dtype=float)
        c.groups = {n: np.asarray(row, dtype=float) for n, row in zip(v["groups"], arrays[f"{prefix}_groups"])}
        c.n_cal = int(v["n_cal"])
        return c
