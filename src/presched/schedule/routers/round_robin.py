"""`round-robin`: instances in turn, ignoring their load (one not `allowed` is skipped). Inputs:
none."""

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

    def route(self, seq, instances, now, allowed=None) -> int:
        n = len(instances)
        i = self._next % n
        if allowed is not None and i not in allowed:  # the next allowed one in turn
            i = min(allowed, key=lambda j: (j - i) % n)
        self._next = i + 1
        return i
