"""`RequestQueue`: the waiting-queue interface every driver uses (cf. vLLM's
`vllm/v1/core/sched/request_queue.py`).

A policy's `new_queue()` returns one; the simulator's engine and the gateway's admission queue
hold their waiting requests in it and start its head. Implementations: `WaitingQueue`
(`queue.py`, one heap keyed by the policy's `priority`) and `TenantQueues` (`tenant_queues.py`,
one `WaitingQueue` per backlogged tenant, the head taken from the tenant with the least service).

Contract: keys may change with time, so the driver calls `update(now)` before it looks at the
head (`peek`, `pop`); `next_rekey()` tells it when keys will change by themselves, so it can stop
fast-forwarding there. `remove` takes out a request that is still waiting (a cancelled client).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from presched.schedule.interface import SeqView


class RequestQueue(ABC):
    """The waiting requests of one engine (or one gateway backend), in the policy's order."""

    @abstractmethod
    def push(self, seq: SeqView, now: float) -> None:
        """Add a request that enters the waiting queue at `now` (on arrival, or after a
        preemption); its key is computed now."""

    @abstractmethod
    def update(self, now: float) -> None:
        """Bring keys up to date at `now` (timed re-keys, an `epoch` change, `dynamic`
        policies). Call before `peek` / `pop`."""

    @abstractmethod
    def peek(self) -> SeqView | None:
        """The request that would start next, without removing it; None if empty."""

    @abstractmethod
    def pop(self) -> SeqView:
        """Remove and return the request that starts next (IndexError if empty)."""

    @abstractmethod
    def remove(self, seq: SeqView) -> None:
        """Remove a specific request that is still waiting (KeyError if it is not)."""

    @abstractmethod
    def next_rekey(self) -> float:
        """The earliest time at which a key changes by itself (math.inf if none)."""

    @abstractmethod
    def __len__(self) -> int:
        """Number of waiting requests."""

    def __bool__(self) -> bool:
        """True if any request is waiting."""
        return len(self) > 0

    @abstractmethod
    def __contains__(self, seq: object) -> bool:
        """Whether `seq` is waiting here."""

    @abstractmethod
    def __iter__(self) -> Iterator[SeqView]:
        """The waiting requests in no particular order (for inspection, not for scheduling)."""
