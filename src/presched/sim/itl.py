"""Inter-token latencies without storing one number per token.

Every gap between two consecutive output tokens of a request is logged as part of an arithmetic
series `first, first+step, ..., first+(count-1)*step`, each value standing for `weight` tokens
(a decode step of duration d gives every request in the batch a gap d; a fast-forwarded run of
k steps gives B requests k-1 gaps growing by a constant). `values()` expands them for percentiles.
"""

from __future__ import annotations

import numpy as np


class ItlLog:
    __slots__ = ("first", "step", "count", "weight")

    def __init__(self) -> None:
        self.first: list[float] = []
        self.step: list[float] = []
        self.count: list[int] = []
        self.weight: list[int] = []

    def add(self, first: float, step: float, count: int, weight: int) -> None:
        self.first.append(first)
        self.step.append(step)
        self.count.append(count)
        self.weight.append(weight)

    def extend(self, other: "ItlLog") -> None:
        for name in self.__slots__:
            getattr(self, name).extend(getattr(other, name))

    def values(self) -> tuple[np.ndarray, np.ndarray]:
        """(gap seconds, weight) arrays, one entry per distinct gap value."""
        count = np.asarray(self.count, dtype=np.int64)
        if count.size == 0:
            return np.empty(0), np.empty(0, dtype=np.int64)
        first = np.repeat(np.asarray(self.first), count)
        step = np.repeat(np.asarray(self.step), count)
        starts = np.cumsum(count) - count
        offset = np.arange(count.sum()) - np.repeat(starts, count)
        weight = np.repeat(np.asarray(self.weight, dtype=np.int64), count)
        return first + step * offset, weight

    @property
    def num_gaps(self) -> int:
        return int(np.dot(self.count, self.weight)) if self.count else 0
