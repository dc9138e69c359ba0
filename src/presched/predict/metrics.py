"""Accuracy metrics for output-length predictors: small functions over arrays.

Conventions: `y` is the target per request (the mean of its uncapped samples, see
`training_targets`), `pred` a point estimate, `score` a ranking score (larger = predicted longer),
`q` the (n × len(LEVELS)) quantile matrix of a `LengthEstimate`. All lengths are tokens.

| metric | definition |
|---|---|
| `mae`, `rmse` | mean |pred − y|, sqrt(mean (pred − y)²) |
| `acc_within(k)` | share with |pred − y| ≤ k tokens (Acc-50 / Acc-100 as in Zheng et al. 2023 `src/eval.py`, MAPS) |
| `class_accuracy` | SSJF's 5 percentile classes: edges = p25, p50, p75, p99 of the *training* targets; share of requests whose predicted class (from pred) equals the true class (from y) |
| `kendall_tau_b`, `spearman` | scipy, between score and y (nan if either is constant) |
| `within_model_tau` | τ-b per served model, averaged weighted by request count |
| `pairwise_accuracy` | over all pairs with different y: share ordered the same way by score, a tie in score counting ½; exact (derived from τ-b's concordant/discordant counts, O(n log n)) |
| `coverage` | per level τ: mean(y ≤ q_τ) |
| `coverage_samples` | per level: share of all observed (uncapped) single samples ≤ q_τ |
| `pinball_loss` | mean over levels and requests of max(τ(y − q_τ), (τ − 1)(y − q_τ)) |
| `under_prediction_q90` | mean(y > q90) |
| `max_coverage_error_pts` | max over q10…q90 of |coverage − τ|, in percentage points |

`score_all` computes every metric for one estimate (and the single-sample variants) as a flat dict.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from scipy import stats

from presched.predict.base import CAP, request_samples, training_targets
from presched.predict.estimate import LEVELS, LengthEstimate
from presched.workload.request import Request

_L = np.asarray(LEVELS)
SSJF_PERCENTILES = (25.0, 50.0, 75.0, 99.0)
"""SSJF's 5 classes are bounded by these percentiles of the training lengths (Qiu et al. 2024,
`preprocess_dataset.py`; first-turn LMSYS edges 42 / 141 / 294 / 503)."""
CENTRAL = tuple(i for i, lv in enumerate(LEVELS) if lv <= 0.9 + 1e-9)
"""Indices of q10…q90, the levels `max_coverage_error_pts` looks at."""


def _arr(x) -> np.ndarray:
    return np.asarray(x, dtype=float).reshape(-1)


# --- point accuracy ------------------------------------------------------------------------------
def mae(pred, y) -> float:
    """Mean absolute error, tokens."""
    return float(np.mean(np.abs(_arr(pred) - _arr(y))))


def rmse(pred, y) -> float:
    """Root mean squared error, tokens."""
    return float(np.sqrt(np.mean((_arr(pred) - _arr(y)) ** 2)))


def acc_within(pred, y, k: float) -> float:
    """Acc-k: share of requests with |pred − y| ≤ k tokens (Acc-50, Acc-100 in the literature)."""
    return float(np.mean(np.abs(_arr(pred) - _arr(y)) <= k))


def ssjf_edges(train_targets) -> np.ndarray:
    """The 4 inner edges of SSJF's 5 classes: p25, p50, p75, p99 of the training targets."""
    t = _arr(train_targets)
    return np.percentile(t[np.isfinite(t)], SSJF_PERCENTILES)


def length_class(x, edges) -> np.ndarray:
    """Class index 0…len(edges) of each length: class c holds edges[c-1] ≤ x < edges[c]."""
    return np.searchsorted(np.asarray(edges, dtype=float), _arr(x), side="right")


def class_accuracy(pred, y, edges) -> float:
    """Share of requests whose predicted class equals the true class (classes from `edges`)."""
    return float(np.mean(length_class(pred, edges) == length_class(y, edges)))


# --- ranking ------------------------------------------------------------------------------------
def kendall_tau_b(score, y) -> float:
    """Kendall τ-b (ties in either variable corrected), scipy; nan if either is constant."""
    s, t = _arr(score), _arr(y)
    if len(s) < 2 or np.ptp(s) == 0 or np.ptp(t) == 0:
        return float("nan")
    return float(stats.kendalltau(s, t, variant="b").statistic)


