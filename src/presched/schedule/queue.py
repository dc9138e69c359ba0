"""The waiting queue, ordered by a policy's `priority` (lowest first, then arrival, then id).

Shared by every driver: the simulator's engine and the gateway's admission queue hold their
waiting requests here, so a policy orders requests identically under both clocks.
For `dynamic` policies, `refresh(now)` recomputes every key before the driver looks at the head.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Iterator

from presched.schedule.interface import Policy, SeqView


class WaitingQueue:
    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._heap: list[tuple[float, float, int, SeqView]] = []
        self._tie = itertools.count()  # FIFO among equal (priority, arrival)
        self._dropped: set[int] = set()  # lazy removals, by id(seq)
        self._size = 0

    def push(self, seq: SeqView, now: float) -> None:
        key = (self.policy.priority(seq, now), seq.arrival, next(self._tie), seq)
        heapq.heappush(self._heap, key)
        self._size += 1

    def peek(self) -> SeqView | None:
        self._drop_removed()
        return self._heap[0][3] if self._heap else None

    def pop(self) -> SeqView:
        self._drop_removed()
        self._size -= 1
        return heapq.heappop(self._heap)[3]

    def remove(self, seq: SeqView) -> None:
        """Remove a request that is still waiting (e.g. a client cancelled). O(1), lazy."""
        self._dropped.add(id(seq))
        self._size -= 1

    def refresh(self, now: float) -> None:
        """Recompute all keys (for policies whose priority depends on `now`)."""
        self._drop_removed_all()
        prio = self.policy.priority
        self._heap = [(prio(s, now), s.arrival, t, s) for _, _, t, s in self._heap]
        heapq.heapify(self._heap)

    def __len__(self) -> int:
        return self._size

    def __bool__(self) -> bool:
        return self._size > 0

    def __iter__(self) -> Iterator[SeqView]:
        """Waiting requests in no particular order (use for inspection, not for scheduling)."""
        return (s for _, _, _, s in self._heap if id(s) not in self._dropped)

    def _drop_removed(self) -> None:
        heap, dropped = self._heap, self._dropped
        while dropped and heap and id(heap[0][3]) in dropped:
            dropped.discard(id(heapq.heappop(heap)[3]))

    def _drop_removed_all(self) -> None:
        if self._dropped:
            self._heap = [e for e in self._heap if id(e[3]) not in self._dropped]
            self._dropped.clear()
