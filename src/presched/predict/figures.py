"""The evaluation harness's headline figures (`benchmarks/predictors.py` prints them): read from
an `Evaluation`'s rows; NaN where a view or predictor did not run."""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from presched.predict.evaluate import ANCHORS, DEFAULT, HELD_OUT_MODELS, Evaluation


def _get(result: Evaluation, view: str, name: str, key: str) -> float:
    for row in result.rows:
        if row["view"] == view and row["predictor"] == name and row.get("status") == "ok":
            v = row.get(key)
            return float(v) if v is not None else math.nan
    return math.nan


def _best(values: list[float], higher: bool) -> float:
    vals = [v for v in values if math.isfinite(v)]
    return (max(vals) if higher else min(vals)) if vals else math.nan


def headline_figures(result: Evaluation, default: str = DEFAULT, anchors: Sequence[str] = ANCHORS) -> dict[str, float]:
    """The benchmark's figures (in-dist view unless named):
    default / best-anchor Kendall τ-b and MAE (best of the anchors on each metric separately);
    max_coverage_error_pts of the default (q10…q90, vs the per-request mean target);
    cross_model_tau_drop = the default's τ-b on the 4 held-out models' test rows when they were
    in training (in-dist run) minus its τ-b on the same rows in the cross-model view (positive =
    worse on unseen models); default single-request latency p50 (ms)."""
    fig = {
        "default_kendall_tau": _get(result, "in-dist", default, "kendall_tau_b"),
        "best_anchor_kendall_tau": _best([_get(result, "in-dist", a, "kendall_tau_b") for a in anchors], True),
        "default_mae": _get(result, "in-dist", default, "mae"),
        "best_anchor_mae": _best([_get(result, "in-dist", a, "mae") for a in anchors], False),
        "max_coverage_error_pts": _get(result, "in-dist", default, "max_coverage_error_pts"),
        "cross_model_tau_drop": cross_model_tau_drop(result, default),
        "default_single_latency_ms": _get(result, "in-dist", default, "latency_single_p50_ms"),
    }
    return fig


def cross_model_tau_drop(result: Evaluation, name: str) -> float:
    """τ-b(in-dist predictions restricted to HELD_OUT_MODELS) − τ-b(cross-model view)."""
    from presched.predict.metrics import kendall_tau_b

    ind, cross = result.arrays.get(("in-dist", name)), result.arrays.get(("cross-model", name))
    if ind is None or cross is None:
        return math.nan
    sel = np.isin(ind["models"], HELD_OUT_MODELS)
    held = set(np.unique(cross["models"]))
    if not sel.any() or not held <= set(HELD_OUT_MODELS):
        return math.nan
    return kendall_tau_b(ind["rank"][sel], ind["y"][sel]) - kendall_tau_b(cross["rank"], cross["y"])
