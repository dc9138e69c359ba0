"""The launcher's flags for presched's in-engine scheduler (`python -m presched.engine.launch
--scheduler presched ...`), and the plugin config mapping they make."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_plugin_flags(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--scheduler", choices=["vllm", "presched"], default="vllm", help="vllm: vLLM's own scheduler; presched: presched's policies inside vLLM (docs/engine-plugin.md)")
    ap.add_argument("--policy", default=None, help="with --scheduler presched: a registered policy (default fcfs; the project default, mlfq-preempt+sjf, is mlfq with --param within=mean --param preempt=true --param recompute_weight=8 --param base_quantum=128)")
    ap.add_argument("--param", action="append", default=[], metavar="K=V", help="a policy parameter (value read as YAML); repeatable")
    ap.add_argument("--predictor", type=Path, default=None, help="with --scheduler presched: a model file from `presched train`, for requests without a prediction in vllm_xargs")
    ap.add_argument("--records", type=Path, default=None, help="with --scheduler presched: SQLite file of per-request records (gateway log schema)")
    ap.add_argument("--plugin-stats", type=Path, default=None, help="with --scheduler presched: JSON file of the plugin's counters")
    ap.add_argument("--features", action="store_true", help="with --scheduler presched: the hidden-state hook in the worker (pooled prompt state and per-step state per request; docs/engine-plugin.md); turns prefix caching off")
    ap.add_argument("--feature-layer", type=int, default=None, help="with --features: the decoder layer read (default n_layers // 2)")
    ap.add_argument("--egtp", action="store_true", help="with --features: also pool the prompt state weighted by next-token entropy (EGTP; the worker computes logits at every prompt position), for an egtp --probe file")
    ap.add_argument("--record-steps", type=int, nargs="+", default=None, metavar="G", help="with --features and --records: the generated-token counts whose per-step states go into the records' step_features table, for `presched train -p probe-refine --from-log` (default 16 64 256)")
    ap.add_argument("--probe", type=Path, default=None, help="with --features: a probe file (`presched train -p probe`) run in the engine on each pooled prompt state; its prediction replaces the estimate of requests without their own in vllm_xargs")
    ap.add_argument("--refine", type=Path, default=None, help="with --features: a probe-refine file run in the engine on the per-step states; at each --refine-at token it replaces a running request's estimate (unless the request sent its own)")
    ap.add_argument("--refine-at", type=int, nargs="+", default=None, metavar="G", help="with --refine: the generated-token counts at which estimates are refined (default 16 64 256)")
    ap.add_argument("--draft-layer", type=int, default=None, help="with --features and --draft-model: also pool the draft model's prompt state at this decoder layer (OUTLETS)")
    ap.add_argument("--draft-probe", type=Path, default=None, help="with --draft-layer: a draft-probe file (`presched train -p draft-probe`) run in the engine on the draft model's pooled prompt states; its prediction replaces text-predictor estimates")
    ap.add_argument("--plugin-config", type=Path, default=None, help="with --scheduler presched: a JSON/YAML file with the whole plugin config; the flags above override it")


def plugin_from_args(a: argparse.Namespace) -> dict | None:
    """The plugin config mapping of the CLI flags (None for vLLM's own scheduler); ValueError
    naming the flag or field."""
    import yaml

    given = [f for f in ("policy", "predictor", "probe", "refine", "refine_at", "draft_probe", "records",
                         "plugin_stats", "plugin_config")
             if getattr(a, f) is not None] + (["param"] if a.param else [])  # fmt: skip
    given += ["features"] if a.features else []
    given += ["feature_layer"] if a.feature_layer is not None else []
    given += ["draft_layer"] if a.draft_layer is not None else []
    given += ["egtp"] if a.egtp else []
    given += ["record_steps"] if a.record_steps is not None else []
    if a.scheduler != "presched":
        if given:
            raise ValueError(f"--{given[0].replace('_', '-')} needs --scheduler presched")
        return None
    data: dict = {}
    if a.plugin_config is not None:
        from presched.engine.plugin.config import read_config_text

        data = read_config_text(str(a.plugin_config))
    if a.policy is not None:
        data["policy"] = a.policy
    params = dict(data.get("params") or {})
    for item in a.param:
        if "=" not in item:
            raise ValueError(f"--param {item!r}: expected KEY=VALUE, e.g. --param preempt=true")
        k, raw = item.split("=", 1)
        params[k.strip()] = yaml.safe_load(raw)
    if params:
        data["params"] = params
    if a.feature_layer is not None and not a.features:
        raise ValueError("--feature-layer needs --features")
    for flag in ("draft_layer", "egtp", "record_steps"):
        if getattr(a, flag) not in (None, False) and not a.features:
            raise ValueError(f"--{flag.replace('_', '-')} needs --features")
    if a.features:
        feats = dict(data.get("features") or {})
        if a.feature_layer is not None:
            feats["layer"] = a.feature_layer
        if a.draft_layer is not None:
            feats["draft_layer"] = a.draft_layer
        if a.egtp:
            feats["egtp"] = True
        if a.record_steps is not None:
            feats["record_steps"] = list(a.record_steps)
        data["features"] = feats
    for flag in ("probe", "refine", "draft_probe"):
        if getattr(a, flag) is not None and not a.features and "features" not in data:
            raise ValueError(f"--{flag.replace('_', '-')} needs --features")
    if a.refine_at is not None:
        if a.refine is None and "refine" not in data:
            raise ValueError("--refine-at needs --refine")
        data["refine_at"] = list(a.refine_at)
    for flag, field in (("predictor", "predictor"), ("probe", "probe"), ("refine", "refine"), ("draft_probe", "draft_probe"),
                        ("records", "records"), ("plugin_stats", "stats")):  # fmt: skip
        if getattr(a, flag) is not None:
            data[field] = str(getattr(a, flag))
    return data