def spearman(score, y) -> float:
    """Spearman rank correlation, scipy; nan if either is constant."""
    s, t = _arr(score), _arr(y)
    if len(s) < 2 or np.ptp(s) == 0 or np.ptp(t) == 0:
        return float("nan")
    return float(stats.spearmanr(s, t).statistic)


def _tied_pairs(*cols: np.ndarray) -> float:
    """Number of pairs equal in every given column."""
    _, counts = np.unique(np.column_stack(cols), axis=0, return_counts=True)
    return float(np.sum(counts * (counts - 1) / 2))


def pairwise_accuracy(score, y) -> float:
    """Over ALL pairs (i, j) with y_i ≠ y_j: share where score orders them the same way as y;
    pairs tied in score count ½ (a coin flip). Exact, from the tie counts and τ-b:
    C − D = τ_b·sqrt((n0 − n1)(n0 − n2)), C + D = (n0 − n2) − (n1 − n3), where n0 = all pairs,
    n1 / n2 = pairs tied in score / in y, n3 = tied in both. nan if all y are equal."""
    s, t = _arr(score), _arr(y)
    n = len(s)
    n0 = n * (n - 1) / 2
    n1, n2, n3 = _tied_pairs(s), _tied_pairs(t), _tied_pairs(s, t)
    differ_y = n0 - n2
    if differ_y <= 0:
        return float("nan")
    tied_s_only = n1 - n3
    if n0 - n1 <= 0:  # score constant: every pair is a tie
        return 0.5
    c_minus_d = float(stats.kendalltau(s, t, variant="b").statistic) * np.sqrt((n0 - n1) * differ_y)
    c_plus_d = differ_y - tied_s_only
    concordant = (c_minus_d + c_plus_d) / 2
    return float((concordant + 0.5 * tied_s_only) / differ_y)


def pairwise_accuracy_bruteforce(score, y) -> float:
    """The same by counting every pair (O(n²)); for tests and small sets."""
    s, t = _arr(score), _arr(y)
    ds = np.sign(s[:, None] - s[None, :])
    dt = np.sign(t[:, None] - t[None, :])
    mask = np.triu(dt != 0, k=1)
    if not mask.any():
        return float("nan")
    agree = (ds == dt)[mask].sum() + 0.5 * (ds == 0)[mask].sum()
    return float(agree / mask.sum())


def within_model_tau(score, y, models) -> float:
    """τ-b computed separately for each served model, averaged weighted by its request count
    (what one model's queue sees: the pooled τ also rewards knowing which model is verbose).
    Models whose score or target is constant are left out; nan if none is left."""
    s, t, m = _arr(score), _arr(y), np.asarray(models)
    taus, weights = [], []
    for name in np.unique(m):
        sel = m == name
        tau = kendall_tau_b(s[sel], t[sel])
        if np.isfinite(tau):
            taus.append(tau)
            weights.append(sel.sum())
    return float(np.average(taus, weights=weights)) if taus else float("nan")


# --- distribution quality ------------------------------------------------------------------------
def coverage(q, y) -> np.ndarray:
    """Empirical coverage per level: mean(y ≤ q[:, j]) for each j (nominal = LEVELS[j])."""
    return np.mean(_arr(y)[:, None] <= np.asarray(q, dtype=float), axis=0)


def coverage_samples(q, samples: Sequence[np.ndarray]) -> np.ndarray:
    """Coverage against single runs: per level, the share of ALL observed samples (every
    request's uncapped samples, each sample one event) at or below that request's quantile."""
    q = np.asarray(q, dtype=float)
    hits = np.zeros(q.shape[1])
    total = 0
    for row, s in zip(q, samples):
        s = np.asarray(s, dtype=float)
        if s.size:
            hits += (s[:, None] <= row[None, :]).sum(axis=0)
            total += s.size
    return hits / total if total else np.full(q.shape[1], np.nan)


