"""What tests, metrics and policies read of the prefix cache (`prefix_cache.py`): the tree as an
eager cache would have it (the lazy work applied first), the evicted units, the hit rate."""

from __future__ import annotations

from presched.sim.prefix_node import Node
from presched.sim.seq import Seq


class CacheInspection:
    """Mixed into `CachingBlockManager` (its `root`, counters, `_settle` and `_sync`)."""

    def settle(self) -> None:
        """Apply the lazy work (prefix_cache.py): the tree as an eager cache would have it now."""
        if self.evictable > self.free:
            self._settle()
        for node in self._all():
            if node.owner is not None:
                self._sync(node)

    def _all(self):
        todo = list(self.root.children.values())
        while todo:
            node = todo.pop()
            yield node
            todo.extend(node.children.values())

    def nodes(self):
        """Every cached run (tree node but the root), parents before children (settled)."""
        self.settle()
        yield from self._all()

    def path(self, seq: Seq) -> list[Node]:
        """The nodes `seq` holds, from the root down (settled)."""
        self.settle()
        out, node = [], seq.cache_node
        while node is not None and node is not self.root:
            out.append(node)
            node = node.parent
        return out[::-1]

    def cached_keys(self) -> set[int]:
        return {k for node in self.nodes() for k in node.keys}

    @property
    def evicted_units(self) -> int:
        """Cached units evicted so far."""
        self.settle()
        return self._evicted_units

    @property
    def hit_rate(self) -> float:
        """Tokens found cached / tokens looked up at admissions (vLLM's prefix cache hit rate)."""
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0
