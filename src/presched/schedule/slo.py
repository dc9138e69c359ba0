"""`slo` — SLO-aware ordering for goodput: requests that can still meet their SLO first, the
others after, in arrival order.

A waiting request that starts now is predicted to produce its first token after `prefill`
seconds (the prefill step samples it) and its last after `service = prefill + (L - 1) * tpot`,
with L the predicted tokens still to come (`stat` of `seq.estimate`, conditional on the tokens
already generated) and prefill computed for the prompt plus the generated tokens (recompute after
a preemption). Its SLOs (`request.slo_e2e`, `request.slo_ttft`, seconds from arrival; else the
options `e2e_slo_s`, `ttft_slo_s`) give the latest time it can start:

    t* = min(arrival + slo_e2e - service,   arrival + slo_ttft - prefill)

(the TTFT term only until its first token). Estimated E2E = (now - arrival) + service, so the
request is feasible while now < t*. Key: feasible requests by `order`:
- `shortest` (default): predicted `service` ascending (SJF among those that can still make it);
- `slack`: t* ascending = least slack first (slack = t* - now; `now` is common to all, so the
  key is static) — EDF corrected by each request's own predicted service;
infeasible requests get key +inf, so they run after every feasible one, in arrival order. The
moment a request turns infeasible is known when it is queued: `rekey_at` returns t*, and the
queue re-keys it then (O(log n)); no dynamic re-evaluation.

Why `shortest` by default: goodput counts requests, and when the queue is long enough for order
to matter, serving the cheapest feasible request first completes the most of them. Measured
(docs/policies/slo.md): `slack` wins by 1-3 points of goodput just below saturation but loses by
10-40 points in overload, where least-laxity spends capacity on long requests that barely make it.

Times from the step model (`EngineInfo.step_model`, approximations documented here):
    prefill(p) = step_time(p, p (p + 1) / 2, p, 0, 0)     the prompt alone in one step
    tpot       = step_time(0, 0, 0, B, B * context)      a decode step of a typical batch,
                 B = `batch` (default max_num_seqs // 2) requests of `context` tokens each
It ignores queueing in the running batch, chunking of long prompts and the batch's actual size.
Without a step model (a gateway) set `tpot_s` (and `prefill_s_per_token`, else prefill = 0).

Config (`SLOParams`): `stat` ("mean"; "rank" is refused: a score is no length of time), `order` ("shortest"), `e2e_slo_s`, `ttft_slo_s` (None: the request's own
SLO is required), `tpot_s`, `prefill_s_per_token`, `batch`, `context` (1024).
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field

from presched.schedule.interface import EngineInfo, Policy, SeqView
from presched.schedule.lengths import remaining
from presched.schedule.params import LengthStat, PolicyParams
from presched.schedule.registry import POLICIES

ORDERS = ("slack", "shortest")


def _seconds(description: str):
    return Field(None, gt=0, allow_inf_nan=False, description=description)


class SLOParams(PolicyParams):
    stat: LengthStat = Field("mean", description="Statistic of the predicted remaining length L (a length, so not rank: a score has no time scale).")
    order: Literal[ORDERS] = Field("shortest", description="Among feasible requests: shortest predicted service first, or least slack first (slack: t* ascending, EDF corrected by each request's own predicted service).")  # type: ignore[valid-type]
    e2e_slo_s: float | None = _seconds("E2E SLO in seconds for requests without their own (request.slo_e2e).")
    ttft_slo_s: float | None = _seconds("TTFT SLO in seconds for requests without their own (request.slo_ttft).")
    tpot_s: float | None = _seconds("Seconds per output token; None: from the engine's step model.")
    prefill_s_per_token: float | None = _seconds("Prefill seconds per prompt token; None: from the step model (0 without one).")
    batch: int | None = Field(None, ge=1, le=1_000_000, description="Batch size of the typical decode step behind tpot; None: max_num_seqs // 2.")
    context: int = Field(1024, ge=1, le=10_000_000, description="Context tokens per request of the typical decode step behind tpot.")


@POLICIES.register("slo")
class SLOAware(Policy):
    name = "slo"
    Params = SLOParams

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        p = self.params
        self._remaining = remaining(p.stat)
        self.stat, self.order = p.stat, p.order
        self.e2e_slo_s, self.ttft_slo_s = p.e2e_slo_s, p.ttft_slo_s
        self.tpot = p.tpot_s
        self.prefill_s_per_token = p.prefill_s_per_token
        self.batch, self.context = p.batch, p.context
        self._step = None
        self._last: tuple | None = None  # (id, now, generated, t*, service): priority then rekey_at

    def attach(self, engine: EngineInfo) -> None:
        self._step = engine.step_model
        if self.tpot is None:
            if self._step is None:
                raise ValueError("field 'tpot_s': required when the engine has no step-time model")
            b = self.batch or max(1, engine.max_num_seqs // 2)
            self.tpot = self._step.step_time(0, 0.0, 0, b, b * self.context)

    def prefill_time(self, tokens: int) -> float:
        if self.prefill_s_per_token is not None:
            return self.prefill_s_per_token * tokens
        if self._step is None:
            return 0.0
        return self._step.step_time(tokens, tokens * (tokens + 1) / 2, tokens, 0, 0)

    def plan(self, seq: SeqView, now: float) -> tuple[float, float]:
        """(t*, predicted service seconds) of a waiting request (see module doc)."""
        last = self._last
        if last is not None and last[0] == id(seq) and last[1] == now and last[2] == seq.generated:
            return last[3], last[4]
        if self.tpot is None:
            raise ValueError(
                "field 'tpot_s': slo needs attach(EngineInfo) with a step model, or tpot_s"
            )
        req = seq.request
        e2e = req.slo_e2e if req.slo_e2e is not None else self.e2e_slo_s
        ttft = req.slo_ttft if req.slo_ttft is not None else self.ttft_slo_s
        if seq.first_token is not None:
            ttft = None  # its TTFT is decided already
        if e2e is None and ttft is None and seq.first_token is None:
            raise ValueError(
                f"request {req.id!r} has no SLO (slo_e2e / slo_ttft); "
                "set the policy's field 'e2e_slo_s' or 'ttft_slo_s'"
            )
        prefill = self.prefill_time(seq.prompt_tokens + seq.generated)
        service = prefill + max(self._remaining(seq) - 1.0, 0.0) * self.tpot
        t_star = math.inf
        if e2e is not None:
            t_star = seq.arrival + e2e - service
        if ttft is not None:
            t_star = min(t_star, seq.arrival + ttft - prefill)
        self._last = (id(seq), now, seq.generated, t_star, service)
        return t_star, service

    def priority(self, seq: SeqView, now: float) -> float:
        t_star, service = self.plan(seq, now)
        if now >= t_star:
            return math.inf  # cannot make it: after every feasible request, in arrival order
        return t_star if self.order == "slack" else service

    def rekey_at(self, seq: SeqView, now: float) -> float | None:
        t_star, _ = self.plan(seq, now)
        return t_star if now < t_star and t_star != math.inf else None

    def on_finish(self, seq: SeqView, now: float) -> None:
        self._forget(seq)

    def on_cancel(self, seq: SeqView, now: float) -> None:
        self._forget(seq)

    def _forget(self, seq: SeqView) -> None:
        """Drop the plan cache if it is this request's (its id may be reused by a new one)."""
        if self._last is not None and self._last[0] == id(seq):
            self._last = None
