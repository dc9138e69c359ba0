"""Capacity of a deployment: its maximum output-token throughput on a given set of requests.

Measured the way a load test finds saturation: every request arrives at t = 0 and the engine
(FCFS) works through the backlog; capacity = output tokens generated while requests were still
waiting to start / that time (the drain at the end, with a shrinking batch, is left out).
Tokens of a request up to time X are interpolated linearly between its first token and finish. Load ρ then means offered
output tokens per second = ρ × capacity, i.e. request rate = ρ × capacity / mean output length.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from presched.sim.setup import SimConfig, simulate
from presched.workload.request import Request


def saturated_throughput(requests: Sequence[Request], sim: SimConfig) -> float:
    """Output tokens per second when all `requests` are queued at once (FCFS)."""
    burst = [dataclasses.replace(r, arrival=0.0) for r in requests]
    res = simulate(burst, sim.model_copy(update={"policy": "fcfs", "policy_params": {}}))
    rec = res.records
    x = float(rec.first_scheduled.max())  # the backlog is gone after the last admission
    if x <= 0:  # everything fit in the first step: no backlog, use the makespan
        return float(rec.output_tokens.sum()) / float(rec.finish.max())
    span = np.maximum(rec.finish - rec.first_token, 1e-12)
    frac = np.clip((x - rec.first_token) / span, 0.0, 1.0)
    tokens = np.where(rec.first_token <= x, 1 + frac * (rec.output_tokens - 1), 0.0)
    return float(tokens.sum()) / x
