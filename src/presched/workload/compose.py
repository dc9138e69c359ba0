"""Composition: one source's arrival times with another source's request contents.

Traces with real timestamps (Azure, Mooncake) have no prompt text; data sets with text and
per-model output lengths (CASTILLO, ShareGPT) have no timestamps. `compose` joins them: every
request of `arrivals_from` keeps its `id`, `arrival`, `max_tokens` and SLOs (and its `tenant`
when it is not "default"), and takes `prompt_tokens`, `output_tokens`, `prompt`, `model` and
`output_samples` (and the prompt's prefix-cache `block_hashes`) from a request of `lengths_from`
drawn by a seeded RNG. The result's metadata is the donor's metadata plus `length_source` (the
donor's id); the timing request's own metadata and block hashes (e.g. Mooncake's, which describe
its old prompt) are dropped.

Draws are with replacement by default; `replace=False` walks one seeded permutation of
`lengths_from` and cycles through it again when `arrivals_from` is longer, so every donor is used
once before any is reused. The same seed always gives the same result.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from presched.workload.request import Request


def compose(
    arrivals_from: Sequence[Request],
    lengths_from: Sequence[Request],
    seed: int = 0,
    replace: bool = True,
) -> list[Request]:
    """Requests timed like `arrivals_from` with contents drawn from `lengths_from`, in the order
    of `arrivals_from`."""
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
        raise TypeError(f"seed: expected an integer, got {seed!r}")
    n, m = len(arrivals_from), len(lengths_from)
    if n == 0:
        return []
    if m == 0:
        raise ValueError("lengths_from: is empty, there are no lengths to draw")
    rng = np.random.default_rng(int(seed))
    if replace:
        picks = rng.integers(0, m, size=n)
    else:
        perm = rng.permutation(m)
        picks = np.resize(perm, n)  # cycles the permutation when n > m
    out = []
    for a, j in zip(arrivals_from, picks):
        b = lengths_from[int(j)]
        out.append(
            dataclasses.replace(
                a,
                prompt_tokens=b.prompt_tokens,
                output_tokens=b.output_tokens,
                prompt=b.prompt,
                model=b.model,
                output_samples=b.output_samples,
                block_hashes=b.block_hashes,
                hash_block_tokens=b.hash_block_tokens,
                tenant=a.tenant if a.tenant != "default" else b.tenant,
                metadata={**b.metadata, "length_source": b.id},
            )
        )
    return out
