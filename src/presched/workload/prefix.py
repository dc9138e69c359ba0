"""Prefix-cache block hashes for requests: a chain hash over full blocks of token ids.

vLLM's automatic prefix caching names a full block by hash(parent block's hash, the block's
token ids), so equal hashes mean equal tokens from the start of the request through that block;
a partial last block has no hash. `chain_hashes` computes that chain; `with_hashes` attaches it
to a request (`Request.block_hashes`). The simulator, the gateway's routers and the synthetic
workloads all use this one function, so a prompt hashes the same under every driver.

Hashes are Python's `hash` of (parent, tuple of ints): deterministic across processes (ints and
tuples of ints are not salted by PYTHONHASHSEED) and 64-bit on 64-bit builds.
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

from presched.workload.request import Request

DEFAULT_BLOCK_TOKENS = 16
"""Tokens per hashed block by default: vLLM's default KV block size."""


def chain_hashes(
    tokens: Sequence[int], block_tokens: int = DEFAULT_BLOCK_TOKENS, parent: int = 0,
    limit: int | None = None,
) -> tuple[int, ...]:  # fmt: skip
    """Hashes of the full blocks of `tokens` (len(tokens) // block_tokens of them), each of its
    parent's hash and its own tokens; `parent` seeds the chain (e.g. a model or tenant salt).
    `limit`: hash at most that many blocks (routers that only look at a prompt's start)."""
    if block_tokens < 1:
        raise ValueError(f"field 'block_tokens': must be >= 1, got {block_tokens}")
    n = len(tokens) // block_tokens
    if limit is not None:
        n = min(n, limit)
    out = []
    h = parent
    for i in range(n):
        h = hash((h, tuple(tokens[i * block_tokens : (i + 1) * block_tokens])))
        out.append(h)
    return tuple(out)


def with_hashes(
    request: Request, tokens: Sequence[int], block_tokens: int = DEFAULT_BLOCK_TOKENS
) -> Request:
    """`request` with `block_hashes` of `tokens` (its prompt's token ids, optionally followed by
    its output's: a later turn of a conversation shares the earlier answer too)."""
    return dataclasses.replace(
        request, block_hashes=chain_hashes(tokens, block_tokens),
        hash_block_tokens=block_tokens,
    )  # fmt: skip
