"""Eviction for the prefix cache (`prefix_cache.py`): `_settle` frees, least recently released
first, the blocks that takes used beyond the uncached free ones (the lazy work of the module doc
there)."""

from __future__ import annotations

import heapq
from collections import deque

from presched.sim.prefix_node import Node


def _drop_head(in_heap: bool, heap: list, released: deque) -> None:
    """Drop the candidate `_settle` just read: the head of the heap or of the released queue."""
    if in_heap:
        heapq.heappop(heap)
    else:
        released.popleft()


class CacheEviction:
    """Mixed into `CachingBlockManager` (its `root`, `_released`, `_heap`, `_clock`, counters and
    `_split`)."""

    def _settle(self) -> None:
        """Evict, least recently released first, the `evictable - free` blocks that takes have
        used beyond the uncached free ones (module doc). The candidate is the older head of
        `_released` and `_heap` (a stale entry, used again, extended or gone, is dropped): a
        free copy of a node's units. If the node has another copy (`Node.spares`, `Node.dups`)
        only that one goes, and a spare or else the oldest own copy takes the first copy's
        place, as vLLM's next block of the hash does; the last copy goes from the end of a leaf
        nobody holds."""
        released, heap, root = self._released, self._heap, self.root
        blocks = self.evictable - self.free
        while blocks > 0:
            if heap and (not released or heap[0][0] < released[0][0]):
                stamp, _, node = heap[0]
                in_heap = True
            else:
                stamp, node = released[0]
                in_heap = False
            dups, spares = node.dups, node.spares
            if node.parent is None:
                stale = True
            elif node.stamp == stamp:  # its first copy: free, and the last copy or not a leaf
                stale = node.ref != (len(dups) if dups else 0) or (
                    not dups and not spares and node.children)  # fmt: skip
            else:  # a spare copy
                stale = not spares or stamp not in spares
            if stale:
                _drop_head(in_heap, heap, released)
                continue
            t = -(-blocks // node.ub)  # units that cover the blocks owed, or all of the node's
            if dups or spares:  # another copy stays: only this one goes, the units stay cached
                if t < node.end - node.start:  # (its lower part: the blocks vLLM freed first)
                    self._split(node, node.end - node.start - t)
                b = (node.end - node.start) * node.ub
                self.evictable -= b
                blocks -= b
                if node.stamp != stamp:
                    spares.remove(stamp)  # type: ignore[union-attr]
                elif spares:  # a spare copy takes the first one's place
                    node.stamp = max(spares)
                    spares.remove(node.stamp)
                else:  # the oldest own copy does (held: a hit shares it)
                    del dups[0]  # type: ignore[index]
                    if not dups:
                        node.dups = None
                if not node.spares:
                    node.spares = None
                _drop_head(in_heap, heap, released)
                continue
            if t > node.end - node.start:
                t = node.end - node.start
            node.end -= t
            b = t * node.ub
            self.evictable -= b
            self._evicted_units += t
            blocks -= b
            if node.end > node.start:  # the least recent still: it stays at the head
                continue
            _drop_head(in_heap, heap, released)
            parent: Node = node.parent  # type: ignore[assignment]
            del parent.children[node.src[node.start]]
            node.parent = None
            if parent is not root and not parent.ref and not parent.children:  # a leaf now
                heapq.heappush(heap, (parent.stamp, next(self._clock), parent))
