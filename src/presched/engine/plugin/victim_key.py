"""vLLM's `priority` of a running request under the plugin (scheduler.py): the policy's victim
order, so that vLLM's own KV-pressure preemption (`max(running, key=(priority, arrival))`)
preempts whom the policy names. Only the engine process imports it."""

from __future__ import annotations

from typing import TYPE_CHECKING

from presched.engine.plugin.seq import EngineSeq

if TYPE_CHECKING:
    from presched.engine.plugin.scheduler import PreschedScheduler


class VictimKey:
    """A running request's vLLM `priority`: comparisons ask the policy which of two requests is
    its KV-pressure victim (larger = preempted first). `later > earlier` when the policy would
    pick `later` from [earlier, later], so ties go to the most recently admitted request, as
    `Policy.victim` breaks them. A raising `victim` falls back to the latest arrival."""

    __slots__ = ("seq", "sched")

    def __init__(self, seq: EngineSeq, sched: PreschedScheduler) -> None:
        self.seq, self.sched = seq, sched

    def __eq__(self, other: object) -> bool:
        return self is other

    __hash__ = object.__hash__

    def __gt__(self, other: "VictimKey") -> bool:
        a, b = self.seq, other.seq
        s = self.sched
        v = s.guard.call("victim", None, s.ps.victim, [b, a], s._now)
        if v is None:
            return a.arrival >= b.arrival
        return v is a

    def __lt__(self, other: "VictimKey") -> bool:
        return other.__gt__(self)
