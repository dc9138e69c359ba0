"""Automatic prefix caching (vLLM v1 semantics) on top of the block counts of `BlockManager`.

A request's KV is cached in *units*: consecutive full blocks named by one entry of its
`block_hashes` (a chain hash: equal keys = equal tokens from the start of the request through
that unit). A unit is `unit_tokens` tokens: the hash granularity of the request
(`Request.hash_block_tokens`, Mooncake's 512) when it is a multiple of the engine's block size,
or the block size itself when the hashes are finer (then every block is named by the chain hash
of its last piece). The rules, as in vLLM's `KVCacheManager` / `BlockPool`:

- **Hit** (admission of a waiting request): the longest run of its units, from the start, whose
  keys are cached is used instead of being computed, capped so that at least one token is left
  to compute (vLLM computes the last prompt token again for its logits). The request starts
  with `computed` = the hit tokens and holds those blocks by reference; a unit nobody held
  (reference count 0) leaves the free pool.
- **Insert**: when a request's computed tokens cover a unit whose key is not cached yet, that
  unit becomes cached (reference count 1, held by the request). If another request cached the
  same key meanwhile, this request's copy stays private (vLLM keeps a duplicate block).
- **Release** (finish or preemption by recompute): the reference counts drop; a unit that
  nobody holds stays cached and evictable; the request's private blocks become free. A
  preempted request's own units stay cached, so its recompute can hit them.
- **Evict**: free blocks count cached-but-unused units (so `free` keeps vLLM's meaning,
  `get_num_free_blocks`); allocating more blocks than the uncached free ones evicts
  unused units least recently released first, and within one request's release its last
  unit first (vLLM frees a request's blocks in reverse order). A unit in use is never evicted.

One simplification: vLLM's free queue mixes uncached and cached free blocks in one LRU list;
here uncached free blocks are used first and cached units only evicted when none are left (the
same as vLLM once every free block is cached, which a busy cache reaches quickly).

Per request the work is per unit (a Mooncake request of 12k tokens has 23 units), never per
token or per step: a step only compares `computed` with `seq.next_unit_end`.
"""

from __future__ import annotations

import math
from collections import OrderedDict

from presched.sim.block_manager import BlockManager
from presched.sim.seq import Seq


class PrefixCacheError(ValueError):
    """A request's block hashes do not fit the engine's block size."""


