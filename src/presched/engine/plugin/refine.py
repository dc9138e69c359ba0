"""`EngineRefine`: `probe-refine` (predict/probe/refine.py) run in the engine core on the per-step
states the worker hook ships (plugin config `refine`, needs `features` with `steps` on).

When a request's per-step state is the state at its g-th generated token for a g in `refine_at`
(the state of the position that reads token g, shipped in the step that samples token g + 1),
its estimate is replaced by probe-refine's distribution of the total length given L > g, from
that state and the request's pooled prompt state (and, for a model fitted with `answer`, its
answer-so-far pool A_g, summed by the consumer); SRPT / MLFQ / victims then read
`mean_remaining(g)` from it at their next decision. A request's own vllm_xargs prediction wins
and is never replaced (as with `probe`). Refused at start (`PluginConfigError` naming `refine`)
when the file is not a probe-refine model or its model, layer, sink or width differ from what
this engine's hook reads. A refine that raises is counted (`refine_errors`), logged, and the
seqs keep their estimates.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import numpy as np

from presched.engine.plugin.config import FeatureConfig, PluginConfigError
from presched.engine.plugin.probe import replace_estimates
from presched.engine.plugin.answer import answer_mean

log = logging.getLogger("presched.engine.plugin")
SOURCE = "refine"


class EngineRefine:
    def __init__(self, path: Path, features: FeatureConfig | None, at: Sequence[int], model: str,
                 n_layers: int, hidden: int) -> None:  # fmt: skip
        """`model`: the served model's folder name; `n_layers`, `hidden`: its decoder layers and
        hidden size; `at`: the generated-token counts at which estimates are refined."""
        from presched.predict.base import ModelFileError, load_predictor
        from presched.predict.probe.refine import ProbeRefine

        if features is None or not features.steps:
            raise PluginConfigError("refine: needs `features` with steps on (the per-step states it reads)")
        try:
            pred = load_predictor(path)
        except ModelFileError as e:
            raise PluginConfigError(f"refine: {e}") from None
        if not isinstance(pred, ProbeRefine):
            raise PluginConfigError(f"refine: {path} holds a {pred.name!r} predictor; expected a "
                                    "probe-refine model")  # fmt: skip
        layer = features.layer if features.layer is not None else n_layers // 2
        want = {"model": model, "layer": layer, "sink": features.sink_tokens, "hidden": hidden}
        have = {**{k: pred.params[k] for k in ("model", "layer", "sink")}, "hidden": pred.hidden}
        diff = [f"{k}: fitted on {have[k]!r}, this engine's hook reads {want[k]!r}" for k in want if have[k] != want[k]]
        if diff:
            raise PluginConfigError(f"refine ({path}): it reads other hidden states ({'; '.join(diff)})")
        self.predictor, self.at = pred, frozenset(int(g) for g in at)
        self.answer = pred.answer  # the consumer then sums each request's answer-so-far pool
        self.predictions = self.errors = 0
        log.info("presched: probe-refine loaded from %s (layer %d, refining at %s tokens)", path, layer, sorted(self.at))

    def apply(self, step_ids: Iterable[str], seqs: Mapping[str, object]) -> int:
        """Refine each seq (by request id) whose new per-step state is at a `refine_at` token and
        whose prompt state is known, unless it carries its own vllm_xargs prediction; the number
        refined. A raising refine leaves every estimate as it was (counted in `errors`)."""
        targets = []
        for rid in step_ids:
            seq = seqs.get(rid)
            if (seq is not None and seq.features_step_g in self.at and seq.features_prompt is not None
                    and seq.pred_source != "xargs" and (not self.answer or seq.features_answer is not None)):  # fmt: skip
                if not (np.isfinite(seq.features_step).all() and np.isfinite(seq.features_prompt).all()):
                    self.errors += 1  # this one keeps its estimate; the step's others are refined
                    continue
                targets.append(seq)

        def predict():
            S = np.stack([s.features_step for s in targets])
            P = np.stack([s.features_prompt for s in targets])
            g = np.array([s.features_step_g for s in targets], dtype=float)
            A = np.stack([answer_mean(s) for s in targets]) if self.answer else None
            return self.predictor.predict_steps(S, P, g, A)

        return replace_estimates(self, "probe-refine", SOURCE, targets, predict)
