"""Prompt features from the serving model's own hidden states: the transformers reference.

What the engine hook (issue 15) must reproduce, computed here with plain transformers (needs
torch; import this module only where torch exists — the `probe` / `egtp` predictors themselves
need only numpy):

- **residual stream at layer L**: the output of decoder layer L (read with a forward hook; it
  equals `hidden_states[L + 1]` of a transformers forward except for the last layer, where
  transformers puts the final-norm output instead). In vLLM's Llama the same tensor is
  `hidden + residual` of layer L's output (the residual add is fused into the next norm).
- **mean pool without the sink**: the first `sink` prompt positions are left out. SmolLM2's
  first token carries a massive activation (layer-15 norm ~25,000 against ~130 for the others,
  ../shared/notes/in-engine.md), so a plain mean is that one token.
- **EGTP entropy-weighted pool**: position i weighs `H_i / sum_j H_j`, where H_i is the entropy
  (nats) of the model's own next-token distribution at i (softmax of the final logits), over
  the same non-sink positions; if every H_i is 0 the weights fall back to uniform.

    feat = PromptFeaturizer(model_dir, layer=15)
    out = feat.encode(["What is 2+2?", ...])      # {"mean": (n, d), "egtp": (n, d), "n_tokens": (n,)}

`FeatureSpec` names what a feature vector is (model, layer, pooling, sink); probe files store it
and refuse vectors of another spec.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from presched.predict.probe.spec import FeatureSpec


def token_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Entropy in nats of softmax(logits) along the last axis."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def _keep(mask: torch.Tensor, sink: int) -> torch.Tensor:
    """`mask` (b, t; 1 = real token, left or right padded) with each row's first `sink` real
    positions cleared; ValueError if a row would be left empty."""
    order = torch.cumsum(mask.long(), dim=1)  # 1 at the first real token
    keep = mask.bool() & (order > sink)
    if not keep.any(dim=1).all():
        raise ValueError(f"a prompt has no tokens after its first {sink} sink token(s)")
    return keep


def pool_mean(states: torch.Tensor, mask: torch.Tensor, sink: int = 1) -> torch.Tensor:
    """(b, t, d) states -> (b, d): mean over each row's real positions after the first `sink`."""
    keep = _keep(mask, sink).to(states.dtype)
    return (states * keep[..., None]).sum(1) / keep.sum(1, keepdim=True)


def pool_entropy(states: torch.Tensor, entropy: torch.Tensor, mask: torch.Tensor,
                 sink: int = 1) -> torch.Tensor:  # fmt: skip
    """(b, t, d) states, (b, t) entropies -> (b, d): EGTP pooling, weights H_i / sum H over each
    row's real positions after the first `sink` (uniform where those entropies sum to 0)."""
    keep = _keep(mask, sink).to(states.dtype)
    w = entropy.to(states.dtype).clamp_min(0) * keep
    tot = w.sum(1, keepdim=True)
    w = torch.where(tot > 0, w / tot.clamp_min(1e-30), keep / keep.sum(1, keepdim=True))
    return (states * w[..., None]).sum(1)


