"""The embedded default workload: bursty arrivals and heavy-tailed lengths, with no files needed.

`default_workload()` draws from empirical quantile tables stored in
`presched/workload/data/default_lengths.json` (regenerate with
`python benchmarks/fit_default_workload.py`):

- **arrivals**: interarrival gaps from the Azure LLM 2023 *code* trace (8,819 requests; gaps in
  units of the trace's mean gap, CV 13: long silences and bursts), drawn independently and scaled
  to the trace's mean rate (2.57 req/s) unless `rate` is given. The gaps' order (how bursts
  cluster in time) is not kept; use the `azure-code` loader for that.
- **lengths**: prompt and output tokens of CASTILLO's Llama-3.1-8B generations (4,703 prompts,
  sample 0: outputs median 391, p99 ~1,400, max 15,001 tokens), drawn independently of each other.

This is a workload where ordering pays: bursts build queues, and a heavy tail of long answers
blocks short ones under FCFS. It has no prompt text, so text predictors cannot read it; the bench
gives its predictive policy the noisy oracle at `text_gbm_sigma`, the log-scale error whose
Kendall tau-b against the true lengths equals text-gbm's measured one on CASTILLO test prompts.

Sampling is inverse-CDF: for u ~ U(0, 1), value = interp(u, levels, quantiles); lengths are
rounded and at least 1. The levels are every percentile plus 99.5 % and 99.9 % so the tails keep
the means close to the data's. Gaps are divided by the table's own mean (the integral of the
interpolated quantile function), so the expected rate is exactly `rate`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import numpy as np

from presched.workload.arrivals import _check_n, _check_positive
from presched.workload.request import Request

TABLE_RESOURCE = "data/default_lengths.json"


@dataclass(frozen=True)
class LengthTable:
    """Quantiles of prompt tokens, output tokens and interarrival gaps at `levels`
    (probabilities 0..1, increasing)."""

    levels: tuple[float, ...]
    prompt_tokens: tuple[float, ...]
    output_tokens: tuple[float, ...]
    gaps: tuple[float, ...]
    """Interarrival gaps in units of the source trace's mean gap."""
    rate: float
    """Mean arrival rate of the source trace, (n - 1) / span, requests per second."""
    text_gbm_sigma: float
    """Noisy-oracle sigma at text-gbm's measured ranking accuracy on these lengths."""

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """`n` independent (prompt, output) token counts by inverse-CDF interpolation."""
        levels = np.asarray(self.levels)
        u_in = rng.random(n)
        u_out = rng.random(n)
        prompt = np.interp(u_in, levels, np.asarray(self.prompt_tokens))
        output = np.interp(u_out, levels, np.asarray(self.output_tokens))
        return (
            np.maximum(1, np.rint(prompt)).astype(np.int64),
            np.maximum(1, np.rint(output)).astype(np.int64),
        )

    def arrival_times(self, n: int, rate: float, rng: np.random.Generator) -> np.ndarray:
        """`n` arrival times starting at 0: independent gaps from the table, mean 1 / `rate`."""
        levels, q = np.asarray(self.levels), np.asarray(self.gaps)
        mean = float(np.sum(np.diff(levels) * (q[1:] + q[:-1]) / 2))  # E[interp(U)]
        gaps = np.interp(rng.random(max(n - 1, 0)), levels, q) / (mean * rate)
        return np.concatenate([[0.0], np.cumsum(gaps)])[:n]

    @classmethod
    def from_dict(cls, d: dict) -> LengthTable:
        return cls(
            levels=tuple(d["levels"]),
            prompt_tokens=tuple(d["prompt_tokens"]),
            output_tokens=tuple(d["output_tokens"]),
            gaps=tuple(d["gaps"]),
            rate=float(d["rate"]),
            text_gbm_sigma=float(d["text_gbm_sigma"]),
        )


@lru_cache(maxsize=1)
def default_table() -> LengthTable:
    """The packaged table (read once)."""
    text = resources.files("presched.workload").joinpath(TABLE_RESOURCE).read_text("utf-8")
    return LengthTable.from_dict(json.loads(text))


def default_workload(
    num_requests: int = 2000, rate: float | None = None, seed: int = 0
) -> list[Request]:
    """`num_requests` requests with Azure-code-like bursty arrivals at `rate` req/s (default: the
    trace's 2.57) and CASTILLO Llama-3.1-8B lengths. Same seed -> same requests. Ids are
    `default-000000`, ..."""
    n = _check_n(num_requests)
    table = default_table()
    rate = table.rate if rate is None else _check_positive("rate", rate)
    rng = np.random.default_rng(seed)
    times = table.arrival_times(n, rate, rng)
    prompt, output = table.sample(n, rng)
    return [
        Request(id=f"default-{i:06d}", prompt_tokens=int(p), arrival=float(t), output_tokens=int(o))
        for i, (t, p, o) in enumerate(zip(times, prompt, output))
    ]
