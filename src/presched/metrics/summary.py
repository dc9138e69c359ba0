"""Aggregate metrics of a run, named as `vllm bench serve` names them.

Latencies are reported in milliseconds as mean_/median_/p90_/p99_ + {ttft, tpot, itl, e2el,
queue_wait}_ms, and normalized latency as ..._normalized_ms_per_token. See docs/metrics.md for the
formulas of every figure.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from pydantic import Field

from presched.config import Config
from presched.metrics.records import RecordTable

PERCENTILES = (50, 90, 99)


class GoodputSLO(Config):
    """Service-level objectives for request goodput, as `vllm bench serve --goodput`."""

    ttft_ms: float | None = Field(None, gt=0, description="TTFT objective in ms (a request meets it if TTFT <= this).")
    tpot_ms: float | None = Field(None, gt=0, description="TPOT objective in ms (excl. first token).")
    e2el_ms: float | None = Field(None, gt=0, description="End-to-end latency objective in ms.")

    def is_set(self) -> bool:
        return any(v is not None for v in (self.ttft_ms, self.tpot_ms, self.e2el_ms))


def weighted_percentile(values: np.ndarray, weights: np.ndarray, q: float | list[float]):
    """The smallest value v such that at least q% of the weight lies at or below v (the
    'inverted CDF' percentile of the data with each value repeated `weight` times).
    `q` may be a list: one sort serves them all."""
    qs = [q] if np.isscalar(q) else list(q)
    if len(values) == 0:
        res = [math.nan] * len(qs)
    else:
        order = np.argsort(values)
        v, w = values[order], np.cumsum(weights[order])
        idx = np.searchsorted(w, np.asarray(qs, dtype=float) / 100.0 * w[-1], side="left")
        res = [float(x) for x in v[np.minimum(idx, len(v) - 1)]]
    return res[0] if np.isscalar(q) else res


def _stats(name: str, x: np.ndarray, scale: float, out: dict[str, Any], unit: str = "ms") -> None:
    x = x[~np.isnan(x)] * scale
    out[f"mean_{name}_{unit}"] = float(x.mean()) if x.size else math.nan
    for p in PERCENTILES:
        key = "median" if p == 50 else f"p{p}"
        out[f"{key}_{name}_{unit}"] = float(np.percentile(x, p)) if x.size else math.nan


def jain_index(x: np.ndarray) -> float:
    """Jain's fairness index (sum x)^2 / (n sum x^2): 1 = equal, 1/n = one gets everything."""
    x = np.asarray(x, dtype=float)
    if x.size == 0 or not np.any(x):
        return math.nan
    return float(x.sum() ** 2 / (x.size * np.square(x).sum()))


def summarize(
    rec: RecordTable,
    itl: tuple[np.ndarray, np.ndarray] | None = None,
    slo: GoodputSLO | None = None,
) -> dict[str, Any]:
    """All aggregate figures of one run. `itl` = (gap seconds, weights) over every pair of
    consecutive tokens; None to derive ITL stats from each request's mean gap (TPOT)."""
    out: dict[str, Any] = {}
    n = len(rec)
    out["completed"] = n
    if n == 0:
        return out
    duration = float(rec.finish.max() - rec.arrival.min())
    out["duration_s"] = duration
    out["total_input_tokens"] = int(rec.prompt_tokens.sum())
    out["total_output_tokens"] = int(rec.output_tokens.sum())
    out["request_throughput"] = n / duration if duration > 0 else math.nan
    out["output_throughput"] = out["total_output_tokens"] / duration if duration > 0 else math.nan
    out["total_token_throughput"] = (
        (out["total_input_tokens"] + out["total_output_tokens"]) / duration if duration > 0 else math.nan
    )
    e2el, ttft, tpot, wait = rec.e2el, rec.ttft, rec.tpot, rec.queue_wait
    _stats("ttft", ttft, 1e3, out)
    _stats("tpot", tpot, 1e3, out)
    if itl is not None and len(itl[0]):
        v, w = itl
        out["mean_itl_ms"] = float(np.dot(v, w) / w.sum() * 1e3)
        for p, x in zip(PERCENTILES, weighted_percentile(v, w, list(PERCENTILES))):
            out[f"{'median' if p == 50 else f'p{p}'}_itl_ms"] = x * 1e3
    else:
        _stats("itl", tpot, 1e3, out)
    _stats("e2el", e2el, 1e3, out)
    _stats("queue_wait", wait, 1e3, out)
    _stats("normalized", rec.normalized, 1e3, out, unit="ms_per_token")

    order = np.argsort(rec.output_tokens, kind="stable")
    half = max(n // 2, 1)
    out["short_p99_e2el_ms"] = float(np.percentile(e2el[order[:half]], 99) * 1e3)
    out["long_p99_queue_wait_ms"] = float(np.percentile(wait[order[n - half:]], 99) * 1e3)
    out["max_queue_wait_ms"] = float(wait.max() * 1e3)
    out["preemptions"] = int(rec.preemptions.sum())
    out["preempted_requests"] = int((rec.preemptions > 0).sum())
    out["recomputed_tokens"] = int(rec.recomputed_tokens.sum())

    tenants, inv = np.unique(rec.tenant.astype(str), return_inverse=True)
    speed = 1.0 / np.bincount(inv, weights=rec.normalized) * np.bincount(inv)
    out["num_tenants"] = int(len(tenants))
    out["jain_fairness"] = jain_index(speed)

    good = _meets_slo(rec, ttft, tpot, e2el, slo)
    if good is not None:
        out["good_requests"] = int(good.sum())
        out["request_goodput"] = float(good.sum() / duration) if duration > 0 else math.nan
        out["slo_attainment"] = float(good.mean())
    return out


def _meets_slo(rec, ttft, tpot, e2el, slo: GoodputSLO | None) -> np.ndarray | None:
    """Per-request SLOs (Request.slo_*) override the run-wide `slo`; unset = no constraint."""
    glob = slo or GoodputSLO()
    any_request_slo = any(np.isfinite(getattr(rec, f)).any() for f in ("slo_ttft", "slo_tpot", "slo_e2e"))
    if not glob.is_set() and not any_request_slo:
        return None
    ok = np.ones(len(rec), dtype=bool)
    for own, value, limit_ms in (
        (rec.slo_ttft, ttft, glob.ttft_ms),
        (rec.slo_tpot, tpot, glob.tpot_ms),
        (rec.slo_e2e, e2el, glob.e2el_ms),
    ):
        limit = np.where(np.isfinite(own), own, math.inf if limit_ms is None else limit_ms / 1e3)
        with np.errstate(invalid="ignore"):
            ok &= ~(value > limit)  # NaN (e.g. TPOT of a 1-token reply) meets the objective
    return ok
