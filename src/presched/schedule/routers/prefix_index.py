"""What a router remembers about where prompts went: per instance, the block hashes of the
requests it sent there, in an LRU of bounded size (llm-d's approximate prefix-cache scorer:
`prefix-cache-scorer` with `lruCapacityPerServer`; it does not read the engines' caches, so the
same router runs in front of simulated and real engines).

`match(hashes)` walks a request's hashes once and returns, per instance, how many of its first
blocks that instance was sent (a longest-prefix match: it stops at the first block the
instance did not get). `add(instance, hashes, block_tokens)` records a request sent there.
Capacity is in tokens (`capacity_tokens` per instance, e.g. the instance's KV cache): an entry
weighs its block's tokens, and the least recently sent blocks are forgotten first.
"""

from __future__ import annotations

from collections import OrderedDict


class PrefixIndex:
    def __init__(self, capacity_tokens: int, max_blocks: int = 0) -> None:
        """`max_blocks` > 0: only the first that many blocks of a request are matched and
        recorded (llm-d's `maxPrefixBlocksToMatch`; bounds the cost of a long prompt)."""
        self.capacity = capacity_tokens
        self.max_blocks = max_blocks
        self._where: dict[int, set[int]] = {}  # block hash -> instances it was sent to
        self._lru: dict[int, OrderedDict[int, int]] = {}  # instance -> hash -> block tokens
        self._tokens: dict[int, int] = {}  # instance -> tokens in its LRU

    def _head(self, hashes: tuple[int, ...]) -> tuple[int, ...]:
        return hashes[: self.max_blocks] if self.max_blocks else hashes

    def match(self, hashes: tuple[int, ...], num_instances: int) -> list[int]:
        """Per instance (by position), the number of leading blocks of `hashes` sent there."""
        out = [0] * num_instances
        where = self._where
        alive: set[int] | None = None
        k = 0
        for k, h in enumerate(self._head(hashes)):
            s = where.get(h)
            if not s:
                break
            now = s if alive is None else alive & s
            if alive is not None:
                for i in alive - now:
                    out[i] = k
            alive = now
            if not alive:
                break
        else:
            k += 1
        for i in alive or ():
            if i < num_instances:
                out[i] = k
        return out

    def add(self, instance: int, hashes: tuple[int, ...], block_tokens: int) -> None:
        """Remember that a request with `hashes` (of `block_tokens` each) went to `instance`."""
        lru = self._lru.setdefault(instance, OrderedDict())
        where = self._where
        tokens = self._tokens.get(instance, 0)
        for h in self._head(hashes):
            if h in lru:
                lru.move_to_end(h)
                continue
            lru[h] = block_tokens
            tokens += block_tokens
            where.setdefault(h, set()).add(instance)
        while tokens > self.capacity and lru:
            h, t = lru.popitem(last=False)
            tokens -= t
            s = where[h]
            s.discard(instance)
            if not s:
                del where[h]
        self._tokens[instance] = tokens