def pinball_loss(q, y) -> float:
    """Quantile (pinball) loss averaged over all levels and requests, tokens."""
    q = np.asarray(q, dtype=float)
    d = _arr(y)[:, None] - q
    return float(np.mean(np.maximum(_L * d, (_L - 1) * d)))


def under_prediction_q90(q, y) -> float:
    """Share of requests longer than their predicted q90 (nominal 10 %)."""
    return float(np.mean(_arr(y) > np.asarray(q, dtype=float)[:, LEVELS.index(0.9)]))


def max_coverage_error_pts(cov) -> float:
    """Largest |empirical − nominal| coverage over q10…q90, in percentage points."""
    cov = np.asarray(cov, dtype=float)
    return float(100 * np.max(np.abs(cov[list(CENTRAL)] - _L[list(CENTRAL)])))


def coverage_noise_floor_pts(n: int, trials: int = 2000, seed: int = 0) -> float:
    """What `max_coverage_error_pts` scores for a perfectly calibrated predictor on n requests,
    from sampling noise alone: the mean over `trials` of max over q10...q90 of |coverage - level|
    for n exact uniform PIT draws (seeded). ~4.9 pts at n = 200; shrinks like 1 / sqrt(n)."""
    if not 1 <= n <= 10**6:
        raise ValueError(f"n: expected 1..1000000 requests, got {n}")
    rng = np.random.default_rng(seed)
    lv = _L[list(CENTRAL)]
    u = rng.random((trials, n))
    cov = (u[:, :, None] <= lv).mean(axis=1)
    return float(np.abs(cov - lv).max(axis=1).mean() * 100)


# --- everything at once -------------------------------------------------------------------------
def targets_and_samples(requests: Sequence[Request]) -> tuple[np.ndarray, list[np.ndarray], np.ndarray, np.ndarray]:
    """(y, samples, first, keep) for scoring: y = mean of uncapped samples (nan if none),
    samples = each request's uncapped samples, first = its sample 0 (nan if capped or absent),
    keep = y is finite."""
    y, keep = training_targets(requests)
    samples = [request_samples(r) for r in requests]
    first = np.full(len(requests), np.nan)
    for i, r in enumerate(requests):
        s0 = r.output_samples[0] if r.output_samples else r.output_tokens
        if s0 is not None and s0 < CAP:
            first[i] = s0
    return y, samples, first, keep


def score_all(est: LengthEstimate, requests: Sequence[Request], edges) -> dict[str, float | list[float]]:
    """Every metric of one estimate against `requests`' labels. Requests without a usable
    target are left out (their count is `n_unlabelled`); single-sample metrics use sample 0
    (rows whose sample 0 hit the cap are left out) and coverage uses all uncapped samples."""
    y, samples, first, keep = targets_and_samples(requests)
    q, point, rank = est.quantiles[keep], est.point[keep], est.rank_score[keep]
    y, first = y[keep], first[keep]
    samples = [s for s, k in zip(samples, keep) if k]
    models = np.array([r.model for r in requests])[keep]
    cov = coverage(q, y)
    cov_s = coverage_samples(q, samples)
    one = np.isfinite(first)
    out: dict[str, float | list[float]] = {
        "n": int(keep.sum()),
        "n_unlabelled": int((~keep).sum()),
        "mae": mae(point, y),
        "rmse": rmse(point, y),
        "acc50": acc_within(point, y, 50),
        "acc100": acc_within(point, y, 100),
        "class5_acc": class_accuracy(point, y, edges),
        "kendall_tau_b": kendall_tau_b(rank, y),
        "spearman": spearman(rank, y),
        "pairwise_acc": pairwise_accuracy(rank, y),
        "coverage": cov.tolist(),
        "coverage_samples": cov_s.tolist(),
        "max_coverage_error_pts": max_coverage_error_pts(cov),
        "max_coverage_error_pts_samples": max_coverage_error_pts(cov_s),
        "pinball": pinball_loss(q, y),
        "under_q90": under_prediction_q90(q, y),
        "under_q90_samples": float(1 - cov_s[LEVELS.index(0.9)]),
        "kendall_tau_b_within_model": within_model_tau(rank, y, models),
        "mae_single": mae(point[one], first[one]),
        "kendall_tau_b_single": kendall_tau_b(rank[one], first[one]),
    }
    return out
