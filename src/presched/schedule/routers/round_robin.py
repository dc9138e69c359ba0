"""`round-robin`: instances in turn, ignoring their load. Inputs: none."""

from __future__ import annotations

from presched.schedule.routers.interface import ROUTERS, Router


@ROUTERS.register("round-robin")
class RoundRobin(Router):
    name = "round-robin"
    needs_progress = False

    def __init__(self) -> None:
        self._next = 0

    def route(self, seq, instances, now) -> int:
        i = self._next % len(instances)
        self._next = i + 1
        return i
