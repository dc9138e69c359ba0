"""`mlfq`: FastServe's skip-join multi-level feedback queue (Wu et al., arXiv 2305.05920).
Non-clairvoyant: no length prediction; the anchor that predictive policies must beat.

Levels 0 (highest priority) to K-1, with quanta growing geometrically, in output tokens:

    quantum(i) = base_quantum * quantum_ratio ** i

- Skip-join: a new request costs c = prompt_weight * prompt_tokens output-token equivalents for
  its first iteration (the prefill), and joins the highest level whose quantum covers it,
  min{i : quantum(i) >= c} (the last level if none). Its usage at that level starts at c.
- Demotion: a running request whose usage at its level reaches the quantum moves down one level
  (the excess carries over, so a request is where its total service puts it, however the tokens
  were counted). The last level never demotes. Waiting requests are never demoted.
- Order: key = (level, time it entered that level): higher levels first, FIFO within a level.
  With `within` = a length statistic (e.g. "mean"), requests inside a level go shortest
  predicted remaining first: key = (level, remaining(stat), entry time). That makes MLFQ
  predictive while keeping its attained-service demotion, which guards against bad predictions
  (measured in docs/policy-evidence.md).
- Preemption (`preempt`, default off): when the head of the queue cannot start (batch full or KV
  short), the running request with the lowest priority (largest key) is preempted if it sits at
  a LOWER level and the gap pays for the recompute:

      quantum(level_v) - quantum(level_c) > recompute_weight * prompt_weight * (prompt_v + g_v)

  (v loses its KV and prefills its prompt and g_v generated tokens again). KV-pressure victim:
  the running request with the largest key.

Demotions take effect at the next arrival, admission or preemption on this engine, events that
come between steps: the engine reconsiders preemption only at events, and this keeps
fast-forwarded and step-by-step simulation identical (a completion is not such a point: it comes
while a step hands out its tokens).

The prefill mapping: prompt_weight ~ (prefill time per prompt token) / (decode time per request
per step at a full batch); on the roofline model of Llama-3.1-8B on an H100 with 64 slots, a prompt
token costs 27 us of prefill and a decode token 0.27 ms of a 17.5 ms step: ~0.1, the default.

Config (`MLFQParams`): `num_levels` (K, default 8, at most 64), `base_quantum` (tokens, default 32), `quantum_ratio`
(default 2), `prompt_weight` (default 0.1), `preempt` (default False), `recompute_weight`
(default 1.0; 0 = preempt whenever the victim is at a lower level), `within` (None = FIFO inside
a level, as FastServe; or a statistic of schedule/lengths.py STATS).

    presched simulate --policy mlfq --set sim.policy_params.base_quantum=64

Deviations from FastServe: quanta are in output tokens, not seconds (the gateway has no
iteration clock; the simulator's iterations vary); FastServe preempts at every iteration and
swaps KV to host memory, while presched's engine preempts by recompute only, so preemption is
optional, guarded by its recompute cost, and decided at events. No starvation promotion. The MLFQ
baseline in vllm-ltr (`vllm/core/mlfq_scheduler.py`) has no skip-join (all jobs enter level 0)
and quanta in seconds (10 ms * 2^level).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from pydantic import Field, ValidationInfo, field_validator

from presched.schedule.interface import Policy, SeqView
from presched.schedule.lengths import remaining
from presched.schedule.params import PolicyParams, Stat
from presched.schedule.registry import POLICIES


class MLFQParams(PolicyParams):
    num_levels: int = Field(8, ge=1, le=64, description="Levels K; level i has quantum base_quantum * quantum_ratio ** i.")
    base_quantum: float = Field(32.0, gt=0, allow_inf_nan=False, description="Quantum of level 0, in output tokens.")
    quantum_ratio: float = Field(2.0, ge=1, allow_inf_nan=False, description="Growth of the quantum from one level to the next.")
    prompt_weight: float = Field(0.1, ge=0, allow_inf_nan=False, description="Output-token equivalents of one prompt token (the prefill cost that places a new request, skip-join).")
    preempt: bool = Field(False, description="Preempt a running request at a lower level for the head of the queue when the quantum gap pays for the recompute.")
    recompute_weight: float = Field(1.0, ge=0, allow_inf_nan=False, description="Weight of the recompute cost in the preemption test; 0 = preempt whenever the victim is at a lower level.")
    within: Stat | None = Field(None, description="Order inside a level: None = FIFO (FastServe), or a statistic of the predicted remaining length (shortest first).")

    @field_validator("quantum_ratio")
    @classmethod
    def _last_quantum_bounded(cls, v: float, info: ValidationInfo) -> float:
        q0, k = info.data.get("base_quantum"), info.data.get("num_levels")
        if q0 is not None and k is not None and math.log10(q0) + (k - 1) * math.log10(v) > 18:
            raise ValueError("the last quantum, base_quantum * quantum_ratio ** (num_levels - 1), "
                             "must be at most 1e18 tokens")  # fmt: skip
        return v


class _State:
    __slots__ = ("level", "since", "used")

    def __init__(self, level: int, used: float, since: float) -> None:
        self.level, self.used, self.since = level, used, since


@POLICIES.register("mlfq")
class MLFQ(Policy):
    name = "mlfq"

    Params = MLFQParams

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        p = self.params
        q0, ratio = p.base_quantum, p.quantum_ratio
        self.quanta = [q0 * ratio**i for i in range(p.num_levels)]
        self.prompt_weight = p.prompt_weight
        self.recompute_weight = p.recompute_weight
        self.preempt = p.preempt
        self.within = None if p.within is None else remaining(p.within)
        self._state: dict[int, _State] = {}  # id(seq) -> its level, usage there, entry time
        self._due: dict[int, _State] = {}  # states whose usage reached the quantum

    def level(self, seq: SeqView) -> int:
        return self._state[id(seq)].level

    def join_level(self, cost: float) -> int:
        """The highest level whose quantum covers `cost` (prefill, in output-token units)."""
        return next((i for i, q in enumerate(self.quanta) if q >= cost), len(self.quanta) - 1)

    def priority(self, seq: SeqView, now: float) -> tuple:
        st = self._state[id(seq)]
        if self.within is not None:
            return (st.level, self.within(seq), st.since)
        return (st.level, st.since)

    def _demote(self, now: float) -> None:
        last = len(self.quanta) - 1
        for st in self._due.values():
            while st.level < last and st.used >= self.quanta[st.level]:
                st.used -= self.quanta[st.level]
                st.level += 1
                st.since = now
        self._due.clear()

    def victim(self, candidates: Sequence[SeqView], now: float) -> SeqView:
        return max(reversed(candidates), key=lambda s: self.priority(s, now))

    def preempt_for(self, candidate, running, now):
        if not (self.preempt and running):
            return None
        v = self.victim(running, now)
        lv, lc = self.level(v), self.level(candidate)
        cost = self.recompute_weight * self.prompt_weight * (v.prompt_tokens + v.generated)
        if lv > lc and self.quanta[lv] - self.quanta[lc] > cost:
            return v
        return None

    # --- notifications: levels and usage ---------------------------------------------------
    def on_arrival(self, seq: SeqView, now: float) -> None:
        self._demote(now)
        cost = self.prompt_weight * seq.prompt_tokens
        self._state[id(seq)] = _State(self.join_level(cost), cost, now)

    def on_schedule(self, seq: SeqView, now: float) -> None:
        self._demote(now)

    def on_tokens(self, seq: SeqView, num_tokens: int, now: float) -> None:
        st = self._state[id(seq)]
        st.used += num_tokens
        if st.used >= self.quanta[st.level] and st.level < len(self.quanta) - 1:
            self._due[id(seq)] = st

    def on_preempt(self, seq: SeqView, now: float) -> None:
        self._demote(now)

    def on_finish(self, seq: SeqView, now: float) -> None:
        # no demotions here: a completion comes while a step (or a fast-forwarded run) hands out
        # its tokens, so requests later in the batch may not have been counted yet
        self._due.pop(id(seq), None)
        del self._state[id(seq)]

    def on_cancel(self, seq: SeqView, now: float) -> None:
        self._due.pop(id(seq), None)
        self._state.pop(id(seq), None)

    def describe(self) -> str:
        return f"mlfq(levels={len(self.quanta)}, q0={self.quanta[0]:g}, preempt={self.preempt})"