class CachingBlockManager(BlockManager):
    """`BlockManager` with prefix caching. `seq.blocks` still counts every block a request's
    KV uses, shared ones included, so the scheduler's rounding is unchanged; `free` counts the
    physically unused blocks (cached units nobody holds included)."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__(num_blocks, block_size)
        self.refs: dict[int, int] = {}  # cached unit key -> requests holding it
        self.unit_blocks: dict[int, int] = {}  # cached unit key -> its blocks
        self.lru: OrderedDict[int, None] = OrderedDict()  # keys held by nobody, eviction order
        self.evictable = 0  # blocks of the units in `lru` (part of `free`)
        self.hit_tokens = 0
        self.queried_tokens = 0
        self.prompt_hit_tokens = 0  # hits at each request's first admission (no recomputes)
        self.prompt_tokens = 0  # prompt tokens of the requests admitted the first time
        self.evicted_units = 0

    # --- per request, once, when it joins the instance ------------------------------------
    def prepare(self, seq: Seq) -> None:
        """Set `seq.keys` and `seq.unit_tokens` from its request's hashes (see module doc)."""
        r = seq.request
        hashes, h, bs = r.block_hashes, r.hash_block_tokens, self.block_size
        if not hashes:
            seq.keys, seq.unit_tokens = (), 0
        elif h % bs == 0:
            seq.keys, seq.unit_tokens = hashes, h
        elif bs % h == 0:  # finer hashes: a block is named by the chain hash of its last piece
            step = bs // h
            seq.keys, seq.unit_tokens = hashes[step - 1 :: step], bs
        else:
            raise PrefixCacheError(
                f"request {r.id!r}: field 'hash_block_tokens' = {h} is neither a multiple nor a "
                f"divisor of engine.block_size = {bs}"
            )
        seq.held = []
        seq.cached_upto = 0
        seq.next_unit_end = seq.unit_tokens if seq.keys else math.inf

    # --- admission ------------------------------------------------------------------------
    def lookup(self, seq: Seq, total: int) -> tuple[int, int]:
        """(units hit, blocks of them that leave the free pool) for a waiting request with
        `total` tokens; changes nothing."""
        keys, unit = seq.keys, seq.unit_tokens
        if not keys:
            return 0, 0
        refs = self.refs
        most = min(len(keys), (total - 1) // unit)
        n = revive = 0
        ub = unit // self.block_size
        while n < most:
            r = refs.get(keys[n])
            if r is None:
                break
            if r == 0:
                revive += ub
            n += 1
        return n, revive

    def acquire(self, seq: Seq, units: int, revive: int, total: int) -> int:
        """Give `seq` (waiting, holding no blocks) the first `units` cached units found by
        `lookup`; returns the tokens it no longer has to compute."""
        self.queried_tokens += total
        first = seq.first_scheduled is None
        if first:
            self.prompt_tokens += seq.prompt_tokens
        if not units:
            return 0
        refs, lru = self.refs, self.lru
        keys = seq.keys
        for key in keys[:units]:
            r = refs[key]
            if r == 0:
                del lru[key]
            refs[key] = r + 1
        held = seq.held
        held.extend(keys[:units])
        ub = seq.unit_tokens // self.block_size
        self.evictable -= revive
        self.free -= revive
        used = self.num_blocks - self.free
        if used > self.peak_used:
            self.peak_used = used
        seq.blocks = units * ub
        seq.cached_upto = units
        seq.next_unit_end = (units + 1) * seq.unit_tokens if units < len(keys) else math.inf
        hit = units * seq.unit_tokens
        self.hit_tokens += hit
        if first:
            self.prompt_hit_tokens += hit
        return hit

    # --- as KV is computed ----------------------------------------------------------------
    def insert(self, seq: Seq) -> None:
        """`seq.computed` reached `seq.next_unit_end`: cache the units it now covers."""
        keys, unit, refs = seq.keys, seq.unit_tokens, self.refs
        i, c = seq.cached_upto, seq.computed
        ub = unit // self.block_size
        while i < len(keys) and (i + 1) * unit <= c:
            key = keys[i]
            if key not in refs:
                refs[key] = 1
                self.unit_blocks[key] = ub
                seq.held.append(key)
            i += 1
        seq.cached_upto = i
        seq.next_unit_end = (i + 1) * unit if i < len(keys) else math.inf

    # --- allocation and release -------------------------------------------------------------
    def take(self, seq: Seq, extra: int) -> None:
        short = extra - (self.free - self.evictable)
        if short > 0:
            self._evict(short)
        super().take(seq, extra)

    def _evict(self, blocks: int) -> None:
        lru, refs, ub = self.lru, self.refs, self.unit_blocks
        while blocks > 0:
            key, _ = lru.popitem(last=False)
            del refs[key]
            b = ub.pop(key)
            self.evictable -= b
            self.evicted_units += 1
            blocks -= b

    def release(self, seq: Seq) -> None:
        refs, lru, ub = self.refs, self.lru, self.unit_blocks
        still_used = 0
        for key in reversed(seq.held):
            r = refs[key] - 1
            refs[key] = r
            if r:
                still_used += ub[key]
            else:
                lru[key] = None
                self.evictable += ub[key]
        self.free += seq.blocks - still_used
        seq.blocks = 0
        seq.held = []
        seq.cached_upto = 0
        seq.next_unit_end = seq.unit_tokens if seq.keys else math.inf

    @property
    def hit_rate(self) -> float:
        """Tokens found cached / tokens looked up at admissions (vLLM's prefix cache hit rate)."""
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0
