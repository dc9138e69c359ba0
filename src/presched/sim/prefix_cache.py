"""Automatic prefix caching (vLLM v1 semantics) on top of the block counts of `BlockManager`.

A request's KV is cached in *units*: consecutive full blocks named by one entry of its
`block_hashes` (a chain hash: equal keys = equal tokens from the start of the request through
that unit). A unit is `unit_tokens` tokens: the hash granularity of the request
(`Request.hash_block_tokens`, Mooncake's 512) when it is a multiple of the engine's block size,
or the block size itself when the hashes are finer (then every block is named by the chain hash
of its last piece). The rules, as in vLLM's `KVCacheManager` / `BlockPool`:

- **Hit** (admission of a waiting request): the longest run of its units, from the start, that
  is cached is used instead of being computed, capped so that at least one token is left to
  compute (vLLM computes the last prompt token again for its logits). The request starts with
  `computed` = the hit tokens and holds those blocks by reference; a unit nobody held
  (reference count 0) leaves the free pool.
- **Insert**: when a step is scheduled whose tokens complete a unit of a request, that unit
  becomes cached (held by the request): vLLM caches full blocks when it allocates them
  (`allocate_slots` -> `cache_blocks`), so a request admitted later in the same step hits it
  (`cache_ahead`; without anyone to admit, the insert waits for the step's end, which nothing
  before it could tell apart; in the batch's order, as vLLM allocates). If another request
  cached the same unit meanwhile, this request keeps the copy it computed it in (vLLM never
  de-duplicates: a block table only grows): it holds the node with a copy of its own
  (`Node.dups`), while hits share the first copy.
- **Release** (finish or preemption by recompute): the reference counts drop; a unit whose
  first copy nobody shares stays cached and evictable; the request's own copies stay cached
  too, as spare free copies (`Node.spares`); its private blocks become free. Each free copy
  has its place in the LRU, and a unit stays cached until its last copy is evicted (evicting
  the first copy, a spare or else the oldest held own copy takes its place, as vLLM's next
  block of the hash does). A preempted request's own units stay cached, so its recompute can
  hit them.
- **Evict**: free blocks count cached-but-unused units (so `free` keeps vLLM's meaning,
  `get_num_free_blocks`); allocating more blocks than the uncached free ones evicts unused
  units, least recently released first, from the end of a prefix (within one request's
  release, its last unit first, as vLLM frees a request's blocks in reverse order). A unit in
  use is never evicted.

Uncached free blocks are used first and cached units evicted only when none are left, as vLLM
0.32's `BlockPool.free_blocks` puts freed blocks without a hash at the front of its free queue
and cached ones at the back. Simplification: which copy of a unit a hit gets (vLLM: the first
one the hash still has) is the first copy, or a spare in its place, not tracked further.

The cache is a radix tree of unit keys (`Node`: a run of keys that requests share or not as a
whole; a request holds a path from the root). Work per request is per node on its path, with
C-level tuple compares inside a node, not per unit: a step only compares `computed` with
`seq.next_unit_end`. A node does not copy its keys: it is a view, `src[start:end]`, of the key
tuple of a request that holds or held it (its request's `block_hashes` itself, when those are
the units), so caching, extending and evicting units move indices and touch no key object.
Requests whose units are of another size than the first one seen get keys of their own
(hash((unit_tokens, k)), a copy): equal numbers there name other tokens and other block counts.

Two pieces of work are done lazily, when someone could see them, never changing a result
(tests/sim/test_prefix_golden.py holds fingerprints of the eager version):

- **Own leaves.** A request whose deepest node is a leaf that it alone holds (the usual case
  once it computes past what it shares: its decode blocks) *owns* it (`node.owner`): the
  units it computes then are appended as vLLM would append them, but only when the node is
  read (`_sync`: by a lookup, an insert or acquire that walks into it, its release, an
  inspection), as the first `min(len(keys), computed // unit_tokens)` of its keys: the same
  units an eager insert after every step would have added. Its `next_unit_end` is `NEVER`
  meanwhile, so steps make no calls. Another request walking into it ends the ownership
  (`_claim`), and the owner's next full unit goes through `insert` again.
- **Evictions.** `take` only counts (the base class's); the blocks taken beyond the uncached
  free ones, `evictable - free`, are evicted by `_settle` before anything could see them or
  change the count: a lookup or acquire that meets units nobody holds, an insert that finds a
  cached run or decides by its own node's children, a release, an inspection. Between two
  such points only takes happen (and reads that meet units in use only, which evictions never
  touch), and LRU eviction of a + b blocks in one go picks the same units as a then b (the
  smallest LRU prefix that covers the total).
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque

from presched.sim.block_manager import BlockManager
from presched.sim.prefix_keys import PrefixCacheError, unit_keys  # noqa: F401 (PrefixCacheError: imported from here too)
from presched.sim.prefix_evict import CacheEviction
from presched.sim.prefix_inspect import CacheInspection
from presched.sim.prefix_node import Node, common, view
from presched.sim.seq import NEVER, Seq


class CachingBlockManager(CacheEviction, CacheInspection, BlockManager):
    """`BlockManager` with prefix caching. `seq.blocks` still counts every block a request's
    KV uses, shared ones included, so the scheduler's rounding is unchanged; `free` counts the
    physically unused blocks (cached units nobody holds included)."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        super().__init__(num_blocks, block_size)
        if num_blocks * block_size >= NEVER:  # `computed` must stay below it (seq.py)
            raise ValueError(f"prefix caching: num_blocks * block_size must be below {NEVER:,}, "
                             f"got {num_blocks * block_size:,}")  # fmt: skip
        self.root = Node((), 0, 0, 0, None, 1)
        self.evictable = 0  # blocks of the cached units nobody holds (part of `free`; before
        # `_settle`, the ones owed to evictions too)
        # leaves with reference 0, by stamp: released ones in release order (stamps only grow),
        # and a heap for parents that become leaves when their last child is evicted
        self._released: deque[tuple[int, Node]] = deque()  # (stamp, leaf)
        self._heap: list[tuple[int, int, Node]] = []  # (stamp, tie, leaf)
        self._clock = itertools.count(1)
        self.hit_tokens = 0
        self.queried_tokens = 0
        self.prompt_hit_tokens = 0  # hits at each request's first admission (no recomputes)
        self.prompt_tokens = 0  # prompt tokens of the requests admitted the first time
        self._evicted_units = 0
        self.coarse = False  # a request's units are several blocks (`prepare`; instance.py reads it)
        # requests holding blocks whose `next_unit_end` is finite (they will insert a unit;
        # owners of their leaf are not among them), in the order they became so: instance.py
        # `_cache_limit` reads them
        self.open: dict[Seq, None] = {}
        self._hit: tuple = ((), 0, self.root, 0)  # lookup's result for acquire
        self.ahead: dict[Seq, int] = {}  # while the scheduler admits: tokens each request of the
        # step computes (cached already, `cache_ahead`)
        self._unit: int | None = None  # the unit size whose keys are used as they are

    # --- per request, once, when it joins the instance ------------------------------------
    def prepare(self, seq: Seq) -> None:
        """Set `seq.keys` and `seq.unit_tokens` from its request's hashes (`prefix_keys.py`)."""
        seq.keys, seq.unit_tokens = unit_keys(seq.request, self.block_size)
        if seq.keys:
            if seq.unit_tokens > self.block_size:
                self.coarse = True
            if self._unit is None:
                self._unit = seq.unit_tokens
            elif seq.unit_tokens != self._unit:  # equal numbers of another unit size name other
                seq.keys = tuple(hash((seq.unit_tokens, k)) for k in seq.keys)  # tokens: own keys
        self._reset(seq)

    def _reset(self, seq: Seq) -> None:
        seq.cache_node = None
        seq.cached_upto = 0
        seq.next_unit_end = seq.unit_tokens if seq.keys else NEVER

    # --- admission ------------------------------------------------------------------------
    def lookup(self, seq: Seq, total: int) -> tuple[int, int]:
        """(units hit, blocks of them that leave the free pool) for a waiting request with
        `total` tokens; changes nothing. It remembers where the hit ends (`_hit`) for
        `acquire`, which the scheduler calls next if the request fits (nothing in between
        changes the tree)."""
        keys = seq.keys
        if not keys:
            return 0, 0
        most = (total - 1) // seq.unit_tokens
        if most > len(keys):
            most = len(keys)
        units, revive = self._walk(keys, most)
        if revive and self.evictable > self.free:  # it met units nobody holds: some may be owed
            self._settle()  # to evictions (units in use never are)
            units, revive = self._walk(keys, most)
        return units, revive

    def _walk(self, keys: tuple[int, ...], most: int) -> tuple[int, int]:
        node, i, revive, m = self.root, 0, 0, 0
        while i < most:
            child = node.children.get(keys[i])
            if child is None:
                break
            if child.owner is not None:
                self._sync(child)
            m = common(child, keys, i, most)
            d = child.dups
            if child.ref == (len(d) if d else 0):  # nobody holds its first copy: revived
                revive += m * child.ub
            i += m
            node = child
            if m < child.end - child.start:
                break
        self._hit = (keys, i, node, m)  # the deepest node met and the units matched in it
        return i, revive

    def acquire(self, seq: Seq, units: int, revive: int, total: int) -> int:
        """Give `seq` (waiting, holding no blocks) the first `units` cached units found by
        `lookup`; returns the tokens it no longer has to compute."""
        self.queried_tokens += total
        first = seq.first_scheduled is None
        if first:
            self.prompt_tokens += seq.prompt_tokens
        if not units:
            self._next_unit(seq, 0)
            return 0
        keys, found, node, m = self._hit
        if keys is not seq.keys or found != units:
            raise RuntimeError("acquire without the lookup of the same request just before it")
        if node.owner is not None:  # (an owned node is a leaf: only the deepest can be one)
            self._claim(node)
        if m < node.end - node.start:
            node = self._split(node, m)
        seq.cache_node = node
        root = self.root
        while node is not root:  # the path from the root: every node on it is held once more
            d = node.dups
            if node.ref == (len(d) if d else 0):  # its first copy leaves the free pool
                self.evictable -= (node.end - node.start) * node.ub
            node.ref += 1
            node = node.parent  # type: ignore[assignment]
        self.free -= revive
        used = self.num_blocks - self.free
        if used > self.peak_used:
            self.peak_used = used
        unit = seq.unit_tokens
        seq.blocks = units * (unit // self.block_size)
        seq.cached_upto = units
        self._next_unit(seq, units)
        hit = units * unit
        self.hit_tokens += hit
        if first:
            self.prompt_hit_tokens += hit
        return hit

    def _split(self, node: Node, m: int) -> Node:
        """Cut `node` after its first m units; returns the new upper part (the lower part keeps
        the node object, its children and its place in the eviction order; its holders, who hold
        their deepest node and so every ancestor, hold the upper part too: same count)."""
        src, a = node.src, node.start
        upper = Node(src, a, a + m, node.ub, node.parent, node.ref)
        upper.stamp = node.stamp
        if node.dups or node.spares:  # more copies: each free one of the upper part gets its
            heap, clock = self._heap, self._clock  # place in the LRU too
            if node.dups:
                upper.dups = node.dups.copy()
                if upper.ref == len(upper.dups):
                    heapq.heappush(heap, (upper.stamp, next(clock), upper))
            if node.spares:
                upper.spares = node.spares.copy()
                for stamp in upper.spares:
                    heapq.heappush(heap, (stamp, next(clock), upper))
                if not upper.ref:
                    heapq.heappush(heap, (upper.stamp, next(clock), upper))
        node.parent.children[src[a]] = upper  # type: ignore[union-attr]
        node.start = a + m
        node.parent = upper
        upper.children[src[a + m]] = node
        return upper

    # --- as KV is computed ----------------------------------------------------------------
    def cache_ahead(self, seqs: list[Seq], ntoks: list[int]) -> None:
        """Cache the units the step's requests (`seqs`, computing `ntoks` tokens) will cover,
        before the waiting requests are looked up: vLLM caches full blocks when it allocates
        them (`KVCacheManager.allocate_slots` ends with `cache_blocks` of the tokens the step
        computes), so a request admitted later in a step hits the blocks those scheduled before
        it were just given. In the batch's order, as vLLM allocates: who caches a unit first
        keeps it, the others computing it in that step keep copies of their own (`Node.dups`).
        The scheduler adds each request it admits (`ahead`) and clears `ahead` when admission
        ends; till then inserts and owners' leaves count these tokens."""
        self.ahead = ahead = {}
        for seq, n in zip(seqs, ntoks):
            ahead[seq] = n
            if seq.computed + n >= seq.next_unit_end:
                self.insert(seq)

    def insert(self, seq: Seq) -> None:
        """`seq.computed` (plus its `ahead`) reached `seq.next_unit_end`: cache the units it now
        covers. Evictions owed wait unless it finds a cached run (part of it may be owed) or
        whether its own node has children decides how it grows (a `get` that misses would
        miss after them too: they only remove runs nobody holds)."""
        keys, unit = seq.keys, seq.unit_tokens
        i = seq.cached_upto
        end = (seq.computed + self.ahead.get(seq, 0)) // unit
        if end > len(keys):
            end = len(keys)
        ub = unit // self.block_size
        node = seq.cache_node or self.root
        while i < end:
            child = node.children.get(keys[i])
            if self.evictable > self.free and (child is not None or (
                    node.ref == 1 and node.children and node is not self.root)):  # fmt: skip
                self._settle()
                continue
            if child is not None and child.owner is not None:
                self._claim(child)
            if child is None:
                if (node.ref == 1 and node.dups is None and node.spares is None
                        and node is not self.root and not node.children and node.ub == ub):  # fmt: skip
                    view(node, keys, i, end)  # its own leaf (held by it alone): extend it
                else:
                    node = Node(keys, i, end, ub, node, 1)
                    node.parent.children[keys[i]] = node  # type: ignore[union-attr]
                i = end
                break
            m = common(child, keys, i, end)  # cached meanwhile by another request: it keeps
            if m < child.end - child.start:  # the copy it computed them in (vLLM never
                child = self._split(child, m)  # de-duplicates: a block table only grows)
            d = child.dups
            if d is None:
                child.dups = d = []
            d.append(seq)
            child.ref += 1
            if child.ref == len(d):  # its first copy, free, may have no place in the LRU yet
                heapq.heappush(self._heap, (child.stamp, next(self._clock), child))
            i += m
            node = child
        seq.cached_upto = i
        if node is self.root:
            seq.cache_node = None
        else:
            seq.cache_node = node
            if (i < len(keys) and node.ref == 1 and node.dups is None and node.spares is None
                    and not node.children and node.ub == ub):  # fmt: skip
                if node.src is not keys or node.end != i:  # (a node made just now views them)
                    view(node, keys, i, i)  # its own leaf: later units are appended lazily
                node.owner = seq
                seq.next_unit_end = NEVER
                self.open.pop(seq, None)
                return
        self._next_unit(seq, i)

    def _next_unit(self, seq: Seq, i: int) -> None:
        """`seq` (holding blocks) has its first i units cached: its next unit ends at
        (i + 1) * unit_tokens (it is `open`), or it has no more keys."""
        if i < len(seq.keys):
            seq.next_unit_end = (i + 1) * seq.unit_tokens
            self.open[seq] = None
        else:
            seq.next_unit_end = NEVER
            self.open.pop(seq, None)

    def _sync(self, node: Node) -> None:
        """Append to its owner's leaf the units the owner has computed since (module doc)."""
        seq: Seq = node.owner  # type: ignore[assignment]
        end = (seq.computed + self.ahead.get(seq, 0)) // seq.unit_tokens
        if end > len(seq.keys):
            end = len(seq.keys)
        if end > seq.cached_upto:  # (the node views seq.keys, ending at cached_upto)
            node.end += end - seq.cached_upto
            seq.cached_upto = end

    def _claim(self, node: Node) -> None:
        """End `node`'s ownership (another request reads it): its owner inserts again."""
        self._sync(node)
        seq: Seq = node.owner  # type: ignore[assignment]
        node.owner = None
        self._next_unit(seq, seq.cached_upto)

    # --- allocation and release -------------------------------------------------------------
    # (`take` is the base class's: the evictions it makes necessary wait for `_settle`,
    # prefix_evict.py)
    def release(self, seq: Seq) -> None:
        if self.evictable > self.free:
            self._settle()
        self.open.pop(seq, None)
        freed = seq.blocks  # less the blocks of its nodes that others still hold
        node = seq.cache_node
        if node is not None:
            if node.owner is not None:  # its own leaf: the units computed since, then let go
                self._sync(node)
                node.owner = None
            root, clock = self.root, self._clock
            while node is not root:  # deepest first
                node.ref -= 1
                b = (node.end - node.start) * node.ub
                dups = node.dups
                if dups is not None and seq in dups:  # its own copy: free, cached (a spare)
                    dups.remove(seq)
                    if not dups:
                        node.dups = None
                    self.evictable += b
                    stamp = next(clock)
                    if node.spares is None:
                        node.spares = [stamp]
                    else:
                        node.spares.append(stamp)
                    self._released.append((stamp, node))
                elif node.ref > (len(dups) if dups else 0):  # others hold the first copy
                    freed -= b
                else:  # nobody holds the first copy: free, cached, evictable
                    self.evictable += b
                    node.stamp = stamp = next(clock)
                    if node.ref or node.spares or not node.children:
                        self._released.append((stamp, node))
                node = node.parent  # type: ignore[assignment]
        self.free += freed
        seq.blocks = 0
        self._reset(seq)
