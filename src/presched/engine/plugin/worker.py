"""`PreschedCPUWorker`: vLLM's CPU worker with a forward hook on one decoder layer (issue 15).

    python -m vllm.entrypoints.openai.api_server ... --no-enable-prefix-caching --enforce-eager \\
        --worker-cls presched.engine.plugin.worker.PreschedCPUWorker \\
        --scheduler-cls presched.engine.plugin.scheduler.PreschedScheduler
    # with PRESCHED_PLUGIN_CONFIG='{"features": {"layer": 15, "sink_tokens": 1}}';
    # `presched.engine.launch --scheduler presched --features` sets all three

After `load_model` it registers a forward hook on `model.model.layers[features.layer]` (Llama
family layout). vLLM's layers return `(hidden, residual)` with the residual add fused into the
next layer's norm, so the hook keeps `hidden + residual`: the residual stream, what the
transformers decoder layer `layer` outputs. After each forward the rows go to requests
(`features.split_rows`); a completed prompt ships its pooled state (the mean of its non-sink
positions, summed in fp32 across chunked-prefill chunks) and every request that sampled a token
ships the state of its last verified position. They travel as `StepFeatures` on the step's
`ModelRunnerOutput` (V1 returns it from `sample_tokens()`), pickled by vLLM's own worker ->
engine-core queue, to `PreschedScheduler.update_from_output`.

With `features.egtp` the hook also keeps the final norm's rows and, for the pooled prompt rows
only, applies vLLM's own `compute_logits` to them (in chunks) for the entropy of the next-token
distribution at each position: the weights of EGTP's pool, summed like the mean across chunks.

With `features.draft_layer` (speculative decoding by a draft model) a `DraftHook` (draft.py)
pools the draft model's prompt states the same way; they ship in the same `StepFeatures`.

Sums are dropped when vLLM reports the request finished, aborted or preempted, and restarted
when its computed tokens go back (recompute after preemption). Features off (no `features` in
the plugin config): the worker is vLLM's CPUWorker unchanged. Only the engine process imports
this module (vllm, torch).
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager

import numpy as np
import torch
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput
from vllm.v1.worker.cpu_worker import CPUWorker

from presched.engine.plugin.config import FeatureConfig, PluginConfigError, load_plugin_config
from presched.engine.plugin.draft import DraftHook
from presched.engine.plugin.features import FEATURES_ATTR, PromptPools, StepFeatures, split_rows
from presched.engine.plugin.layout import decoder_layers, residual_stream

log = logging.getLogger("presched.engine.plugin")
ENTROPY_CHUNK = 256  # prompt rows per LM-head call for EGTP's entropies (bounds the logits' memory)


class FeatureHook:
    """The hook and the per-request prompt sums of one worker."""

    def __init__(self, runner, cfg: FeatureConfig) -> None:
        self.runner = runner
        layers = decoder_layers(runner.model)
        n = len(layers)
        self.layer = n // 2 if cfg.layer is None else cfg.layer
        if not 0 <= self.layer < n:
            raise PluginConfigError(f"features.layer: {self.layer} is not in 0..{n - 1} "
                                    f"(the model has {n} decoder layers)")  # fmt: skip
        self.sink, self.steps = cfg.sink_tokens, cfg.steps
        self.hidden = int(runner.model_config.get_hidden_size())
        self.pools = PromptPools(self.sink, self._zeros, torch.float32)
        self.device = next(runner.model.parameters()).device
        self.rows: torch.Tensor | None = None
        self.pending: tuple | None = None
        self.busy_s, self.steps_seen = 0.0, 0  # time in the hook, collect and attach; forwards
        layers[self.layer].register_forward_hook(self._hook)
        log.info("presched features: hook on decoder layer %d of %d (hidden %d, sink %d, steps %s)",
                 self.layer, n, self.hidden, self.sink, self.steps)  # fmt: skip
        self.final: torch.Tensor | None = None  # the final norm's rows (EGTP's entropies)
        self.egtp = cfg.egtp
        if self.egtp:
            norm = getattr(runner.model.model, "norm", None)
            if not isinstance(norm, torch.nn.Module) or not hasattr(runner.model, "compute_logits"):
                raise PluginConfigError(f"features.egtp: {type(runner.model).__name__} has no final norm "
                                        "(model.model.norm) and compute_logits (the Llama family layout)")  # fmt: skip
            norm.register_forward_hook(self._final_hook)
        self.draft = None
        if cfg.draft_layer is not None:
            self.draft = DraftHook(runner, cfg.draft_layer, self.sink)
        self._split_of: tuple | None = None  # (scheduler output, batch order, computed, prompt lengths)

    def _zeros(self) -> torch.Tensor:
        return torch.zeros(self.hidden, dtype=torch.float32, device=self.device)

    @contextmanager
    def _timed(self):
        """Count the enclosed work in `busy_s` (the hook's own cost, in the stats file)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.busy_s += time.perf_counter() - t0

    def _hook(self, _module, _inputs, out) -> None:
        with self._timed():
            self.rows = residual_stream(out)

    def _final_hook(self, _module, _inputs, out) -> None:
        self.final = out[0] if isinstance(out, tuple) else out

    def entropies(self, pieces, n_rows: int) -> torch.Tensor:
        """One weight per row of the step: the entropy (nats) of the model's next-token
        distribution at each pooled prompt row (softmax of vLLM's own `compute_logits` on the
        final norm's output), 0 elsewhere; in chunks of ENTROPY_CHUNK rows."""
        final, self.final = self.final, None
        w = torch.zeros(n_rows, dtype=torch.float32, device=self.device)
        spans = [torch.arange(*pc.pool) for pc in pieces if pc.pool is not None]
        if not spans or final is None:
            return w
        idx_t = torch.cat(spans).to(final.device)
        for k in range(0, len(idx_t), ENTROPY_CHUNK):
            part = idx_t[k : k + ENTROPY_CHUNK]
            logp = torch.log_softmax(self.runner.model.compute_logits(final.index_select(0, part)).float(), dim=-1)
            w[part] = (-(logp.exp() * logp).sum(-1)).clamp_min(0)
        return w

    def begin(self) -> None:
        self.rows, self.pending, self._split_of = None, None, None  # a warm-up or profile forward left its rows here
        self.final = None
        if self.draft is not None:
            self.draft.begin()

    @torch.inference_mode()
    def collect(self, so) -> None:
        """Split the step's rows (scheduler output `so`) into prompt sums and last rows."""
        gone = (*so.finished_req_ids, *(so.preempted_req_ids or ()))
        self.pools.drop(gone)
        if self.draft is not None:
            self.draft.pools.drop(gone)
        hs, self.rows = self.rows, None
        if hs is None or so.total_num_scheduled_tokens == 0:
            return
        self.steps_seen += 1
        with self._timed():
            self._split(so, hs)

    def _split(self, so, hs: torch.Tensor) -> None:
        if hs.shape[0] < so.total_num_scheduled_tokens:
            raise RuntimeError(f"presched features: the hooked layer saw {hs.shape[0]} rows for "
                               f"{so.total_num_scheduled_tokens} scheduled tokens")  # fmt: skip
        computed = {r.req_id: r.num_computed_tokens for r in so.scheduled_new_reqs}
        cached = so.scheduled_cached_reqs
        computed.update(zip(cached.req_ids, cached.num_computed_tokens))
        ib, reqs = self.runner.input_batch, self.runner.requests
        order = [r for r in ib.req_ids[: ib.num_reqs] if r in so.num_scheduled_tokens]
        plen = {r: reqs[r].num_prompt_tokens for r in order}
        spec = {r: len(t) for r, t in so.scheduled_spec_decode_tokens.items()}
        pieces = split_rows(order, so.num_scheduled_tokens, computed, plen, self.sink, spec)
        weights = self.entropies(pieces, hs.shape[0]) if self.egtp else None
        done = self.pools.add(pieces, plen, hs, weights)
        last = None
        if self.steps and pieces:
            idx = torch.tensor([pc.last for pc in pieces], device=hs.device)
            last = hs.index_select(0, idx).float()
        self.pending = (done, [pc.req_id for pc in pieces], last, [])
        self._split_of = (so, order, computed, plen)

    def collect_draft(self) -> None:
        """After `sample_tokens` (where vLLM runs the drafter): pool the draft model's rows of
        the step split by `collect`, for the pending features."""
        split, self._split_of = self._split_of, None
        if self.draft is None or split is None or self.pending is None:
            return
        self.pending[3].extend(self.draft.collect(*split))

    def attach(self, output) -> None:
        """Put the pending `StepFeatures` on `output` (requests that sampled a token only)."""
        pending, self.pending = self.pending, None
        if pending is None or output is EMPTY_MODEL_RUNNER_OUTPUT:
            return
        with self._timed():
            self._attach(output, pending)

    def _attach(self, output, pending: tuple) -> None:
        if not isinstance(output, ModelRunnerOutput):
            raise RuntimeError("presched features: the worker returned "
                               f"{type(output).__name__}, not a ModelRunnerOutput (async "
                               "scheduling is not supported with features)")  # fmt: skip
        done, ids, last, drafted = pending
        sf = StepFeatures(layer=self.layer, sink=self.sink, hidden=self.hidden,
                          worker_s=self.busy_s, worker_steps=self.steps_seen)  # fmt: skip
        if self.draft is not None:
            d = self.draft
            sf.worker_s += d.busy_s
            sf.draft_model, sf.draft_layer, sf.draft_hidden = d.model, d.layer, d.hidden
            drafted = [(r, p) for r, p in drafted if p.n > 0]
            if drafted:
                sf.draft_ids, sf.draft, sf.draft_n, sf.draft_missing = _pack(drafted)
        done = [(r, p) for r, p in done if p.n > 0]
        if done:
            sf.prompt_ids, sf.prompt, sf.prompt_n, sf.prompt_missing = _pack(done)
            if self.egtp:
                sf.prompt_egtp = torch.stack([p.weighted() for _, p in done]).cpu().numpy()
        if last is not None:
            index, sampled = output.req_id_to_index, output.sampled_token_ids
            keep = [i for i, r in enumerate(ids) if r in index and sampled[index[r]]]
            if keep:
                sf.step_ids = [ids[i] for i in keep]
                sf.step = last[keep].cpu().numpy().astype(np.float32, copy=False)
        if sf.prompt_ids or sf.step_ids or sf.draft_ids:
            setattr(output, FEATURES_ATTR, sf)


def _pack(done: list) -> tuple[list[str], np.ndarray, list[int], list[int]]:
    """[(req_id, Pool)] -> their ids, mean pools (one float32 row each), positions pooled and
    positions missing: the StepFeatures fields of a list of completed prompt pools."""
    return ([r for r, _ in done], torch.stack([p.mean() for _, p in done]).cpu().numpy(),
            [p.n for _, p in done], [p.missing for _, p in done])


class PreschedCPUWorker(CPUWorker):
    """CPUWorker + `FeatureHook` when the plugin config has `features` (module doc)."""

    feature_hook: FeatureHook | None = None

    def load_model(self, *args, **kwargs):
        out = super().load_model(*args, **kwargs)
        cfg = load_plugin_config().features
        if cfg is not None:
            self.feature_hook = FeatureHook(self.model_runner, cfg)
        return out

    def execute_model(self, scheduler_output):
        hook = self.feature_hook
        if hook is None:
            return super().execute_model(scheduler_output)
        hook.begin()
        output = super().execute_model(scheduler_output)
        hook.collect(scheduler_output)
        if output is not None:
            hook.attach(output)
        return output

    def sample_tokens(self, grammar_output):
        output = super().sample_tokens(grammar_output)
        if self.feature_hook is not None:
            self.feature_hook.collect_draft()
            self.feature_hook.attach(output)
        return output
