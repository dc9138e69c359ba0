"""`FeatureConsumer`: what the in-engine scheduler does with each step's `StepFeatures`.

Made by `PreschedScheduler` when the plugin config has `features`. For each step's features
(read off vLLM's `ModelRunnerOutput` before the scheduler frees the requests finishing in it):

1. `deliver` keeps them on the seqs (`features_prompt`, `features_step`, `features_draft`);
2. the draft probe (`draft_probe`), the probe (`probe`) and probe-refine (`refine`) replace
   estimates, in that order, each only where a stronger source has not (a request's own
   vllm_xargs > refine > probe > draft-probe > the in-engine text predictor);
3. their counts go into the scheduler's stats counters (`pred_probe`, `probe_errors`, ...);
   an error count that moved asks for the stats file to be rewritten.

With `records` and steps on, each per-step state at a `features.record_steps` token g is kept
on its seq (`features_record`, the first that arrives per g), and so is the answer-so-far pool
A_g (`features_record_answer`: the mean of the states at generated tokens 1..g, summed as they
arrive in `features_answer`; also summed when the refine model reads it). At a request's end
`write` puts its pooled states in the records (`prompt_features`, `egtp_features` for the EGTP
pool, `draft_features` for the draft model's), its kept step states in `step_features` and its
answer pools in `answer_features` (one row per g), with the `FeatureSpec` of what the hooks
pool (pooling 'step' for the step states, 'answer' for the answer pools).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

from presched.engine.plugin.answer import add_answer, answer_mean
from presched.engine.plugin.config import PluginConfig
from presched.engine.plugin.features import StepFeatures, deliver
from presched.engine.plugin.probe import EngineProbe
from presched.engine.plugin.refine import EngineRefine

COUNTERS = {"features_worker_s": 0.0, "features_worker_steps": 0, "pred_probe": 0, "probe_errors": 0,
            "pred_refine": 0, "refine_errors": 0, "pred_draft_probe": 0, "draft_probe_errors": 0}  # fmt: skip


def _layers_hidden(hf) -> tuple[int, int]:
    return int(hf.num_hidden_layers), int(hf.hidden_size)


class FeatureConsumer:
    def __init__(self, cfg: PluginConfig, vllm_config, counts: dict, on_error: Callable[[], None]) -> None:
        """`vllm_config`: the engine's VllmConfig (model and draft model); `counts`: the
        scheduler's stats counters (COUNTERS are added); `on_error`: called when an error
        count moved."""
        self.counts, self.on_error = counts, on_error
        counts.update(COUNTERS)
        mc = vllm_config.model_config
        self.model = Path(mc.model).name
        self.probe = self.refine = self.draft_probe = None
        if cfg.probe is not None:
            self.probe = EngineProbe(cfg.probe, cfg.features, self.model, *_layers_hidden(mc.hf_config))
        if cfg.refine is not None:
            self.refine = EngineRefine(cfg.refine, cfg.features, cfg.refine_at, self.model,
                                       *_layers_hidden(mc.hf_config))  # fmt: skip
        if cfg.draft_probe is not None:
            spec = vllm_config.speculative_config
            dmc = getattr(spec, "draft_model_config", None)
            if dmc is None:  # check_engine_config has refused this already; kept for direct use
                raise ValueError("draft_probe: this engine has no draft model")
            self.draft_probe = EngineProbe(cfg.draft_probe, cfg.features, Path(dmc.model).name,
                                           *_layers_hidden(dmc.hf_config), role="draft")  # fmt: skip
        self.spec_json: str | None = None  # FeatureSpec JSON of the pooled states, from the first features
        self.egtp_spec_json: str | None = None
        self.draft_spec_json: str | None = None
        self.step_spec_json: str | None = None
        self.answer_spec_json: str | None = None
        keep = cfg.records is not None and cfg.features is not None and cfg.features.steps
        self.record_steps = frozenset(cfg.features.record_steps) if keep else frozenset()
        self.answer = bool(self.record_steps) or (self.refine is not None and self.refine.answer)

    def step(self, sf: StepFeatures, seqs: dict) -> None:
        deliver(sf, seqs)
        if self.answer:
            add_answer(sf.step_ids, seqs)
        if self.record_steps:
            keep_steps(sf.step_ids, seqs, self.record_steps)
        for runner, name, ids, arg in (
            (self.draft_probe, "draft_probe", sf.draft_ids, sf.draft),
            (self.probe, "probe", sf.prompt_ids,
             sf.prompt_egtp if self.probe is not None and self.probe.pooling == "egtp" else sf.prompt),
            (self.refine, "refine", sf.step_ids, None),
        ):  # fmt: skip
            if runner is None or not ids:
                continue
            if arg is None:
                runner.apply(ids, seqs)
            else:
                runner.apply(ids, arg, seqs)
            self.counts[f"pred_{name}"] = runner.predictions
            if runner.errors != self.counts[f"{name}_errors"]:
                self.counts[f"{name}_errors"] = runner.errors
                self.on_error()
        self.counts["features_worker_s"] = round(sf.worker_s, 6)
        self.counts["features_worker_steps"] = sf.worker_steps
        if self.spec_json is None:
            self.spec_json = _spec_json(self.model, sf.layer, sf.hidden, sf.sink, "served")
            self.egtp_spec_json = _spec_json(self.model, sf.layer, sf.hidden, sf.sink, "served", "egtp")
            self.step_spec_json = _spec_json(self.model, sf.layer, sf.hidden, sf.sink, "served", "step")
            self.answer_spec_json = _spec_json(self.model, sf.layer, sf.hidden, sf.sink, "served", "answer")
        if self.draft_spec_json is None and sf.draft_model is not None:
            self.draft_spec_json = _spec_json(sf.draft_model, sf.draft_layer, sf.draft_hidden, sf.sink, "draft")

    def write(self, records, seq) -> None:
        """The seq's pooled prompt states into the records (a freed request)."""
        if seq.features_prompt is not None and self.spec_json is not None:
            records.write_features(seq, self.spec_json)
        if seq.features_egtp is not None and self.egtp_spec_json is not None:
            records.write_features(seq, self.egtp_spec_json, egtp=True)
        if seq.features_draft is not None and self.draft_spec_json is not None:
            records.write_draft_features(seq, self.draft_spec_json)
        if seq.features_record and self.step_spec_json is not None:
            records.write_step_features(seq, self.step_spec_json, self.answer_spec_json)


def keep_steps(step_ids, seqs: dict, at: frozenset) -> None:
    """After `deliver` (and `add_answer`): keep each delivered per-step state whose token g is
    in `at` on its seq (`features_record[g]`) and its answer-so-far pool
    (`features_record_answer[g]`), the first that arrives for each g (at most len(at) per seq)."""
    for rid in step_ids:
        seq = seqs.get(rid)
        if seq is not None and seq.features_step_g in at:
            if seq.features_record is None:
                seq.features_record, seq.features_record_answer = {}, {}
            g = seq.features_step_g
            if g not in seq.features_record:  # a copy: not a view of the step's array
                seq.features_record[g] = seq.features_step.copy()
                a = answer_mean(seq)
                if a is not None:
                    seq.features_record_answer[g] = a


def _spec_json(model: str, layer: int, hidden: int, sink: int, role: str, pooling: str = "mean") -> str:
    from presched.predict.probe.spec import FeatureSpec

    return FeatureSpec(model=model, layer=layer, hidden=hidden, pooling=pooling, sink=sink,
                       role=role).model_dump_json()  # fmt: skip
