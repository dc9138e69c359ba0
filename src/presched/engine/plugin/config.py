"""`PluginConfig`: what the in-engine scheduler runs, given to the engine at start.

The launcher (`python -m presched.engine.launch --scheduler presched --policy NAME --param k=v
--predictor model.npz`) writes it as JSON into the environment variable `PRESCHED_PLUGIN_CONFIG`
of the engine process; by hand, set that variable to a JSON object or to the path of a JSON/YAML
file:

    PRESCHED_PLUGIN_CONFIG='{"policy": "mlfq", "params": {"preempt": true, "within": "mean"}}' \\
    python -m vllm.entrypoints.openai.api_server ... \\
        --scheduler-cls presched.engine.plugin.scheduler.PreschedScheduler

`load_plugin_config()` validates everything, including constructing the policy (so a bad
parameter is found before the first request); every error is a `PluginConfigError` naming the
dotted field (`params.base_quantum: ...`). The scheduler calls it in its constructor, so the engine
refuses to start.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, field_validator

from presched.config import Config, format_validation_error

CONFIG_ENV = "PRESCHED_PLUGIN_CONFIG"
DRAFT_NEEDS_FEATURES = ("draft_probe: needs `features` with draft_layer set (the draft model's "
                        "pooled prompt states it reads)")  # fmt: skip
PROBE_NEEDS_FEATURES = ("probe: needs `features` (the worker hook that pools the prompt states "
                        "the probe reads); set features: {} or drop probe")  # fmt: skip


class PluginConfigError(ValueError):
    """A bad in-engine scheduler configuration; the message names the field."""


class FeatureConfig(Config):
    """The hidden-state hook of `presched.engine.plugin.worker` (issue 15): which layer's residual
    stream is pooled per prompt and shipped per generated token."""

    layer: int | None = Field(None, ge=0, description="Decoder layer whose output (hidden + residual, the residual stream) is read; None: n_layers // 2. Checked against the model when the worker loads it.")
    sink_tokens: int = Field(1, ge=0, description="Leading prompt positions left out of the pooled prompt state (SmolLM2's first token carries a massive activation that would dominate a plain mean).")
    steps: bool = Field(True, description="Also ship the state of the last position of every request that sampled a token in a step (the per-step state); False: only the pooled prompt state.")
    egtp: bool = Field(False, description="Also pool the prompt state weighted by the entropy of the model's own next-token distribution at each position (EGTP), for an `egtp` probe file. vLLM computes logits only where it samples, so the worker applies the LM head to the final hidden state of every pooled prompt row: about vocab x hidden multiply-adds per prompt token (SmolLM2's LM head is 28 M of its 135 M parameters: about a quarter more multiply-adds per prompt token; the hook's time is in the stats, features_worker_s).")
    record_steps: tuple[int, ...] = Field((16, 64, 256), max_length=64, description="With `records` and steps on: generated-token counts g at which each request's per-step state (the state at its g-th generated token) is kept and, when the request is freed, written to the records' `step_features` table (one row per g the request reached, L > g), for `presched train -p probe-refine --from-log`. At most len(record_steps) vectors per running request; () or records off: none kept.")
    draft_layer: int | None = Field(None, ge=0, description="Also pool the prompt state at this decoder layer of the speculative-decoding draft model (OUTLETS; needs --speculative-config with method draft_model), the same way (mean without the sink tokens), for `draft_probe`. None: off. Checked against the draft model when the worker loads it.")


class PluginConfig(Config):
    policy: str = Field("fcfs", min_length=1, description="Name of a registered presched policy (presched.schedule.POLICIES), e.g. fcfs, sjf, srpt, mlfq, kv-admission, srpt-oracle.")
    params: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the policy (the same as `policy_params` in the simulator and the gateway).")
    predictor: Path | None = Field(None, description="A model file from `presched train`, loaded in the engine process; predicts requests that carry no prediction in vllm_xargs. None: requests without one have no estimate (length-aware policies then fall back to FCFS for them, counted).")
    tokenizer: str | None = Field(None, description="Tokenizer (folder or name) that turns prompt token ids back into text for the predictor; default: the served model's.")
    records: Path | None = Field(None, description="SQLite file that gets one row per finished request, in the gateway's request-log schema plus preemptions and recomputed_tokens. None: no records.")
    store_prompts: bool = Field(False, description="Also store the prompt text (decoded with the tokenizer) in the records, for `presched train --from-log` with text predictors.")
    stats: Path | None = Field(None, description="JSON file with the plugin's counters (policy errors per hook, predictions by source, bad vllm_xargs, preemptions asked by the policy, the plugin's own time plugin_own_s over steps), rewritten at start, when a request finishes (at most once a second while others run, always when the engine goes idle), after the first policy error (then at most once a second) and at shutdown. None: counters only in the engine log.")
    features: FeatureConfig | None = Field(None, description="Hidden-state features from the worker hook (needs `--worker-cls presched.engine.plugin.worker.PreschedCPUWorker` and prefix caching off; the launcher's --features sets both). None: off.")
    probe: Path | None = Field(None, description="A probe model file (`presched train -p probe`), loaded in the engine core and run on each request's pooled prompt state after prefill: its prediction replaces the request's estimate unless the request sent its own in vllm_xargs. An `egtp` file (`presched train -p egtp`) reads the entropy-weighted pools and needs `features.egtp`. Needs `features`; its FeatureSpec (model, layer, hidden, sink, pooling) must be what the hook pools from the served model. None: off.")
    refine: Path | None = Field(None, description="A probe-refine model file (predict/probe/refine.py), loaded in the engine core: when a request's per-step state is at a `refine_at` generated token, its estimate is replaced by probe-refine's (total length given L > g, from that state and the pooled prompt state) unless the request sent its own in vllm_xargs. Needs `features` with steps on; the file's model, layer, sink and width must be what the hook reads. None: off.")
    draft_probe: Path | None = Field(None, description="A draft-probe model file (`presched train -p draft-probe`), loaded in the engine core and run on each request's pooled prompt state from the draft model (`features.draft_layer`): its prediction replaces the request's estimate unless the request sent its own in vllm_xargs or a `probe` or `refine` estimate (the served model's own states) replaced it. Its FeatureSpec (draft model, layer, hidden, sink) must be what the draft hook pools. None: off.")
    refine_at: tuple[int, ...] = Field((16, 64, 256), min_length=1, max_length=64, description="Generated-token counts at which `refine` replaces a running request's estimate.")
    imports: tuple[str, ...] = Field((), description="Modules (dotted names or .py paths) imported before the policy is built, e.g. to register your own policies.")

    @field_validator("stats", "records")
    @classmethod
    def _a_file_path(cls, v: Path | None, info) -> Path | None:
        """A file the plugin can write (checked here, before vLLM's slow start): not a folder;
        the stats file's folder must exist (the records' is made)."""
        if v is None:
            return v
        if v.is_dir():
            raise ValueError(f"{v} is a folder; give a file path")
        if info.field_name == "stats" and not v.parent.is_dir():
            raise ValueError(f"{v}: its folder {v.parent} does not exist")
        return v


def read_config_text(raw: str) -> dict:
    """A JSON object, or the path of a JSON/YAML file holding one, as a mapping."""
    text = raw.strip()
    if not text.startswith("{"):
        path = Path(text).expanduser()
        if not path.is_file():
            raise PluginConfigError(f"{CONFIG_ENV}: neither a JSON object nor an existing file: {raw!r}")
        text = path.read_text(encoding="utf-8")
        try:
            data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
        except (json.JSONDecodeError, yaml.YAMLError) as e:
            raise PluginConfigError(f"{CONFIG_ENV}: {path} is not valid JSON/YAML: {e}") from None
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise PluginConfigError(f"{CONFIG_ENV}: not valid JSON: {e}") from None
    if not isinstance(data, dict):
        raise PluginConfigError(f"{CONFIG_ENV}: the top level must be an object, got {type(data).__name__}")
    return data


def _import(name: str) -> None:
    try:
        if name.endswith(".py"):
            path = Path(name)
            spec = importlib.util.spec_from_file_location(path.stem, path)
            if spec is None or spec.loader is None or not path.is_file():
                raise ImportError(f"no such file {path}")
            mod = importlib.util.module_from_spec(spec)
            sys.modules[path.stem] = mod
            spec.loader.exec_module(mod)
        else:
            importlib.import_module(name)
    except Exception as e:  # noqa: BLE001 - any failure of a user module is a config error
        raise PluginConfigError(f"imports: cannot import {name!r}: {type(e).__name__}: {e}") from None


def build_policy(cfg: PluginConfig):
    """The configured policy object; errors name `policy` or `params.<field>`."""
    from presched.registry import UnknownNameError
    from presched.schedule import POLICIES
    from presched.schedule.params import ParamsError

    for name in cfg.imports:
        _import(name)
    try:
        factory = POLICIES.get(cfg.policy)
    except UnknownNameError as e:
        raise PluginConfigError(f"policy: {e}") from None
    try:
        return factory(**cfg.params)
    except ParamsError as e:  # the policy's typed parameters: dotted paths under params
        raise PluginConfigError(str(e.under("params"))) from None
    except (TypeError, ValueError) as e:
        raise PluginConfigError(f"params: {e}") from None


def parse_plugin_config(data: dict) -> PluginConfig:
    try:
        cfg = PluginConfig.model_validate(data)
    except ValidationError as e:
        raise PluginConfigError(format_validation_error(e)) from None
    if cfg.predictor is not None and not cfg.predictor.is_file():
        raise PluginConfigError(f"predictor: model file not found: {cfg.predictor}")
    if cfg.probe is not None:
        if cfg.features is None:
            raise PluginConfigError(PROBE_NEEDS_FEATURES)
        if not cfg.probe.is_file():
            raise PluginConfigError(f"probe: model file not found: {cfg.probe}")
    if cfg.refine is not None:
        if cfg.features is None or not cfg.features.steps:
            raise PluginConfigError("refine: needs `features` with steps on (the per-step states it reads)")
        if not cfg.refine.is_file():
            raise PluginConfigError(f"refine: model file not found: {cfg.refine}")
    if cfg.draft_probe is not None:
        if cfg.features is None or cfg.features.draft_layer is None:
            raise PluginConfigError(DRAFT_NEEDS_FEATURES)
        if not cfg.draft_probe.is_file():
            raise PluginConfigError(f"draft_probe: model file not found: {cfg.draft_probe}")
    if cfg.features is not None:
        _check_token_counts("features.record_steps", cfg.features.record_steps)
    if cfg.features is not None and cfg.features.record_steps and "record_steps" in cfg.features.model_fields_set:
        if cfg.records is None:  # set on purpose, it would record nothing: say so
            raise PluginConfigError("features.record_steps: needs `records` (the per-step states go "
                                    "into its step_features table)")  # fmt: skip
        if not cfg.features.steps:
            raise PluginConfigError("features.record_steps: needs features.steps on (it keeps per-step states)")
    _check_token_counts("refine_at", cfg.refine_at)
    return cfg


def _check_token_counts(field: str, counts: tuple[int, ...]) -> None:
    if any(not 1 <= g <= 2**20 for g in counts):
        raise PluginConfigError(f"{field}: token counts must be in 1..{2**20}, got {list(counts)}")


def load_plugin_config(environ: dict[str, str] | None = None) -> PluginConfig:
    """The config from $PRESCHED_PLUGIN_CONFIG (unset: FCFS with defaults), validated."""
    raw = (os.environ if environ is None else environ).get(CONFIG_ENV)
    return parse_plugin_config(read_config_text(raw) if raw else {})
