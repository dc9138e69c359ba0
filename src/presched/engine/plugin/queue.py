"""`PolicyRequestQueue`: vLLM's waiting queue, ordered by a presched policy.

It has the methods of vLLM v1's `RequestQueue` (`add_request`, `pop_request`, `peek_request`,
`prepend_request(s)`, `remove_request(s)`, `len`, `bool`, iteration) and holds the requests'
`EngineSeq`s in the policy's own queue (`policy.new_queue()`: a `WaitingQueue` keyed by
`priority`, or a policy's own, e.g. per-tenant for `vtc`), so the engine orders requests exactly
as the simulator and the gateway do. vLLM's "prepend" (a preempted request going back) is a push
with the policy's key: the policy, not the queue position, decides when it runs again.

Admission: while the scheduler runs `schedule()` it sets `gate` (a function of the head's seq);
the queue then reads as empty when the gate refuses its head, which ends vLLM's admission loop
for this step (strict order, as in the simulator: a refused head is not skipped).

The head that running requests were preempted for is popped first in that `schedule()`
(`serve_first`, until `unpin`), whatever the order says once the victims are back.

Failures: a `priority` (push) that raises puts the request in a FIFO that is served before the
policy's queue; an `update`/`peek` that raises serves the earliest arrival for that decision.
Both are counted by the `Guard`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from presched.engine.plugin.guard import Guard


class PolicyRequestQueue:
    def __init__(self, policy, seq_of: Callable[[Any], Any], clock: Callable[[], float],
                 guard: Guard, on_pop: Callable[[Any], None],
                 on_requeue: Callable[[Any], None]) -> None:  # fmt: skip
        self.q = policy.new_queue()
        self.front: deque = deque()  # seqs whose priority raised: FCFS, ahead of the rest
        self.seq_of, self.clock, self.guard = seq_of, clock, guard
        self.on_pop, self.on_requeue = on_pop, on_requeue
        self.gate: Callable[[Any], bool] | None = None
        self.pinned: Any = None  # a seq popped first in this schedule() (`serve_first`)

    # --- the policy's order ---------------------------------------------------------------------
    def _push(self, seq) -> None:
        try:
            self.q.push(seq, self.clock())
        except Exception as e:  # noqa: BLE001
            self.guard.failed("priority", e)
            if seq in self.q:
                self.q.remove(seq)
            self.front.append(seq)

    def _head(self) -> tuple[Any, bool]:
        """(head seq or None, whether it came from the FCFS fallback)."""
        if self.front:
            return self.front[0], True
        if self.pinned is not None:
            return self.pinned, True  # popped out of the policy's queue by remove(), as the fallback
        if not self.q:
            return None, False
        try:
            self.q.update(self.clock())
            head = self.q.peek()
            if head is not None:
                return head, False
            raise RuntimeError("the policy's queue is not empty but peek() gave None")
        except Exception as e:  # noqa: BLE001
            self.guard.failed("priority", e)
            return min(self.q, key=lambda s: s.arrival), True

    def serve_first(self, seq) -> None:
        """Pin `seq` (waiting, in the policy's queue) as the head for this `schedule()`: the
        head requests were just preempted for is popped before them, even if a victim ranks
        first once back (as the simulator does). It stays in the policy's queue with its key;
        `unpin` (after vLLM's `schedule()`) ends the pin, so a head vLLM did not start is
        ordered by the policy again from the next step."""
        if seq in self.q:
            self.pinned = seq

    def unpin(self) -> None:
        self.pinned = None

    # --- vLLM's RequestQueue methods ----------------------------------------------------------
    def add_request(self, request) -> None:
        self._push(self.seq_of(request))

    def peek_request(self):
        head, _ = self._head()
        if head is None:
            raise IndexError("peek from an empty queue")
        return head.vreq

    def pop_request(self):
        head, fallback = self._head()
        if head is None:
            raise IndexError("pop from an empty queue")
        if self.front and head is self.front[0]:
            self.front.popleft()
        elif fallback:
            if head is self.pinned:
                self.pinned = None
            self.q.remove(head)
        else:
            try:
                self.q.pop()
            except Exception as e:  # noqa: BLE001 - the head was peeked: take it out by identity
                self.guard.failed("priority", e)
                self.q.remove(head)
        self.on_pop(head)
        return head.vreq

    def prepend_request(self, request) -> None:
        """A preempted request goes back (vLLM's `_preempt_request`): re-keyed by the policy."""
        seq = self.seq_of(request)
        self.on_requeue(seq)
        self._push(seq)

    def prepend_requests(self, requests: Iterable) -> None:
        """Requests vLLM popped but could not start this step (blocked): back with their key."""
        for r in requests:
            self._push(self.seq_of(r))

    def remove_request(self, request) -> None:
        self.remove_requests((request,))

    def remove_requests(self, requests: Iterable) -> None:
        for r in requests:
            seq = self.seq_of(r, create=False)
            if seq is None:
                continue
            if seq is self.pinned:
                self.pinned = None
            if seq in self.front:
                self.front.remove(seq)
            elif seq in self.q:
                self.q.remove(seq)

    def __len__(self) -> int:
        return len(self.front) + len(self.q)

    def __bool__(self) -> bool:
        if not (self.front or self.q):
            return False
        if self.gate is None:
            return True
        head, _ = self._head()
        return head is not None and self.gate(head)

    def __iter__(self) -> Iterator:
        """Waiting requests, fallback FIFO first, then in no particular order (inspection only)."""
        return iter([s.vreq for s in self.front] + [s.vreq for s in self.q])
