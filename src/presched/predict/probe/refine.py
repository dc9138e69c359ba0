"""`probe-refine`: a running request's remaining length from the serving model's own state at
its g-th generated token (TRAIL's refinement while decoding).

    pred = PREDICTORS.create("probe-refine", model="smollm2-135m", layer=15)
    pred.fit_steps(S, P, g, L, S_cal, P_cal, g_cal, L_cal)
    est = pred.predict_steps(S, P, g)          # LengthEstimate of the TOTAL length, given L > g
    est.mean_remaining(g)                      # E[L - g | L > g], what SRPT / MLFQ read

Inputs per row: S, the residual stream at `layer` at the position of the answer's g-th token
(`features.PromptFeaturizer.encode_steps`; in the engine, the worker hook's per-step state, read
in the step that reads that token); P, the prompt's mean-pooled state (`probe`'s input: the prior
TRAIL combines with the step's evidence); g, tokens generated so far. Only requests still running
(L > g) are fitted and predicted.

Head (`RidgeHead`, as `probe`): features [S, P, log(1 + g)] standardised -> ridge on
log(L - g), a ridge on the absolute residual for the spread, split-conformal quantiles of the
remaining length on the calibration rows. The estimate is of the total length, g + remaining
(quantiles >= g + 1), so that a driver can put it in place of `seq.estimate`; `rank_score` is
the log remaining length. `predict(requests)` reads S and P from `Request.metadata` (keys of the
`step` and `mean` FeatureSpecs) and g from `metadata["generated"]`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from presched.predict.base import PREDICTORS, Predictor, checked_params
from presched.predict.estimate import LengthEstimate
from presched.predict.probe.predictor import _MED, RidgeHead, check_alpha, check_pairs
from presched.predict.probe.spec import FeatureSpec
from presched.workload.request import Request

GENERATED = "generated"
"""`Request.metadata` key: output tokens generated so far (g)."""

DEFAULTS: dict[str, Any] = {"model": "smollm2-135m", "layer": 15, "sink": 1, "alpha": None,
                            "sigma_floor": 0.05}  # fmt: skip


def design(S: np.ndarray, P: np.ndarray, g: np.ndarray) -> np.ndarray:
    """[S, P, log(1 + g)]: (n, 2d + 1)."""
    S, P = np.asarray(S, dtype=float), np.asarray(P, dtype=float)
    g = np.asarray(g, dtype=float).reshape(-1)
    if S.ndim != 2 or S.shape != P.shape or len(g) != len(S):
        raise ValueError(f"features: need step and prompt states of one shape (n, d) and n token counts, "
                         f"got {S.shape}, {P.shape} and {g.shape}")  # fmt: skip
    if (g < 1).any():
        raise ValueError("generated: probe-refine reads a state after >= 1 generated token")
    return np.hstack([S, P, np.log1p(g)[:, None]])


@PREDICTORS.register("probe-refine")
class ProbeRefine(Predictor):
    """TRAIL while decoding: remaining length from the state at the g-th generated token."""

    name = "probe-refine"
    needs_serving_model = True

    def __init__(self, **params: Any) -> None:
        super().__init__(**checked_params(self.name, DEFAULTS, params))
        check_alpha(self.name, self.params["alpha"])
        self.hidden: int | None = None

    def specs(self, hidden: int) -> tuple[FeatureSpec, FeatureSpec]:
        """(step-state spec, prompt-state spec) this predictor reads."""
        p = self.params
        step = FeatureSpec(model=p["model"], layer=p["layer"], hidden=hidden, pooling="step", sink=p["sink"])
        return step, step.model_copy(update={"pooling": "mean"})

    def fit(self, requests: Sequence[Request], validation: Sequence[Request] | None = None) -> "ProbeRefine":
        """From requests carrying both states and `generated` in metadata (one row per request
        and step) and their true `output_tokens`; `validation` is required (calibration)."""
        if validation is None:
            raise ValueError("validation: probe-refine calibrates on a separate set of requests")
        S, P, g = self._read(requests)
        S_cal, P_cal, g_cal = self._read(validation)
        L = np.array([_label(r) for r in requests], dtype=float)
        L_cal = np.array([_label(r) for r in validation], dtype=float)
        return self.fit_steps(S, P, g, L, S_cal, P_cal, g_cal, L_cal)

    def fit_steps(self, S, P, g, L, S_cal, P_cal, g_cal, L_cal) -> "ProbeRefine":
        """Fit on rows of (step state, prompt state, g, true total length L > g)."""
        X, X_cal = design(S, P, g), design(S_cal, P_cal, g_cal)
        g, g_cal = np.asarray(g, dtype=float).reshape(-1), np.asarray(g_cal, dtype=float).reshape(-1)
        L, L_cal = np.asarray(L, dtype=float).reshape(-1), np.asarray(L_cal, dtype=float).reshape(-1)
        if L.shape != g.shape or L_cal.shape != g_cal.shape:
            raise ValueError("lengths: need one true length per row")
        if (L <= g).any() or (L_cal <= g_cal).any():
            raise ValueError("lengths: every row must still be running (L > g): its remaining length is L - g")
        X, rem, X_cal, rem_cal = check_pairs(X, L - g, X_cal, L_cal - g_cal)
        self.hidden = (X.shape[1] - 1) // 2
        self.head = RidgeHead(self.params["alpha"], self.params["sigma_floor"]).fit(X, rem, X_cal, rem_cal)
        self.fitted = True
        return self

    def predict_steps(self, S, P, g) -> LengthEstimate:
        """Total-length distributions given L > g (see module doc)."""
        self.check_fitted()
        X = design(S, P, g)
        g = np.asarray(g, dtype=float).reshape(-1, 1)
        if X.shape[1] != 2 * self.hidden + 1:
            raise ValueError(f"features: states of width {(X.shape[1] - 1) // 2}, fitted on {self.hidden}")
        if not np.isfinite(X).all():
            raise ValueError("features: must be finite (NaN rows: states that were never read)")
        q, mu = self.head.quantiles(X)
        total = g + q
        return LengthEstimate(total, total[:, _MED], mu)

    def predict(self, requests: Sequence[Request]) -> LengthEstimate:
        self.check_fitted()
        if len(requests) == 0:
            raise ValueError("requests: empty")
        return self.predict_steps(*self._read(requests))

    def _read(self, requests: Sequence[Request]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        step, prompt = self.specs(hidden=1)  # keys leave out the width
        rows_s, rows_p, gs = [], [], []
        for r in requests:
            missing = [k for k in (step.key(), prompt.key(), GENERATED) if r.metadata.get(k) is None]
            if missing:
                raise ValueError(f"request {r.id!r}: metadata has no {missing} (probe-refine reads the "
                                 "state at a generated token, the pooled prompt state and the tokens generated)")  # fmt: skip
            rows_s.append(np.asarray(r.metadata[step.key()], dtype=float).reshape(-1))
            rows_p.append(np.asarray(r.metadata[prompt.key()], dtype=float).reshape(-1))
            gs.append(float(r.metadata[GENERATED]))
        return np.stack(rows_s), np.stack(rows_p), np.array(gs)

    # --- persistence ------------------------------------------------------------------------
    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays, values = self.head.state()
        values["hidden"] = self.hidden
        return arrays, values

    @classmethod
    def from_state(cls, params: dict[str, Any], arrays: dict[str, np.ndarray], values: dict[str, Any]) -> "ProbeRefine":
        pred = cls(**params)
        pred.head = RidgeHead.from_state(pred.params["alpha"], pred.params["sigma_floor"], arrays, values)
        pred.hidden = int(values["hidden"])
        pred.fitted = True
        return pred


def _label(r: Request) -> int:
    if r.output_tokens is None:
        raise ValueError(f"request {r.id!r}: no output_tokens (the true length) to fit on")
    return int(r.output_tokens)
