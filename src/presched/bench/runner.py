"""`run_bench`: replay one workload under every (load, policy) pair and collect summaries."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from presched.bench.capacity import saturated_throughput
from presched.bench.config import BenchConfig
from presched.metrics.summary import summarize
from presched.predict.source import predictions_for
from presched.sim.setup import simulate
from presched.workload.arrivals import apply_arrivals, rescale
from presched.workload.config import build_workload
from presched.workload.request import Request


@dataclass
class BenchResult:
    config: BenchConfig
    capacity_tok_s: float
    mean_output_tokens: float
    rows: list[dict[str, Any]] = field(default_factory=list)
    wall_seconds: float = 0.0


def arrivals_at_load(requests: list[Request], load: float, capacity_tok_s: float) -> list[Request]:
    """The same requests with arrival times rescaled so the offered output-token rate is
    `load * capacity_tok_s` (the arrival pattern's shape is kept)."""
    mean_out = float(np.mean([r.target_tokens for r in requests]))
    rate = load * capacity_tok_s / mean_out
    times = np.array([r.arrival for r in requests])
    if np.ptp(times) == 0:
        raise ValueError("the workload has no arrival times to rescale: choose arrivals poisson or gamma")
    return apply_arrivals(requests, rescale(times, rate))


def run_bench(
    cfg: BenchConfig,
    on_run: Callable[[str], None] | None = None,
    requests: list[Request] | None = None,
) -> BenchResult:
    """`on_run(label)` is called after each simulation (for progress bars)."""
    wall = time.perf_counter()
    reqs = requests if requests is not None else build_workload(cfg.workload)
    if not reqs:
        raise ValueError("the workload is empty")
    capacity = saturated_throughput(reqs[: cfg.capacity_requests], cfg.sim)
    if on_run:
        on_run("capacity")
    mean_out = float(np.mean([r.target_tokens for r in reqs]))
    estimates = predictions_for(reqs, cfg.predictions)  # rescaling arrivals keeps the order
    result = BenchResult(cfg, capacity, mean_out)
    for load in cfg.loads:
        loaded = arrivals_at_load(reqs, load, capacity)
        for policy in cfg.policies:
            sim = cfg.sim.model_copy(
                update={"policy": policy, "policy_params": cfg.policy_params.get(policy, {})}
            )
            res = simulate(loaded, sim, estimates=estimates)
            row: dict[str, Any] = {"load": load, "policy": policy,
                                   "rate_req_s": len(loaded) / max(loaded[-1].arrival, 1e-9)}  # fmt: skip
            row.update(summarize(res.records, res.itl.values(), cfg.slo))
            row["sim_wall_s"] = res.wall_seconds
            row["sim_steps"] = res.num_steps
            result.rows.append(row)
            if on_run:
                on_run(f"load {load:.2f} {policy}")
    result.wall_seconds = time.perf_counter() - wall
    return result
