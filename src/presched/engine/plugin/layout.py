"""Where the hidden-state hooks attach in a vLLM causal LM (the Llama family layout), for the
served model's hook (worker.py) and the draft model's (draft.py). Engine process only (torch)."""

from __future__ import annotations

import torch

from presched.engine.plugin.config import PluginConfigError


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The decoder layers of a vLLM causal LM (`model.model.layers`, Llama family)."""
    layers = getattr(getattr(model, "model", None), "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise PluginConfigError(f"features: cannot find the decoder layers of {type(model).__name__} "
                                "(expected model.model.layers, the Llama family layout)")  # fmt: skip
    return layers


def residual_stream(out) -> torch.Tensor:
    """A decoder layer's output as the residual stream: vLLM's Llama layers return
    (hidden, residual) with the residual not yet added, so the stream is their sum."""
    if isinstance(out, tuple):
        h, r = out[0], out[1]
        return h if r is None else h + r
    return out
