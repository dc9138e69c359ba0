"""`preflight`: the plugin config checks the engine makes at start, made before vLLM starts.

The launcher (`presched.engine.launch.start_engine`) calls it so that a bad policy parameter (or
one the policy's `attach` refuses in the engine, e.g. `slo` without `tpot_s`), a probe file of
other features or a draft layer without a draft model fails in a second, naming the field,
instead of after vLLM's minute of start-up. Reads the models' `config.json` only
(no vllm, no torch).
"""

from __future__ import annotations

import json
from pathlib import Path

from presched.engine.plugin.config import PluginConfig, PluginConfigError, build_policy, parse_plugin_config
from presched.schedule.interface import EngineInfo


def _layers_hidden(model_dir: Path) -> tuple[int, int]:
    hf = json.loads((model_dir / "config.json").read_text())
    return int(hf["num_hidden_layers"]), int(hf["hidden_size"])


def preflight(plugin: dict, model_dir: Path, draft_model: Path | None = None,
              speculative_elsewhere: bool = False, max_num_seqs: int = 256) -> PluginConfig:  # fmt: skip
    """The validated config; PluginConfigError naming the field. `draft_model`: the draft
    model's folder when the launcher configures speculative decoding; `speculative_elsewhere`:
    the caller passes its own --speculative-config (the draft checks are then the engine's);
    `max_num_seqs`: the engine's, for the policy's `attach`."""
    cfg = parse_plugin_config(dict(plugin))
    policy = build_policy(cfg)  # the engine builds it again; this fails fast, naming the field
    # ... and attaches it to what the engine reports (scheduler.py): a policy that needs what the
    # engine does not give (slo's tpot_s: no step model there) fails here, as it would there.
    # The KV numbers are stand-ins (the engine knows its blocks only after profiling memory);
    # the engine always reports some, so a policy cannot fail on their absence there either.
    try:
        policy.attach(EngineInfo(kv_tokens=2**20, block_size=16, max_num_seqs=max_num_seqs,
                                 max_num_batched_tokens=8192))  # fmt: skip
    except ValueError as e:
        raise PluginConfigError(f"params: {e}") from None
    if cfg.probe is not None:
        from presched.engine.plugin.probe import EngineProbe

        EngineProbe(cfg.probe, cfg.features, model_dir.name, *_layers_hidden(model_dir))
    if cfg.refine is not None:
        from presched.engine.plugin.refine import EngineRefine

        EngineRefine(cfg.refine, cfg.features, cfg.refine_at, model_dir.name, *_layers_hidden(model_dir))
    draft_layer = cfg.features.draft_layer if cfg.features is not None else None
    if draft_layer is not None and draft_model is None and not speculative_elsewhere:
        raise PluginConfigError("features.draft_layer: needs a draft model (draft_model / --draft-model): "
                                "the engine would refuse to start")  # fmt: skip
    if cfg.draft_probe is not None and draft_model is not None:
        from presched.engine.plugin.probe import EngineProbe

        EngineProbe(cfg.draft_probe, cfg.features, draft_model.name, *_layers_hidden(draft_model), role="draft")
    return cfg
