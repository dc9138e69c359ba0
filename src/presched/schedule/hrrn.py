"""`hrrn`: highest response ratio next, on predicted lengths.

    ratio(seq, now) = (wait + S) / S = 1 + (now - arrival) / S,    S = stat(seq)

The waiting request with the highest ratio starts first (key = -(now - arrival) / S; ties by
arrival). S is the predicted output length (`stat` of `schedule/lengths.py`, default the mean;
remaining form after a preemption). The service TIME would be S times a per-token time; that
factor is common to all requests and cancels in the order, so the ratio is computed in tokens.
Short requests rise fast (SJF-like at first), but every request's ratio grows without bound
while it waits, so none starves: X is overtaken by a request Y that arrives after it only while
(now - a_Y) / S_Y > (now - a_X) / S_X, which for S_Y < S_X ends at a finite time.

Cost: the order changes with time in a way no per-request timer describes (two ratios cross at a
time that depends on both), so the policy is `dynamic`: the queue re-keys every waiting request
at each decision, O(n log n). `wakeup` returns the next time another request overtakes the head
of the queue (O(n)), so fast-forwarded decode runs end there and the simulation stays exact. At
scale prefer `aging` (a static key, O(log n)), which trades mean against tail latency with one
knob, `rate`.

Config (`HRRNParams`): `stat` (default "mean"; "rank" is refused: a score is not a length). Non-preemptive;
KV-pressure victim: the running request with the lowest ratio.

    presched simulate --policy hrrn --set sim.policy_params.stat=median

Reference: Brinch Hansen, "Short-term scheduling in multiprogramming systems", SOSP 1971.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from pydantic import Field

from presched.schedule.interface import Policy, SeqView
from presched.schedule.lengths import remaining
from presched.schedule.params import LengthStat, PolicyParams
from presched.schedule.registry import POLICIES


class HRRNParams(PolicyParams):
    stat: LengthStat = Field("mean", description="Statistic of the predicted length S (a length, so not rank: a score has no time scale).")


@POLICIES.register("hrrn")
class HRRN(Policy):
    name = "hrrn"
    dynamic = True
    Params = HRRNParams

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.stat = stat = self.params.stat
        self.length = remaining(stat)
        self._waiting: dict[int, SeqView] = {}  # for `wakeup`

    def priority(self, seq: SeqView, now: float) -> float:
        return -(now - seq.arrival) / max(self.length(seq), 1e-9)

    def victim(self, candidates: Sequence[SeqView], now: float) -> SeqView:
        return max(reversed(candidates), key=lambda s: self.priority(s, now))

    def wakeup(self, now: float) -> float | None:
        """The next time a waiting request overtakes the current head (`wakeup_among` of every
        waiting request)."""
        return self.wakeup_among(self._waiting.values(), now)

    def wakeup_among(self, seqs: Iterable[SeqView], now: float) -> float | None:
        """The next time one of the waiting `seqs` overtakes the head among them (ratios are
        lines in time: Y overtakes the head H when 1/S_Y > 1/S_H, at t = (a_Y/S_Y - a_H/S_H) /
        (1/S_Y - 1/S_H)). A steeper Y that ties H at `now` (H wins the tie by arrival, or
        rounding put the crossing at or before `now`) overtakes right after it: the answer is
        then the next float after `now`, so the next step decides again. `vtc` asks it about
        each tenant's queue (its head is the head of one of them)."""
        lines = [(1.0 / max(self.length(s), 1e-9), s.arrival) for s in seqs]
        if len(lines) < 2:
            return None
        head = max(lines, key=lambda ln: ((now - ln[1]) * ln[0], -ln[1]))
        sh, ah = head
        best = math.inf
        for s, a in lines:
            if s > sh:
                t = (a * s - ah * sh) / (s - sh)
                if t <= now:
                    return math.nextafter(now, math.inf)
                if t < best:
                    best = t
        return best if best < math.inf else None

    def on_arrival(self, seq: SeqView, now: float) -> None:
        self._waiting[id(seq)] = seq

    def on_preempt(self, seq: SeqView, now: float) -> None:
        self._waiting[id(seq)] = seq

    def on_schedule(self, seq: SeqView, now: float) -> None:
        self._waiting.pop(id(seq), None)

    def on_finish(self, seq: SeqView, now: float) -> None:
        self._waiting.pop(id(seq), None)

    def on_cancel(self, seq: SeqView, now: float) -> None:
        self._waiting.pop(id(seq), None)

    def describe(self) -> str:
        return f"hrrn(stat={self.stat})"
