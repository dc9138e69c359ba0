"""`aging`: shortest predicted first, with linear aging: every second of waiting is worth `rate`
predicted tokens.

    effective key at time now = stat(seq) - rate * (now - arrival)     (lower runs first)

Subtracting the same rate * now from every waiting request does not change their order, so this
orders exactly like the STATIC key

    key(seq) = stat(seq) + rate * arrival

computed once when the request enters the queue: no re-keying at all, O(log n) per request.
`stat` is a statistic of `schedule/lengths.py` in tokens (default the mean; for a request preempted
after g tokens, its remaining form). `rate` (tokens per second) is the knob between mean and tail
latency: 0 is shortest-predicted-first (best mean, unbounded wait for long requests), and as it
grows the order tends to FCFS (rate * inter-arrival gaps dominate length differences).

Starvation bound. Let s_min be the smallest value the statistic can take (1 token: predicted
lengths are at least 1). A request Y arriving at a_Y overtakes X (key_Y < key_X) only if

    s_Y + rate * a_Y < s_X + rate * a_X   =>   a_Y < tau_X := a_X + (s_X - s_min) / rate

Every request that arrives after tau_X queues behind X, so X waits at most for the work that
arrives before tau_X with a lower key. With one batch slot and service times at most T:

    first_scheduled(X) <= a_X + T * (1 + N_X),  N_X = #{Y != X: key_Y < key_X, a_Y < tau_X,
                                                         Y not started by a_X}

finite whatever arrives later. The grace period (s_X - s_min) / rate grows with X's predicted
length: unlike `rank`'s constant `starvation_s`, a long request is delayed in proportion to how
much longer it is predicted to be. With stat "rank" (a unitless score, unbounded below) rate is
in score units per second and the bound holds only if the scores are bounded.

Config (`AgingParams`): `rate` (tokens/s, default 100: P99 E2E within 1.3x FCFS's at 80-100 % load on a bursty
trace, docs/policies/aging.md; its scale is typical length differences / typical waits), `stat`
(default "mean"). KV-pressure victim: the running request with the largest key (remaining form).
Non-preemptive.

    presched simulate --policy aging --set sim.policy_params.rate=300

Reference: aging is the classic remedy for SJF starvation (e.g. Silberschatz et al., Operating
System Concepts, "priority scheduling with aging"); here on predicted LLM output lengths.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pydantic import Field

from presched.schedule.interface import Policy, SeqView
from presched.schedule.lengths import remaining
from presched.schedule.params import PolicyParams, Stat
from presched.schedule.registry import POLICIES


class AgingParams(PolicyParams):
    rate: float = Field(100.0, ge=0, allow_inf_nan=False, description="Predicted tokens one second of waiting is worth: 0 = shortest predicted first, large tends to FCFS.")
    stat: Stat = Field("mean", description="Statistic of the predicted length (remaining form after a preemption); rank works, with rate in score units per second.")


@POLICIES.register("aging")
class Aging(Policy):
    name = "aging"
    Params = AgingParams

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.rate = self.params.rate  # tokens per second of waiting
        self.stat = stat = self.params.stat
        self.length = remaining(stat)

    def priority(self, seq: SeqView, now: float) -> float:
        return self.length(seq) + self.rate * seq.arrival

    def victim(self, candidates: Sequence[SeqView], now: float) -> SeqView:
        return max(reversed(candidates), key=lambda s: self.priority(s, now))

    def describe(self) -> str:
        return f"aging(rate={self.rate:g}, stat={self.stat})"
