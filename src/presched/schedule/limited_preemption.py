"""`LimitedPreemption`: order by a predicted size and preempt a running request for a waiting
one only under a guard (TRAIL's limited preemption, Shahout et al., ICLR 2025). Shared by `srpt`
/ `trail` (size = predicted remaining tokens) and `gittins` (size = 1 / Gittins index).

When the best waiting request c cannot start (batch full or KV short), a running request v may be
preempted (by recompute) for it only if

    (1) g(v) < c_frac * P0(v)              P0 = initial(v): v's predicted total at arrival
    (2) preemptions(v) < max_preemptions
    (3) r(v) > r(c) + min_gap + recompute_weight * (prompt(v) + g(v))

with r = size. Among eligible v the one with the largest r is preempted (ties: latest arrival).
c_frac = 0 turns preemption off (reorder only). KV-pressure victim: the largest r, ties to the
latest arrival. A refusal is cached until the queue head or the running batch changes (an
admission, a preemption, a completion): the fast-forwarding simulator needs a refusal to stay a
refusal while requests only decode (see `srpt.py`).

Subclasses implement the abstract `size` and `initial`; config: `LimitedPreemptionParams`.
"""

from __future__ import annotations

import math
from abc import abstractmethod
from collections.abc import Sequence
from typing import Any

from pydantic import Field

from presched.schedule.interface import Policy, SeqView
from presched.schedule.params import PolicyParams


class LimitedPreemptionParams(PolicyParams):
    c_frac: float = Field(2.0, ge=0, allow_inf_nan=False, description="Preemption window: a running request may be preempted while it generated fewer than c_frac * its predicted total at arrival; 0 = never preempt (reorder only).")
    max_preemptions: int | None = Field(4, ge=0, le=1_000_000, description="Most preemptions of one request (KV-pressure ones count too); None = no limit.")
    min_gap: float = Field(0.0, ge=0, allow_inf_nan=False, description="Margin by which the victim's size must exceed the candidate's, beyond the recompute charge (TRAIL's margin).")
    recompute_weight: float = Field(1.0, ge=0, allow_inf_nan=False, description="Charge per token the victim must prefill again (prompt + generated).")


class LimitedPreemption(Policy):
    """Order by a predicted size, preempt under the guard (1)-(3) of the module doc. Subclasses
    provide `size(seq)` (predicted remaining work; lower runs first) and `initial(seq)` (the
    predicted total at arrival, the base of the c_frac window), and may extend `Params`."""

    name = "limited-preemption"
    Params = LimitedPreemptionParams
    params: LimitedPreemptionParams

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        p = self.params
        self.c_frac = p.c_frac
        self.max_preemptions = max_preemptions = p.max_preemptions
        self.min_gap = p.min_gap
        self.recompute_weight = p.recompute_weight
        self._max_p = math.inf if max_preemptions is None else max_preemptions
        self._initial: dict[int, float] = {}  # id(seq) -> initial(seq), from arrival to finish
        self._batch_version = 0  # bumped whenever the running batch changes
        self._declined: tuple | None = None  # (candidate, batch version) last refused

    @abstractmethod
    def size(self, seq: SeqView) -> float:
        """Predicted remaining work of `seq` (tokens or an index; lower runs first). Called on
        every queue entry and for every running request at a preemption decision: keep it cheap."""

    @abstractmethod
    def initial(self, seq: SeqView) -> float:
        """Predicted total work of `seq` at arrival: the base of the `c_frac` window. Called once
        per request, at arrival (kept until it finishes)."""

    def priority(self, seq: SeqView, now: float) -> float:
        return self.size(seq)

    def victim(self, candidates: Sequence[SeqView], now: float) -> SeqView:
        size = self.size
        return max(reversed(candidates), key=lambda s: (size(s), s.arrival))

    def preempt_for(self, candidate, running, now):
        if not running or self.c_frac == 0 or self._max_p == 0:
            return None
        declined = self._declined
        if declined is not None and declined[0] is candidate and declined[1] == self._batch_version:
            return None  # nothing changed since we said no (see the module doc)
        size, init, c_frac, w = self.size, self._initial, self.c_frac, self.recompute_weight
        bar = size(candidate) + self.min_gap
        best, best_r = None, -math.inf
        for v in running:
            if v.preemptions >= self._max_p:
                continue
            p0 = init.get(id(v))
            if p0 is None:
                p0 = self.initial(v)
            if v.generated >= c_frac * p0:
                continue
            r = size(v)
            if r > bar + w * (v.prompt_tokens + v.generated) and (
                r > best_r or (r == best_r and v.arrival >= best.arrival)
            ):
                best, best_r = v, r
        if best is None:
            self._declined = (candidate, self._batch_version)
        return best

    def on_arrival(self, seq, now):
        self._initial[id(seq)] = self.initial(seq)

    def on_schedule(self, seq, now):
        self._batch_version += 1

    def on_preempt(self, seq, now):
        self._batch_version += 1

    def on_finish(self, seq, now):
        self._batch_version += 1
        self._forget(seq)

    def on_cancel(self, seq, now):
        self._batch_version += 1
        self._forget(seq)

    def _forget(self, seq) -> None:
        self._initial.pop(id(seq), None)
        if self._declined is not None and self._declined[0] is seq:
            self._declined = None
