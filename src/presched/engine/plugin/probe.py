"""`EngineProbe`: a hidden-state probe (`presched train -p probe`, or `-p egtp` with
`features.egtp`) run in the engine core on the pooled prompt states the worker hook ships
(plugin config `probe`, needs `features`).

Loaded once by the scheduler; refused at start (`PluginConfigError` naming `probe`) when the file
is not a probe / egtp file (or an egtp file without `features.egtp`) or its `FeatureSpec` (model
folder name, layer, hidden size, sink) differs from what this engine's hook pools. `apply` runs the probe once per engine step on the
prompts pooled in that step (batched) and replaces each seq's estimate with its prediction.

Precedence (module doc of estimates.py for the other two): a request's own `vllm_xargs`
prediction wins and is never replaced, nor is a `refine` estimate (refine.py: later evidence);
otherwise the probe's prediction replaces the in-engine text predictor's (or no estimate) as soon
as the prompt is pooled, i.e. after prefill. The same class runs a `draft-probe` (plugin config
`draft_probe`, role 'draft') on the draft model's pooled prompt states; it replaces only text
predictor estimates (or none), never the served model's own probe. The
waiting-queue order before that still comes from xargs or the text predictor.

Policies have no hook for an updated estimate: they read `seq.estimate` at each decision
(`priority` when a request is pushed into the waiting queue again after a preemption, `victim`,
`preempt_for`, `admit`), as `schedule/interface.py` allows ("drivers may replace it at any
step"); `kv-admission` alone fixes a running request's footprint at admission (`on_schedule`),
so the probe's estimate reaches it at the next admission. A probe that raises is counted (`probe_errors`), logged, and the seqs keep their
previous estimates.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from presched.engine.plugin.config import (DRAFT_NEEDS_FEATURES, PROBE_NEEDS_FEATURES, FeatureConfig,
                                           PluginConfigError)

log = logging.getLogger("presched.engine.plugin")
SOURCE = "probe"
DRAFT_SOURCE = "draft-probe"
_LOGGED = 5


class EngineProbe:
    def __init__(self, path: Path, features: FeatureConfig | None, model: str, n_layers: int,
                 hidden: int, role: str = "served") -> None:  # fmt: skip
        """`model`: the served model's folder name; `n_layers`, `hidden`: its decoder layers and
        hidden size (the hook pools layer `features.layer`, default n_layers // 2). `role`
        'draft': a `draft-probe` (plugin config `draft_probe`) on the draft model's states;
        `model`, `n_layers` and `hidden` are then the draft model's, the layer
        `features.draft_layer`."""
        from presched.predict.base import ModelFileError, load_predictor
        from presched.predict.probe.predictor import DraftProbe, HiddenStateProbe
        from presched.predict.probe.spec import FeatureSpec

        draft = role == "draft"
        self.what, self.source = ("draft_probe", DRAFT_SOURCE) if draft else ("probe", SOURCE)
        if features is None or (draft and features.draft_layer is None):
            raise PluginConfigError(DRAFT_NEEDS_FEATURES if draft else PROBE_NEEDS_FEATURES)
        try:
            pred = load_predictor(path)
        except ModelFileError as e:
            raise PluginConfigError(f"{self.what}: {e}") from None
        ok = isinstance(pred, DraftProbe) if draft else (isinstance(pred, HiddenStateProbe)
                                                         and not isinstance(pred, DraftProbe))  # fmt: skip
        if not ok:
            raise PluginConfigError(f"{self.what}: {path} holds a {pred.name!r} predictor; expected "
                                    + ("a draft-probe (`presched train -p draft-probe`)" if draft else
                                       "a probe or egtp (`presched train -p probe` / `-p egtp`)"))  # fmt: skip
        if pred.pooling == "egtp" and not features.egtp:
            raise PluginConfigError(f"{self.what}: {path} is an egtp probe; it needs features.egtp: true "
                                    "(the entropy-weighted pool)")  # fmt: skip
        self.pooling = pred.pooling  # which of the step's pooled vectors `apply` gets
        layer = features.draft_layer if draft else features.layer
        layer = layer if layer is not None else n_layers // 2
        self.spec = FeatureSpec(model=model, layer=layer, hidden=hidden, pooling=pred.pooling,
                                sink=features.sink_tokens, role=role)  # fmt: skip
        try:
            pred.spec.check(self.spec, f"{self.what} ({path})")
        except ValueError as e:
            raise PluginConfigError(str(e)) from None
        self.predictor = pred
        self.predictions = self.errors = 0
        # the estimates it never replaces: the request's own, later evidence (refine) and, for
        # the draft probe, the served model's own probe
        self.keep = ("xargs", "refine", SOURCE) if draft else ("xargs", "refine")
        log.info("presched: %s loaded from %s (%s)", self.what, path, self.spec.key())

    def apply(self, prompt_ids, vectors, seqs: Mapping[str, object]) -> int:
        """Replace the estimate of each seq (by request id) whose pooled prompt state is a row of
        `vectors`, unless it carries its own vllm_xargs prediction; the number replaced. A row
        that is not finite leaves its seq's estimate (counted in `errors`), the others go on; a
        raising probe leaves every estimate as it was (counted in `errors`)."""
        rows, targets = [], []
        vectors = np.asarray(vectors)
        finite = np.isfinite(vectors).all(axis=1) if len(vectors) else np.ones(0, dtype=bool)
        for i, rid in enumerate(prompt_ids):
            seq = seqs.get(rid)
            # the request's own prediction wins; a refined one (later evidence) too, when a
            # preempted request is re-pooled
            if seq is not None and seq.pred_source not in self.keep:
                if not finite[i]:  # keeps its estimate; the step's other requests get theirs
                    self.errors += 1
                    continue
                rows.append(i)
                targets.append(seq)
        return replace_estimates(self, self.what, self.source, targets,
                                 lambda: self.predictor.predict_features(vectors[rows]))


def replace_estimates(owner, what: str, source: str, targets: list, predict) -> int:
    """Give each seq of `targets` its row of `predict()` (a LengthEstimate) as `estimate`, with
    `pred_source` = source; the number replaced, counted in `owner.predictions`. A raising
    `predict` (a broken model must not kill the engine) replaces nothing: counted in
    `owner.errors`, the first few logged with their traceback."""
    if not targets:
        return 0
    try:
        est = predict()
    except Exception as e:  # noqa: BLE001
        owner.errors += 1
        if owner.errors <= _LOGGED:
            log.error("presched: %s raised (%d so far; estimates kept): %s: %s",
                      what, owner.errors, type(e).__name__, e, exc_info=e)  # fmt: skip
        return 0
    for j, seq in enumerate(targets):
        seq.estimate, seq.pred_source = est[j], source
    owner.predictions += len(targets)
    return len(targets)
