"""`srpt`: shortest predicted remaining processing time, with progressive refinement and LIMITED
preemption (TRAIL's SPRPT, Shahout et al., ICLR 2025); `trail`: the same with TRAIL's defaults.

Order: predicted remaining tokens, lower first. A request that has generated g tokens is
re-estimated from its distribution given L > g (`remaining(stat)`; for `mean`, E[L - g | L > g]),
so a request that outlives its prediction is predicted LONGER, not shorter.

Limited preemption: when the best waiting request c cannot start (batch full or KV short), a
running request v may be preempted (by recompute) for it only if

    (1) g(v) < c_frac * P0(v)              P0: v's predicted total at arrival (TRAIL's c)
    (2) preemptions(v) < max_preemptions
    (3) r(v) > r(c) + min_gap + recompute_weight * (prompt(v) + g(v))

with r the predicted remaining. Among eligible v the one with the largest r is preempted (ties:
latest arrival). (3) charges the tokens v must prefill again, as `srpt-oracle` does: with
recompute_weight = 0 a saturated engine thrashes on recomputes (see oracle.py). c_frac = 0 turns
preemption off (reorder only). KV-pressure victim: the largest r, ties to the latest arrival.

The decision is taken when the queue head or the running batch changes (an arrival that becomes
the head, an admission, a completion, a preemption), not at every decode step: a refined r(v)
that grows while nothing happens is acted on at the next such event. The fast-forwarding
simulator needs this (a refusal must not turn into a preemption while requests only decode; the
tests check that both modes agree), and it keeps the gateway cheap.

Inputs: `seq.estimate`. Config: `stat` ("mean"; any of `lengths.STATS` but `rank`, which is no
length), `c_frac` (2.0), `max_preemptions` (4; None = no limit), `min_gap` (0 tokens),
`recompute_weight` (1.0). Defaults measured (docs/policies/srpt.md): with the recompute charge,
TRAIL's window c_frac = 0.8 mostly forbids preempting requests that outlived a too-short
prediction, which are the ones worth preempting; 2.0 with a cap of 4 did best under noisy
predictions (azure-code, 90 % load).

    POLICIES.create("srpt", c_frac=0.8, max_preemptions=2)
    presched simulate --policy trail --set sim.policy_params.c_frac=0

`trail`: c_frac 0.8 (the paper; the repo's launcher uses 0), stat mean, no cap on preemptions, no
margin and no recompute charge (TRAIL's SGLang patch preempts when r(c) + margin < r(v), margin 0,
at most SGLANG_TRAIL_MAX_PREEMPTIONS_PER_REQ times, 0 = unlimited; SGLang keeps the victim's KV in
its radix cache, so its recompute is often a prefix hit, which presched's simulator does not
model). Deviation: TRAIL refines r with a probe on the model's hidden state every step (every 8
in the repo); presched refines from the predicted distribution, conditioned on L > g.

`LimitedPreemption` (`limited_preemption.py`) is the shared machinery (guard, victim, decision
cache); `gittins` uses it with the Gittins index as the size. Config: `SRPTParams`, `TRAILParams`.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from presched.schedule import lengths
from presched.schedule.interface import SeqView
from presched.schedule.limited_preemption import LimitedPreemption, LimitedPreemptionParams
from presched.schedule.params import LengthStat
from presched.schedule.registry import POLICIES


class SRPTParams(LimitedPreemptionParams):
    stat: LengthStat = Field("mean", description="Statistic of the predicted remaining length r (a length, so not rank: order by rank with sjf or rank).")


class TRAILParams(SRPTParams):
    c_frac: float = Field(0.8, ge=0, allow_inf_nan=False, description="Preemption window (TRAIL's c): preemptible while generated < c_frac * predicted total at arrival; 0 = reorder only.")
    max_preemptions: int | None = Field(None, ge=0, le=1_000_000, description="Most preemptions of one request; None = no limit (TRAIL's default).")
    recompute_weight: float = Field(0.0, ge=0, allow_inf_nan=False, description="Charge per token the victim must prefill again; 0 as in TRAIL (SGLang often hits its radix cache).")


@POLICIES.register("srpt")
class SRPT(LimitedPreemption):
    name = "srpt"
    Params = SRPTParams
    params: SRPTParams

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.stat = stat = self.params.stat
        self._size = lengths.remaining(stat)
        self._initial_size = lengths.total(stat)

    def size(self, seq: SeqView) -> float:
        return self._size(seq)

    def initial(self, seq: SeqView) -> float:
        return self._initial_size(seq)

    def describe(self) -> str:
        return (f"{self.name}(stat={self.stat}, c_frac={self.c_frac:g}, "
                f"max_preemptions={self.max_preemptions}, min_gap={self.min_gap:g}, "
                f"recompute_weight={self.recompute_weight:g})")  # fmt: skip


@POLICIES.register("trail")
class TRAIL(SRPT):
    """`srpt` with TRAIL's paper defaults (see the module doc)."""

    name = "trail"
    Params = TRAILParams
