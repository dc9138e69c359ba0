"""`EngineSeq`: a vLLM `Request` seen through presched's `SeqView` (schedule/interface.py).

One per request, made when vLLM hands the request to the scheduler (`add_request`) and kept
until it is freed. The attributes policies read are plain fields, refreshed by the scheduler:

    request          presched `Request` (id, prompt_tokens, arrival, max_tokens, tenant;
                     output_tokens = `presched_target` from vllm_xargs when given; slo_e2e /
                     slo_ttft = `presched_slo_e2e` / `presched_slo_ttft`, seconds from arrival,
                     for `slo`: `slos_of`)
    arrival          vLLM's arrival time (unix seconds, set by the API server)
    prompt_tokens    len(prompt_token_ids)
    generated        output tokens so far (kept across preemptions: vLLM recomputes them;
                     a streaming-input session's: those of all its turns, `turn_base` of them
                     before the current turn; its prompt_tokens: all its input chunks;
                     `turn_status`: how its last turn ended, sessions.py)
    estimate         a `RequestEstimate` (vllm_xargs or the in-engine predictor) or None;
                     replaced after prefill by the in-engine probe's unless from vllm_xargs
    pred_source      'xargs', 'predictor', 'probe', 'refine', 'draft-probe' or None: where
                     `estimate` came from
    first_scheduled  time it was first admitted to the running batch
    first_token      time its first output token came back from the model
    preemptions      how often the engine preempted it (vLLM's `num_preemptions`)
    target           ORACLE ONLY: `presched_target` from vllm_xargs, else max_tokens when the
                     request ignores EOS (it then generates exactly that many), else max_tokens
                     (an upper bound; documented in docs/engine-plugin.md)

Hidden-state features (plugin config `features`, worker.py), None / 0 without them:

    features_prompt  pooled prompt state (float32 vector) from the worker hook
    features_n       prompt positions pooled into it; features_missing: non-sink positions the
                     hook never saw (0 unless prefix-cached)
    feature_pools    how often a pooled prompt state arrived (1 + recomputes after preemption)
    features_step    state at the last generated token; feature_steps: how many arrived;
                     features_step_g: that token's number g (the step reads token g)
    features_egtp    the EGTP (entropy-weighted) pool of the same positions (`features.egtp`)
    features_record  {g: state at generated token g} for g in `features.record_steps`, kept
                     only with `records`; written to `step_features` when freed. A recompute
                     after preemption resumes at the next token, so each g arrives once; were
                     one to arrive twice, the first is kept
    features_answer  [running sum (float64), count] of the per-step states at generated tokens 1..g
                     (`features_answer_g` = g, the last token added; kept with `records`
                     and record_steps, or a refine model that reads the answer pool): the
                     answer-so-far pool, A_g = sum / count (count = g unless speculative decoding skipped states). Only a token after the last one added
                     counts, so a state shipped again after a recompute is not added twice
    features_record_answer  {g: A_g} for g in `features.record_steps` (with features_record),
                     written to `answer_features` when freed
    features_draft   the draft model's pooled prompt state (`features.draft_layer`); draft_n,
                     draft_missing, draft_pools as features_n, features_missing, feature_pools

Also kept for the request record: `recomputed_tokens` (tokens whose KV its preemptions dropped:
prefilled again, less, with prefix caching on, what vLLM finds still cached when it resumes, which
is not subtracted: an upper bound), `finish`, `vreq` (the vLLM request).
"""

from __future__ import annotations

import math
from typing import Any

from presched.workload.request import Request
from presched.xargs import SLOS as XARG_SLOS
from presched.xargs import TARGET as XARG_TARGET
from presched.xargs import TENANT as XARG_TENANT

_MAX_SLO_S = 1e7


