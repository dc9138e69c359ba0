"""`DraftHook`: the draft model's pooled prompt state, in the worker (OUTLETS; issue 15).

With speculative decoding by a draft model (`--speculative-config '{"method": "draft_model",
...}'`) vLLM's model runner keeps the drafter at `model_runner.drafter` (a `DraftModelProposer`)
and runs it inside `sample_tokens`, after the target model sampled: its first forward of a step
reads every scheduled position of each request again (its own KV cache has to follow the
target's), plus one slot per request for the token just sampled; the k - 1 forwards after it
read one row per request (the draft tokens), which this hook ignores. So the first forward's
rows split like the target's with one extra row per request (`split_rows(..., extra=1)`), and
the prompt rows pool exactly as the target hook pools them (`PromptPools`: mean without the
sink positions, summed in fp32 across chunked-prefill chunks, restarted after a recompute).

A step in which vLLM does not run the drafter (the batch does not fit it) leaves a gap: that
request's sum restarts and counts the positions it never saw in `missing`. Only the engine
process imports this module (torch).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import torch

from presched.engine.plugin.config import PluginConfigError
from presched.engine.plugin.features import PromptPools, split_rows
from presched.engine.plugin.layout import decoder_layers, residual_stream

log = logging.getLogger("presched.engine.plugin")


class DraftHook:
    """A forward hook on decoder layer `layer` of the drafter of `runner`."""

    def __init__(self, runner, layer: int, sink: int) -> None:
        drafter = getattr(runner, "drafter", None)
        model = getattr(drafter, "model", None)
        if model is None:
            raise PluginConfigError("features.draft_layer: this engine has no draft model (start it "
                                    "with --speculative-config '{\"method\": \"draft_model\", ...}')")  # fmt: skip
        layers = decoder_layers(model)
        if not 0 <= layer < len(layers):
            raise PluginConfigError(f"features.draft_layer: {layer} is not in 0..{len(layers) - 1} "
                                    f"(the draft model has {len(layers)} decoder layers)")  # fmt: skip
        dcfg = runner.speculative_config.draft_model_config
        self.model, self.layer, self.sink = Path(dcfg.model).name, layer, sink
        self.hidden = int(dcfg.get_hidden_size())
        self.device = next(model.parameters()).device
        self.pools = PromptPools(sink, self._zeros, torch.float32)
        self.rows: torch.Tensor | None = None
        self.busy_s = 0.0
        layers[layer].register_forward_hook(self._hook)
        log.info("presched features: draft hook on layer %d of %d of %s (hidden %d)",
                 layer, len(layers), self.model, self.hidden)  # fmt: skip

    def _zeros(self) -> torch.Tensor:
        return torch.zeros(self.hidden, dtype=torch.float32, device=self.device)

    def _hook(self, _module, _inputs, out) -> None:
        if self.rows is not None:  # a later draft forward of the step: one row per request
            return
        t0 = time.perf_counter()
        self.rows = residual_stream(out)
        self.busy_s += time.perf_counter() - t0

    def begin(self) -> None:
        self.rows = None

    @torch.inference_mode()
    def collect(self, so, order, computed, plen) -> list:
        """[(req_id, Pool)] of the prompts whose last position the drafter read in this step
        (`so`: the step's scheduler output; `order`, `computed`, `plen`: as the target hook split
        it). The sums of requests vLLM finished or preempted were dropped by the target hook's
        `collect` earlier in the same step."""
        hs, self.rows = self.rows, None
        if hs is None or not order:
            return []
        t0 = time.perf_counter()
        try:
            spec = {r: len(t) for r, t in so.scheduled_spec_decode_tokens.items()}
            pieces = split_rows(order, so.num_scheduled_tokens, computed, plen, self.sink, spec, extra=1)
            need = sum(pc.rows + 1 for pc in pieces)
            if hs.shape[0] < need:
                raise RuntimeError(f"presched features: the draft model's first forward saw "
                                   f"{hs.shape[0]} rows for {need} (scheduled tokens + 1 per request)")  # fmt: skip
            return self.pools.add(pieces, plen, hs)
        finally:
            self.busy_s += time.perf_counter() - t0