class PromptFeaturizer:
    """A causal LM folder (e.g. SmolLM2 from `presched.engine.models.ensure_smollm2`) read with
    transformers; `encode` chat-templates the prompts and returns both pooled features."""

    def __init__(self, model_dir: str | Path, layer: int | None = None, sink: int = 1,
                 threads: int = 1, batch: int = 8, model_name: str | None = None) -> None:  # fmt: skip
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        torch.set_num_threads(threads)
        self.model_dir = Path(model_dir)
        n_layers = AutoConfig.from_pretrained(self.model_dir).num_hidden_layers
        self.layer = n_layers // 2 if layer is None else layer
        if not 0 <= self.layer < n_layers:
            raise ValueError(f"layer: {self.layer} is not in 0..{n_layers - 1}")
        self.tok = AutoTokenizer.from_pretrained(self.model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32).eval()
        self.sink, self.batch = sink, batch
        self.name = model_name or self.model_dir.name
        self.hidden = self.model.config.hidden_size

    def spec(self, pooling: str) -> FeatureSpec:
        return FeatureSpec(model=self.name, layer=self.layer, hidden=self.hidden, pooling=pooling,
                           sink=self.sink)  # fmt: skip

    def token_ids(self, prompts: Sequence[str]) -> list[list[int]]:
        """Each prompt as one user turn of the chat template, with the generation prompt."""
        return [list(self.tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                                  tokenize=True, return_dict=False)) for p in prompts]  # fmt: skip

    @torch.inference_mode()
    def encode_ids(self, ids: Sequence[Sequence[int]]) -> dict[str, np.ndarray]:
        """Features of already tokenised prompts, batched with right padding."""
        means, egtps = [], []
        pad = self.model.config.pad_token_id or 0
        for i in range(0, len(ids), self.batch):
            chunk = ids[i : i + self.batch]
            width = max(map(len, chunk))
            x = torch.tensor([list(p) + [pad] * (width - len(p)) for p in chunk])
            mask = torch.tensor([[1] * len(p) + [0] * (width - len(p)) for p in chunk])
            seen: list[torch.Tensor] = []
            hook = self.model.model.layers[self.layer].register_forward_hook(
                lambda _m, _i, o: seen.append(o[0] if isinstance(o, tuple) else o))
            try:
                out = self.model(input_ids=x, attention_mask=mask)
            finally:
                hook.remove()
            states = seen[0]
            means.append(pool_mean(states, mask, self.sink))
            egtps.append(pool_entropy(states, token_entropy(out.logits), mask, self.sink))
        return {"mean": torch.cat(means).numpy(), "egtp": torch.cat(egtps).numpy(),
                "n_tokens": np.array([len(p) for p in ids])}  # fmt: skip

    def encode(self, prompts: Sequence[str]) -> dict[str, np.ndarray]:
        return self.encode_ids(self.token_ids(prompts))

    @torch.inference_mode()
    def encode_steps(self, pairs: Sequence[tuple[Sequence[int], Sequence[int]]],
                     steps: Sequence[int]) -> np.ndarray:  # fmt: skip
        """`probe-refine`'s inputs: for each (prompt ids, answer ids) and each g in `steps`, the
        residual stream at `layer` at the position of the answer's g-th token (what the model
        has read after generating g tokens; the engine hook ships the same state in the step
        that reads that token). (n, len(steps), d); NaN rows where the answer has <= g tokens
        (it was no longer running then). One forward per answer, cut after its last needed token."""
        steps = sorted(set(int(g) for g in steps))
        if not steps or steps[0] < 1:
            raise ValueError(f"steps: need positive token counts, got {steps}")
        out = np.full((len(pairs), len(steps), self.hidden), np.nan, dtype=np.float32)
        pad = self.model.config.pad_token_id or 0
        for i in range(0, len(pairs), self.batch):
            chunk = pairs[i : i + self.batch]
            seqs, wanted = [], []
            for prompt, answer in chunk:
                gs = [g for g in steps if len(answer) > g]
                wanted.append(gs)
                seqs.append(list(prompt) + list(answer[: gs[-1]]) if gs else list(prompt[:1]))
            width = max(map(len, seqs))
            x = torch.tensor([s + [pad] * (width - len(s)) for s in seqs])
            mask = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
            seen: list[torch.Tensor] = []
            hook = self.model.model.layers[self.layer].register_forward_hook(
                lambda _m, _i, o: seen.append(o[0] if isinstance(o, tuple) else o))
            try:
                self.model(input_ids=x, attention_mask=mask)
            finally:
                hook.remove()
            for j, ((prompt, _), gs) in enumerate(zip(chunk, wanted)):
                for g in gs:
                    out[i + j, steps.index(g)] = seen[0][j, len(prompt) + g - 1].numpy()
        return out
