"""`round-robin`: instances in turn, ignoring their load. Inputs: none."""

from __future__ import annotations

from typing import Any

from presched.schedule.routers.interface import ROUTERS, Router


@ROUTERS.register("round-robin")
class RoundRobin(Router):
    name = "round-robin"
    needs_progress = False

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)  # none: any key is refused
        self._next = 0

    def route(self, seq, instances, now) -> int:
        i = self._next % len(instances)
        self._next = i + 1
        return i
