"""The embedded default workload: Azure-conversation-like requests with no files needed.

`default_workload()` draws prompt and output lengths from empirical quantile tables fitted to
the Azure LLM 2023 conversation trace (19,366 requests), stored in
`presched/workload/data/default_lengths.json` (regenerate with
`python benchmarks/fit_default_workload.py`), and gives them Poisson arrivals at the trace's mean
rate (5.53 req/s) unless `rate` is given.

Sampling is inverse-CDF: for u ~ U(0, 1), length = round(interp(u, levels, quantiles)), at least
1. The levels are every percentile plus 99.5 % and 99.9 % so the long tail (prompts up to 14k
tokens) keeps the mean close to the trace's.

Prompt and output lengths are drawn **independently**. The trace shows little dependence
(Spearman rank correlation +0.07, Pearson -0.11, printed by the fit script), so a joint table
would add size for almost no fidelity; use the `azure-conv` loader when exact pairs matter.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import numpy as np

from presched.workload.arrivals import _check_n, _check_positive, poisson
from presched.workload.request import Request

TABLE_RESOURCE = "data/default_lengths.json"


@dataclass(frozen=True)
class LengthTable:
    """Quantiles of prompt and output tokens at `levels` (probabilities 0..1, increasing)."""

    levels: tuple[float, ...]
    prompt_tokens: tuple[float, ...]
    output_tokens: tuple[float, ...]
    rate: float
    """Mean arrival rate of the fitted trace, (n - 1) / span, requests per second."""

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

    @classmethod
    def from_dict(cls, d: dict) -> LengthTable:
        return cls(
            levels=tuple(d["levels"]),
            prompt_tokens=tuple(d["prompt_tokens"]),
            output_tokens=tuple(d["output_tokens"]),
            rate=float(d["rate"]),
        )


@lru_cache(maxsize=1)
def default_table() -> LengthTable:
    """The packaged table (read once)."""
    text = resources.files("presched.workload").joinpath(TABLE_RESOURCE).read_text("utf-8")
    return LengthTable.from_dict(json.loads(text))


def default_workload(
    num_requests: int = 2000, rate: float | None = None, seed: int = 0
) -> list[Request]:
    """`num_requests` Azure-conversation-like requests with Poisson arrivals at `rate` req/s
    (default: the trace's 5.53). Same seed -> same requests. Ids are `default-000000`, ..."""
    n = _check_n(num_requests)
    table = default_table()
    rate = table.rate if rate is None else _check_positive("rate", rate)
    rng = np.random.default_rng(seed)
    times = poisson(n, rate, rng)
    prompt, output = table.sample(n, rng)
    return [
        Request(id=f"default-{i:06d}", prompt_tokens=int(p), arrival=float(t), output_tokens=int(o))
        for i, (t, p, o) in enumerate(zip(times, prompt, output))
    ]
