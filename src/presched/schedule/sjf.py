"""`sjf`: shortest predicted job first (SSJF, Qiu et al. 2024), non-preemptive.

Waiting requests start in order of their predicted output length: a fresh request by the
statistic `stat` of its whole length L; a request back in the queue after a KV preemption (it has
generated g tokens, which recompute keeps) by the same statistic of what is left, L - g given
L > g (see `schedule/lengths.py`). It never preempts to admit. Under KV pressure the victim is the
running request with the largest predicted remaining, ties to the latest arrival.

    priority = total(stat)       fresh (g = 0)
             = remaining(stat)   re-queued after a preemption (g > 0)

Inputs: `seq.estimate` (a length prediction per request; missing -> a ValueError naming the
request). Config (`SJFParams`): `stat` (default "mean"; one of `lengths.STATS`).

    POLICIES.create("sjf", stat="median")
    presched simulate --policy sjf --set sim.policy_params.stat=q90

Reference: Qiu et al., "Efficient Interactive LLM Serving with Proxy Model-based Sequence Length
Prediction", AIOps@ASPLOS 2024 (repo James-QiuHaoran/LLM-serving-with-proxy-models). Deviation:
SSJF's starvation promotion is not built in: use `rank` (promotion after a wait) or `aging`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import Field

from presched.schedule import lengths
from presched.schedule.interface import Policy, SeqView
from presched.schedule.params import PolicyParams, Stat
from presched.schedule.registry import POLICIES


class SJFParams(PolicyParams):
    stat: Stat = Field("mean", description="Statistic of the predicted length ordered by: mean, point, rank (the ranker's score), median, q10 ... q99.")


@POLICIES.register("sjf")
class SJF(Policy):
    name = "sjf"
    Params = SJFParams

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.stat = stat = self.params.stat
        self._total = lengths.total(stat)
        self._remaining = lengths.remaining(stat)

    def priority(self, seq: SeqView, now: float) -> float:
        return self._remaining(seq) if seq.generated else self._total(seq)

    def victim(self, candidates: Sequence[SeqView], now: float) -> SeqView:
        rem = self._remaining
        return max(reversed(candidates), key=lambda s: (rem(s), s.arrival))

    def describe(self) -> str:
        return f"sjf(stat={self.stat})"
