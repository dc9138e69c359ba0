"""Oracle bounds that read the TRUE output length (`seq.target`): not deployable, they show
what perfect length knowledge would buy.

- `sjf-oracle`  shortest job first: waiting order = true total output length; non-preemptive.
  KV-pressure victim: the running request with the most tokens still to generate.
- `srpt-oracle` shortest remaining processing time: waiting order = true remaining tokens
  r = L - g (L true length, g generated; g > 0 only for preempted requests); preemptive: when
  the best waiting request c cannot start (batch full or KV short), the running request v with
  the largest remaining is preempted (by recompute, as vLLM v1 does) if

      r(v) > r(c) + min_gap + recompute_weight * (prompt(v) + g(v))

  The last term charges the tokens v must prefill again. With recompute_weight = 0 (textbook
  SRPT) every short arrival evicts a long request mid-way and the recompute work thrashes the
  engine: in a saturated test (64 slots, lognormal lengths) it cut throughput by 20-25 % and
  made mean E2E 2-10x worse than FCFS. The default 1.0 preempts rarely and only when it pays.

Formula: priority = L (SJF) or L - g (SRPT). Config of `srpt-oracle` (`OracleSRPTParams`):
`min_gap` (tokens, 0), `recompute_weight` (1.0).
"""

from __future__ import annotations

from typing import Any, Sequence

from pydantic import Field

from presched.schedule.interface import Policy, SeqView
from presched.schedule.params import PolicyParams
from presched.schedule.registry import POLICIES


def _remaining(seq: SeqView) -> int:
    return seq.target - seq.generated  # type: ignore[attr-defined]


@POLICIES.register("sjf-oracle")
class OracleSJF(Policy):
    name = "sjf-oracle"
    oracle = True

    def priority(self, seq: SeqView, now: float) -> float:
        return seq.target  # type: ignore[attr-defined]

    def victim(self, candidates: Sequence[SeqView], now: float) -> SeqView:
        return max(reversed(candidates), key=_remaining)


class OracleSRPTParams(PolicyParams):
    min_gap: float = Field(0.0, ge=0, allow_inf_nan=False, description="Tokens by which the victim's remaining must exceed the candidate's (beyond the recompute charge).")
    recompute_weight: float = Field(1.0, ge=0, allow_inf_nan=False, description="Charge per token the victim must prefill again (prompt + generated); 0 = textbook SRPT.")


@POLICIES.register("srpt-oracle")
class OracleSRPT(Policy):
    name = "srpt-oracle"
    oracle = True
    Params = OracleSRPTParams

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.min_gap = self.params.min_gap
        self.recompute_weight = self.params.recompute_weight

    def priority(self, seq: SeqView, now: float) -> float:
        return _remaining(seq)

    def victim(self, candidates: Sequence[SeqView], now: float) -> SeqView:
        return max(reversed(candidates), key=_remaining)

    def preempt_for(self, candidate, running, now):
        if not running:
            return None
        worst = max(reversed(running), key=_remaining)
        cost = self.recompute_weight * (worst.prompt_tokens + worst.generated)
        if _remaining(worst) > _remaining(candidate) + self.min_gap + cost:
            return worst
        return None
