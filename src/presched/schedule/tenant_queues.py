"""`TenantQueues`: the waiting queue of `vtc` (vtc.py), one `WaitingQueue` per backlogged
tenant ordered by the inner policy; the head comes from the tenant with the smallest counter.

A tenant's queue exists while it has waiting requests: it is created when the tenant becomes
backlogged (the counter lift of vtc.py applies then) and dropped when it empties, so peek, pop,
update and next_rekey cost O(#backlogged tenants), however many tenants were ever seen. The
per-tenant state that outlives the queue (counter, order of first appearance for ties) is the
policy's (vtc.py: kept while the tenant has requests, a bounded number while it is idle).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

from presched.schedule.interface import SeqView
from presched.schedule.queue import WaitingQueue
from presched.schedule.request_queue import RequestQueue

if TYPE_CHECKING:
    from presched.schedule.vtc import VTC


def tenant_of(seq: SeqView) -> str:
    return seq.request.tenant


class TenantQueues(RequestQueue):
    """The waiting queue of `vtc`: one `WaitingQueue` per backlogged tenant (dropped when it
    empties), ordered by the inner policy; the head is the head of the backlogged tenant with
    the smallest counter (ties: the earlier head arrival, then the tenant seen first).
    O(#backlogged tenants) per peek/pop."""

    def __init__(self, policy: VTC) -> None:
        self.policy = policy
        self.queues: dict[str, WaitingQueue] = {}  # backlogged tenants only
        self._n = 0
        self._last_left: str | None = None  # tenant whose queue emptied last

    def push(self, seq: SeqView, now: float) -> None:
        tenant = tenant_of(seq)
        q = self.queues.get(tenant)
        if q is None:  # the tenant becomes backlogged, once its first request is in its queue:
            q = WaitingQueue(self.policy)  # a priority that raises leaves no empty queue behind
            q.push(seq, now)  # (whose head, None, broke every later decision)
            self.policy._wake(tenant)
            self._lift(tenant)
            self.queues[tenant] = q
        else:
            q.push(seq, now)
        self._n += 1

    def _lift(self, tenant: str) -> None:
        counters = self.policy.counters
        others = [counters.get(t, 0.0) for t in self.queues if t != tenant]
        if others:
            floor = min(others)
        elif self._last_left is not None and self._last_left != tenant:
            floor = counters.get(self._last_left, 0.0)
        else:
            return
        if counters.get(tenant, 0.0) < floor:
            # keep `service` (the real tokens) as is; only the virtual counter moves
            counters[tenant] = floor

    def update(self, now: float) -> None:
        if self.policy._done:  # the first decision after a completion (see `VTC`)
            self.policy._settle()
        for q in self.queues.values():
            q.update(now)

    def _head_queue(self) -> tuple[str, WaitingQueue] | None:
        counters, first = self.policy.counters, self.policy._first
        best = None
        best_key = None
        for t, q in self.queues.items():
            key = (counters.get(t, 0.0), q.peek().arrival, first.get(t, -1))
            if best_key is None or key < best_key:
                best, best_key = (t, q), key
        return best

    def _emptied(self, tenant: str) -> None:
        del self.queues[tenant]
        self._last_left = tenant
        self.policy._gone.append(tenant)

    def peek(self) -> SeqView | None:
        head = self._head_queue()
        return head[1].peek() if head else None

    def pop(self) -> SeqView:
        head = self._head_queue()
        if head is None:
            raise IndexError("pop from an empty queue")
        tenant, q = head
        seq = q.pop()
        self._n -= 1
        if not q:
            self._emptied(tenant)
        return seq

    def remove(self, seq: SeqView) -> None:
        tenant = tenant_of(seq)
        q = self.queues[tenant]
        q.remove(seq)
        self._n -= 1
        if not q:
            self._emptied(tenant)

    def next_rekey(self) -> float:
        return min((q.next_rekey() for q in self.queues.values()), default=math.inf)

    def refresh(self, now: float) -> None:
        for q in self.queues.values():
            q.refresh(now)

    def backlogged(self) -> list[str]:
        """Tenants with waiting requests."""
        return list(self.queues)

    def __len__(self) -> int:
        return self._n

    def __bool__(self) -> bool:
        return self._n > 0

    def __contains__(self, seq: object) -> bool:
        q = self.queues.get(tenant_of(seq))  # type: ignore[arg-type]
        return q is not None and seq in q

    def __iter__(self) -> Iterator[SeqView]:
        return iter([s for q in self.queues.values() for s in q])
