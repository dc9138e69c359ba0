"""Hidden-state features of the worker hook: the per-step row split and what is shipped.

Numpy only (no vllm, no torch): the worker (`worker.py`) applies `split_rows` to the hooked
tensor, the scheduler reads `StepFeatures` off the `ModelRunnerOutput` (attribute
`FEATURES_ATTR`), both in the engine.

One engine step's hooked tensor has one row per scheduled token, requests in the model runner's
`input_batch.req_ids` order, `num_scheduled_tokens[req]` rows each (rows past their sum are
padding). A request whose prompt is computed in several chunks (chunked prefill) adds the rows
of each chunk to a running sum; the rows of its first `sink` positions are left out. When
the chunk that reaches its prompt's end is computed, the pooled prompt state (sum / count) is
shipped. A request whose computed tokens restart (vLLM recomputes a preempted request from 0)
starts a new sum.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from presched.engine.plugin.config import PluginConfigError

FEATURES_ATTR = "presched_features"
"""The attribute of vLLM's `ModelRunnerOutput` that carries a step's `StepFeatures`."""
WORKER_CLS = "presched.engine.plugin.worker.PreschedCPUWorker"


@dataclass(frozen=True)
class Piece:
    """One request's part of a step's rows (row indices into the step's hooked tensor)."""

    req_id: str
    start: int  # this position (= vLLM's num_computed_tokens before the step) is row `first`
    first: int
    rows: int  # rows of this request in the step
    pool: tuple[int, int] | None  # [lo, hi) rows that go into the prompt sum (None: none)
    prompt_done: bool  # the step computes the prompt's last position
    last: int  # row of the last verified position (the per-step state if it samples)


def split_rows(req_ids: Sequence[str], num_scheduled: Mapping[str, int],
               computed: Mapping[str, int], prompt_len: Mapping[str, int], sink: int,
               num_spec: Mapping[str, int] | None = None, extra: int = 0) -> list[Piece]:  # fmt: skip
    """The pieces of one step: `req_ids` in batch order, `num_scheduled[r]` rows each (0 or
    missing: not in this step), `computed[r]` = positions computed before the step,
    `prompt_len[r]` = prompt tokens, `sink` = leading prompt positions never pooled,
    `num_spec[r]` = speculative tokens among the scheduled ones (their rows are not verified),
    `extra` = rows each request has after its scheduled ones (the draft model's first forward
    of a step reads each request's scheduled positions plus one slot for the token just
    sampled: extra = 1)."""
    out, off = [], 0
    for rid in req_ids:
        ns = int(num_scheduled.get(rid, 0))
        if ns <= 0:
            continue
        b, p = int(computed.get(rid, 0)), int(prompt_len[rid])
        lo, hi = max(b, sink), min(b + ns, p)
        pool = (off + lo - b, off + hi - b) if hi > lo else None
        spec = int((num_spec or {}).get(rid, 0))
        out.append(Piece(rid, b, off, ns, pool, b < p <= b + ns, off + ns - spec - 1))
        off += ns + extra
    return out


class Pool:
    """One request's running prompt sum (and, with entropy weights, its weighted sum)."""

    __slots__ = ("sum", "n", "pos", "missing", "wsum", "w")

    def __init__(self, zero, start: int, sink: int) -> None:
        self.sum, self.n, self.pos = zero, 0, start
        self.missing = max(start - sink, 0)  # non-sink positions before `start`, never seen
        self.wsum, self.w = zero, 0.0  # sum of w_i * row_i and of w_i (EGTP: w_i = entropy)

    def mean(self):
        return self.sum / self.n

    def weighted(self):
        """EGTP's pool: sum w_i row_i / sum w_i; the plain mean where every weight is 0 (as
        predict/probe/features.py `pool_entropy`)."""
        return self.wsum / self.w if self.w > 0 else self.mean()


class PromptPools:
    """The per-request prompt sums of one worker, over steps. `zeros()` makes an empty sum (a
    torch or numpy vector); `dtype` is the dtype rows are summed in (fp32)."""

    def __init__(self, sink: int, zeros, dtype) -> None:
        self.sink, self.zeros, self.dtype = sink, zeros, dtype
        self.pools: dict[str, Pool] = {}

    def drop(self, req_ids) -> None:
        """Forget requests vLLM finished, aborted or preempted."""
        for rid in req_ids:
            self.pools.pop(rid, None)

    def add(self, pieces: Sequence[Piece], prompt_len: Mapping[str, int], rows, weights=None) -> list:
        """Add one step's prompt rows (`rows`: the step's tensor; `weights`: one non-negative
        weight per row, or None); [(req_id, Pool)] of the prompts completed in it. A request
        whose position is not where its sum stopped (a recompute from 0 after preemption, or a
        gap) starts a new sum."""
        done = []
        for pc in pieces:
            if pc.start >= prompt_len[pc.req_id]:
                continue
            pool = self.pools.get(pc.req_id)
            if pool is None or pool.pos != pc.start:
                pool = self.pools[pc.req_id] = Pool(self.zeros(), pc.start, self.sink)
            if pc.pool is not None:
                lo, hi = pc.pool
                pool.sum = pool.sum + rows[lo:hi].sum(0, dtype=self.dtype)
                pool.n += hi - lo
                if weights is not None:
                    w = weights[lo:hi]
                    pool.wsum = pool.wsum + (rows[lo:hi] * w[:, None]).sum(0, dtype=self.dtype)
                    pool.w += float(w.sum())
            pool.pos = pc.start + pc.rows
            if pc.prompt_done:
                done.append((pc.req_id, self.pools.pop(pc.req_id)))
        return done


@dataclass
class StepFeatures:
    """What the worker ships on one step's `ModelRunnerOutput` (fp32, only for the requests
    concerned): pooled prompt states of the prompts completed in this step, and the state of the
    last position of each request that sampled a token in it."""

    layer: int
    sink: int
    hidden: int
    prompt_ids: list[str] = field(default_factory=list)
    prompt: np.ndarray | None = None  # (len(prompt_ids), hidden) float32
    prompt_n: list[int] = field(default_factory=list)  # positions pooled
    prompt_missing: list[int] = field(default_factory=list)  # non-sink positions not seen
    prompt_egtp: np.ndarray | None = None  # (len(prompt_ids), hidden): EGTP pools (`features.egtp`)
    step_ids: list[str] = field(default_factory=list)
    step: np.ndarray | None = None  # (len(step_ids), hidden) float32
    worker_s: float = 0.0  # the hook's time in the worker so far (hook, split, copies), seconds
    worker_steps: int = 0  # forwards it has split so far
    # the draft model's pooled prompt states (`features.draft_layer`, speculative decoding with
    # a draft model): the same pooling over the drafter's own forward of the same positions
    draft_model: str | None = None  # the draft model's folder name; None: no draft hook
    draft_layer: int = 0
    draft_hidden: int = 0
    draft_ids: list[str] = field(default_factory=list)
    draft: np.ndarray | None = None  # (len(draft_ids), draft_hidden) float32
    draft_n: list[int] = field(default_factory=list)
    draft_missing: list[int] = field(default_factory=list)

    def prompts(self):
        """(req_id, vector, n pooled, n missing, EGTP vector or None) per completed prompt."""
        for i, rid in enumerate(self.prompt_ids):
            egtp = None if self.prompt_egtp is None else self.prompt_egtp[i]
            yield rid, self.prompt[i], self.prompt_n[i], self.prompt_missing[i], egtp

    def steps(self):
        """(req_id, vector) per request that sampled a token."""
        for i, rid in enumerate(self.step_ids):
            yield rid, self.step[i]

    def drafts(self):
        """(req_id, vector, n pooled, n missing) per prompt the draft model completed."""
        for i, rid in enumerate(self.draft_ids):
            yield rid, self.draft[i], self.draft_n[i], self.draft_missing[i]


def check_engine_config(vllm_config, draft_layer: int | None = None) -> None:
    """`features` needs presched's worker, eager mode (hooks run as written) and every prompt
    position computed (no prefix cache), and `features.draft_layer` a draft model; PluginConfigError naming the field otherwise
    (vLLM's `VllmConfig`, read by attribute)."""
    worker_cls = vllm_config.parallel_config.worker_cls
    if worker_cls != WORKER_CLS:
        raise PluginConfigError(f"features: needs --worker-cls {WORKER_CLS} (the hook lives in "
                                f"the worker), got {worker_cls!r}")  # fmt: skip
    if draft_layer is not None:
        spec = vllm_config.speculative_config
        if spec is None or getattr(spec, "method", None) != "draft_model":
            raise PluginConfigError("features.draft_layer: needs speculative decoding with a draft "
                                    "model (--speculative-config '{\"method\": \"draft_model\", "
                                    "\"model\": DIR, \"num_speculative_tokens\": K}'), got "
                                    f"{'none' if spec is None else getattr(spec, 'method', spec)!r}")  # fmt: skip
    if not vllm_config.model_config.enforce_eager:
        raise PluginConfigError("features: needs --enforce-eager: otherwise vLLM compiles the "
                                "model (torch.compile on CPU, CUDA graphs on GPU), and the compiled "
                                "forward does not run the hook as written (on CPU the engine fails "
                                "to start: Dynamo cannot trace the hook's timer)")  # fmt: skip
    if vllm_config.cache_config.enable_prefix_caching:
        raise PluginConfigError("features: needs prefix caching off (--no-enable-prefix-caching): "
                                "positions served from the prefix cache are not computed, so the "
                                "hook would pool only part of the prompt")  # fmt: skip


def pack(vec: np.ndarray) -> bytes:
    """A feature vector as stored in the records (little-endian float32)."""
    return np.asarray(vec, dtype="<f4").tobytes()


def unpack(blob: bytes) -> np.ndarray:
    return np.frombuffer(blob, dtype="<f4").astype(np.float32)


def deliver(sf: StepFeatures, seqs: Mapping[str, object]) -> None:
    """Keep one step's features on the scheduler's seqs (`EngineSeq`, by request id): the pooled
    prompt state replaces `features_prompt` (its EGTP pool `features_egtp`; a preempted request
    ships them again after its recompute), the per-step state replaces `features_step` and counts in `feature_steps`; its
    token number g (the state of the position reading generated token g, or of the prompt's
    last position when g = 0) goes in `features_step_g`; the draft model's pooled prompt state
    replaces `features_draft` (counted in `draft_pools`)."""
    for rid, vec, n, missing, egtp in sf.prompts():
        seq = seqs.get(rid)
        if seq is not None:
            seq.features_prompt, seq.features_n, seq.features_missing = vec, n, missing
            seq.features_egtp = egtp
            seq.feature_pools += 1
    for rid, vec in sf.steps():
        seq = seqs.get(rid)
        if seq is not None:  # called before the step's tokens are counted: `generated` is g
            seq.features_step, seq.features_step_g = vec, seq.generated
            seq.feature_steps += 1
    for rid, vec, n, missing in sf.drafts():
        seq = seqs.get(rid)
        if seq is not None:
            seq.features_draft, seq.draft_n, seq.draft_missing = vec, n, missing
            seq.draft_pools += 1
