"""The waiting queue, ordered by a policy's `priority` (lowest first, then arrival, then the
request's position in its workload (`index`, where the driver has one), then FIFO).

Shared by every driver: the simulator's engine and the gateway's admission queue hold their
waiting requests here, so a policy orders requests identically under both clocks.

Keys are computed when a request enters the queue. The driver calls `update(now)` before it
looks at the head; that re-keys the requests whose `rekey_at` time has come (O(log n) each), all
requests once when the policy's `epoch` changed, and all requests every time for `dynamic`
policies. Removal is lazy: an entry is live while it is the request's latest one. Stale entries
(removed requests, superseded keys) are dropped when they reach the head, or all at once when
they outnumber the live ones (`_compact`, O(n), amortized O(1)): a queue whose head does not
move (a stalled backend, a slot held long) does not keep removed requests alive.
"""

from __future__ import annotations

import heapq
import itertools
import math
from typing import Iterator

from presched.schedule.interface import Policy, SeqView
from presched.schedule.request_queue import RequestQueue

def _order(seq: SeqView) -> tuple[float, int]:
    """(arrival, workload position) of `seq`: a preempted request pushed back goes before the
    waiting ones that arrived with it, as in vLLM, where it goes to the front of the queue (it
    went behind them: a new push is a new FIFO tie; Mooncake's trace has 10,851 of 12,031
    arrivals on a shared timestamp). Drivers without a position (the gateway) keep FIFO."""
    return seq.arrival, getattr(seq, "index", 0)


_SLACK = 64
"""Stale entries a queue may hold beyond as many as it has live ones before it compacts."""


class WaitingQueue(RequestQueue):
    """A `RequestQueue` keyed by `policy.priority` (then arrival, position, FIFO); see module doc."""

    def __init__(self, policy: Policy) -> None:
        self.policy = policy
        self._heap: list[tuple] = []  # (key, (arrival, position), tie, seq)
        self._timers: list[tuple[float, int, SeqView]] = []  # (rekey time, tie, seq)
        self._tie = itertools.count()  # FIFO among equal (priority, arrival); entry identity
        self._live: dict[int, tuple[int, SeqView]] = {}  # id(seq) -> (tie of its entry, seq)
        self._epoch = policy.epoch
        self._timed = type(policy).rekey_at is not Policy.rekey_at

    def push(self, seq: SeqView, now: float) -> None:
        key = self.policy.priority(seq, now)
        key < key  # noqa: B015 - a key that cannot be ordered (None) raises here, heap untouched
        tie = next(self._tie)
        heapq.heappush(self._heap, (key, _order(seq), tie, seq))
        self._live[id(seq)] = (tie, seq)
        if self._timed:
            t = self.policy.rekey_at(seq, now)
            if t is not None:
                heapq.heappush(self._timers, (t, tie, seq))
        self._maybe_compact()

    def update(self, now: float) -> None:
        """Bring keys up to date at `now` (see module doc). Call before `peek`/`pop`."""
        policy = self.policy
        if policy.dynamic or policy.epoch != self._epoch:
            self._epoch = policy.epoch
            self._rekey_all(now)
            return
        timers, live = self._timers, self._live
        while timers and timers[0][0] <= now:
            _, tie, seq = heapq.heappop(timers)
            entry = live.get(id(seq))
            if entry is not None and entry[0] == tie:
                self.push(seq, now)  # the new entry supersedes the old one

    def next_rekey(self) -> float:
        """The earliest pending `rekey_at` time (inf if none): decisions may change then."""
        timers, live = self._timers, self._live
        while timers:
            _, tie, seq = timers[0]
            entry = live.get(id(seq))
            if entry is not None and entry[0] == tie:
                return timers[0][0]
            heapq.heappop(timers)
        return math.inf

    def peek(self) -> SeqView | None:
        self._drop_stale()
        return self._heap[0][3] if self._heap else None

    def pop(self) -> SeqView:
        self._drop_stale()
        seq = heapq.heappop(self._heap)[3]
        del self._live[id(seq)]
        if not self._live:
            self._maybe_compact()
        return seq

    def remove(self, seq: SeqView) -> None:
        """Remove a request that is still waiting (e.g. a client cancelled). O(1), lazy;
        KeyError if it is not waiting."""
        del self._live[id(seq)]
        self._maybe_compact()

    def _maybe_compact(self) -> None:
        if not self._live:  # nothing waits: every entry is stale
            self._heap.clear()
            self._timers.clear()
            return
        n = 2 * len(self._live) + _SLACK
        if len(self._heap) > n or len(self._timers) > n:
            self._compact()

    def _compact(self) -> None:
        """Drop every stale entry (same order: the entries keep their keys and ties)."""
        live = self._live

        def fresh(seq: SeqView, tie: int) -> bool:
            entry = live.get(id(seq))
            return entry is not None and entry[0] == tie

        self._heap = [e for e in self._heap if fresh(e[3], e[2])]
        self._timers = [t for t in self._timers if fresh(t[2], t[1])]
        heapq.heapify(self._heap)
        heapq.heapify(self._timers)

    def refresh(self, now: float) -> None:
        """Recompute every key now."""
        self._rekey_all(now)

    def __len__(self) -> int:
        return len(self._live)

    def __bool__(self) -> bool:
        return bool(self._live)

    def __contains__(self, seq: object) -> bool:
        return id(seq) in self._live

    def __iter__(self) -> Iterator[SeqView]:
        """Waiting requests in no particular order (use for inspection, not for scheduling)."""
        return iter([s for _, s in self._live.values()])

    def _drop_stale(self) -> None:
        heap, live = self._heap, self._live
        while heap:
            entry = live.get(id(heap[0][3]))
            if entry is not None and entry[0] == heap[0][2]:
                return
            heapq.heappop(heap)

    def _rekey_all(self, now: float) -> None:
        entries = sorted(self._live.values(), key=lambda e: e[0])  # FIFO among equal keys
        prio, rekey = self.policy.priority, self.policy.rekey_at
        heap: list[tuple] = []
        timers: list[tuple[float, int, SeqView]] = []
        live: dict[int, tuple[int, SeqView]] = {}
        for _, s in entries:
            tie = next(self._tie)
            heap.append((prio(s, now), _order(s), tie, s))
            live[id(s)] = (tie, s)
            if self._timed:
                t = rekey(s, now)
                if t is not None:
                    timers.append((t, tie, s))
        heapq.heapify(heap)
        heapq.heapify(timers)
        self._heap, self._timers, self._live = heap, timers, live
