"""Reading predicted lengths off a request: the statistic a length-aware policy orders by.

Policies take a `stat` option, one of `STATS`:

- `mean`      E[L], and while generating E[L - g | L > g] (progressive refinement: a request that
              outlives its prediction is re-estimated from the tail of its distribution);
- `median`, `qNN` (q10 ... q99)  the quantile of L, and of L - g given L > g;
- `point`     the predictor's point estimate, counted down: max(point - g, 1);
- `rank`      the ranker's score (larger = longer; ListMLE); no remaining form, so it is used as is.

`total(stat)` and `remaining(stat)` return fast functions of the seq. A seq without an estimate
is an error that names the request: run the policy with a predictor (`estimates=` in the
simulator, `predictor:` in the gateway).
"""

from __future__ import annotations

from typing import Callable

from presched.predict.estimate import LEVELS

QUANTILES = {f"q{round(p * 100)}": p for p in LEVELS} | {"median": 0.5}
STATS = ("mean", "point", "rank", *QUANTILES)


def check_stat(stat: str) -> str:
    if stat not in STATS:
        raise ValueError(f"field 'stat': unknown statistic {stat!r}; known: {', '.join(STATS)}")
    return stat


def estimate_of(seq):
    est = seq.estimate
    if est is None:
        raise ValueError(
            f"request {seq.request.id!r} has no length prediction; this policy needs one "
            "(command line: --set predictions.source=noisy-oracle, prompt-oracle, or model with "
            "predictions.path=FILE from `presched train`; Python: simulate(..., "
            "estimates=predictor.predict(requests)); gateway: a predictor)"
        )
    return est


def total(stat: str) -> Callable[[object], float]:
    """f(seq) -> the statistic of the request's whole output length."""
    check_stat(stat)
    if stat == "mean":
        return lambda seq: estimate_of(seq).mean
    if stat == "point":
        return lambda seq: estimate_of(seq).point
    if stat == "rank":
        return lambda seq: estimate_of(seq).rank_score
    p = QUANTILES[stat]
    return lambda seq: estimate_of(seq).quantile(p)


def remaining(stat: str) -> Callable[[object], float]:
    """f(seq) -> the statistic of the tokens still to come, given seq.generated so far."""
    check_stat(stat)
    if stat == "mean":
        return lambda seq: estimate_of(seq).mean_remaining(seq.generated)
    if stat == "point":
        return lambda seq: max(estimate_of(seq).point - seq.generated, 1.0)
    if stat == "rank":
        return lambda seq: estimate_of(seq).rank_score
    p = QUANTILES[stat]
    return lambda seq: estimate_of(seq).quantile_remaining(seq.generated, p)