class EngineSeq:
    __slots__ = ("vreq", "request", "arrival", "prompt_tokens", "generated", "estimate",
                 "first_scheduled", "first_token", "preemptions", "target", "recomputed_tokens",
                 "finish", "pred_source", "computed", "features_prompt", "features_n",
                 "features_missing", "feature_pools", "features_step", "feature_steps",
                 "features_step_g", "features_draft", "draft_n", "draft_missing", "draft_pools",
                 "features_egtp", "features_record", "features_answer", "features_answer_g",
                 "features_record_answer", "turn_base", "turn_status")  # fmt: skip

    def __init__(self, vreq: Any, estimate: Any = None, pred_source: str | None = None,
                 slos: dict[str, float] | None = None) -> None:  # fmt: skip
        self.vreq = vreq
        xargs = xargs_of(vreq)
        prompt = len(vreq.prompt_token_ids or ()) or 1
        max_tokens = int(vreq.max_tokens)
        target = _positive_int(xargs.get(XARG_TARGET))
        arrival = float(vreq.arrival_time)
        self.request = Request(
            id=str(vreq.request_id), prompt_tokens=prompt,
            arrival=arrival if math.isfinite(arrival) and arrival >= 0 else 0.0,
            output_tokens=target, max_tokens=max_tokens,
            tenant=str(xargs.get(XARG_TENANT) or "default"), **(slos or {}),
        )  # fmt: skip
        self.arrival = arrival
        self.prompt_tokens = prompt
        self.generated = int(vreq.num_output_tokens)
        self.turn_base = 0  # a streaming-input session's tokens of the turns before this one
        self.turn_status = None  # vLLM's status at the end of a session's last turn (sessions.py)
        self.estimate = estimate
        self.pred_source = pred_source
        self.first_scheduled: float | None = None
        self.first_token: float | None = None
        self.preemptions = int(vreq.num_preemptions)
        self.target = min(target, max_tokens) if target is not None else max_tokens
        self.recomputed_tokens = 0
        self.finish: float | None = None
        self.computed = 0  # vLLM's num_computed_tokens, refreshed at each schedule()
        self.features_prompt = self.features_step = None
        self.features_n = self.features_missing = self.feature_pools = self.feature_steps = 0
        self.features_step_g = 0
        self.features_draft = self.features_egtp = None
        self.features_record: dict[int, Any] | None = None  # g -> per-step state (`features.record_steps`)
        self.features_answer: list | None = None  # [float64 sum, count] of the per-step states at tokens 1..features_answer_g
        self.features_answer_g = 0
        self.features_record_answer: dict[int, Any] | None = None  # g -> answer-so-far pool A_g
        self.draft_n = self.draft_missing = self.draft_pools = 0

    @property
    def id(self) -> str:
        return self.request.id

    def __repr__(self) -> str:
        return f"EngineSeq({self.id!r}, generated={self.generated}, preemptions={self.preemptions})"


def xargs_of(vreq: Any) -> dict:
    sp = getattr(vreq, "sampling_params", None)
    extra = getattr(sp, "extra_args", None) if sp is not None else None
    return extra if isinstance(extra, dict) else {}


def slos_of(xargs: dict) -> tuple[dict[str, float], list[str]]:
    """The request's SLOs from its vllm_xargs, as `Request` fields ({"slo_e2e": seconds,
    "slo_ttft": seconds}, from arrival), and one message per field given but unusable (not a
    finite number in (0, 1e7]), naming it; an unusable field counts as not given."""
    slos, bad = {}, []
    for field, key in XARG_SLOS.items():
        v = xargs.get(key)
        if v is None:
            continue
        x = None
        if not isinstance(v, bool) and isinstance(v, (int, float, str)):
            try:
                x = float(v)
            except ValueError:
                pass
        if x is not None and math.isfinite(x) and 0 < x <= _MAX_SLO_S:
            slos[field] = x
        else:
            bad.append(f"vllm_xargs.{key}: expected seconds in (0, {_MAX_SLO_S:g}], got {v!r}")
    return slos, bad


def _positive_int(v: Any) -> int | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, str) and v.strip().isdigit():
        v = int(v)
    return v if isinstance(v, int) and 0 < v < 2**31 else None


