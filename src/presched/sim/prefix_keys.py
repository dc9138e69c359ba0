"""From a request's block hashes to the prefix cache's unit keys (`prefix_cache.py`).

A unit is `hash_block_tokens` tokens when that is a multiple of the engine's block size (units
of several blocks: Mooncake's 512-token hashes), or one block when the hashes are finer (each
block named by the chain hash of its last piece). Another size is refused naming the field.
"""

from __future__ import annotations

from presched.workload.request import Request


class PrefixCacheError(ValueError):
    """A request's block hashes do not fit the engine's block size."""


def unit_keys(r: Request, block_size: int) -> tuple[tuple[int, ...], int]:
    """(unit keys, tokens per unit) of request `r`; ((), 0) when it has no hashes."""
    hashes, h, bs = r.block_hashes, r.hash_block_tokens, block_size
    if not hashes:
        return (), 0
    if h % bs == 0:
        return hashes, h
    if bs % h == 0:  # finer hashes: a block is named by the chain hash of its last piece
        step = bs // h
        return hashes[step - 1 :: step], bs
    raise PrefixCacheError(
        f"request {r.id!r}: field 'hash_block_tokens' = {h} (workload.shared_prefix."
        f"block_tokens, for generated prefixes) is neither a multiple nor a divisor of "
        f"engine.block_size = {bs}"
    )
