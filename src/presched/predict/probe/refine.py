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

With `answer` on, each row also carries A, the answer-so-far pool: the mean of the states at
generated tokens 1..g (the engine records it in `answer_features` and sums it while serving;
metadata key of the `answer` FeatureSpec), and the features are [S, A, P, log(1 + g)].

Head (`RidgeHead`, as `probe`): features [S, P, log(1 + g)] standardised -> ridge on
log(L - g), split-conformal quantiles of the remaining length on the calibration rows, with one
spread for every row (`spread` 'constant', the default here; 'adaptive' fits a ridge on the
absolute in-sample residual, as `probe` does: on the engine's records of SmolLM2 that made
E[L - g | L > g], what SRPT / MLFQ read, rank the remaining length at tau-b ~0 while mu ranked
it at 0.28, docs/predictors/probe.md). The estimate is of the total length, g + remaining
(the remaining quantiles floored at 1 token, so quantiles >= g + 1; `lower` g + 1, so the CDF
starts there and no mass sits at L <= g), so that a driver can put it in place of
`seq.estimate`; `rank_score` is log(g + exp(mu)), the log total as the other predictors' (mu is
the log remaining: at one g both rank alike). `predict(requests)` reads S and P
from `Request.metadata` (keys of the `step` and `mean` FeatureSpecs) and g from
`metadata["generated"]`.

`fit(requests, validation)` also takes the requests of the engine's records
(`presched train -p probe-refine --from-log records.sqlite --param model=M --param layer=N`:
`load_log_requests` attaches {g: state at the g-th generated token} under the step key, from
the `step_features` table, plugin config `features.record_steps`): each expands into one row
per g < output_tokens (the true length L), with its pooled prompt state; one without step or
prompt states is skipped. The expansion is inside `fit`, after `train_from_log`'s validation
split, so the rows of one request stay on one side. Step states of another model, layer or sink
than the params' are refused (ValueError naming the field).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from presched.predict.base import PREDICTORS, Predictor, checked_params
from presched.predict.estimate import LengthEstimate
from presched.predict.probe.predictor import (
    _MED,
    RidgeHead,
    check_alpha,
    check_pairs,
    check_sigma_floor,
    check_spread,
    stack_rows,
)
from presched.predict.probe.spec import FeatureSpec
from presched.workload.request import Request

GENERATED = "generated"
"""`Request.metadata` key: output tokens generated so far (g)."""

DEFAULTS: dict[str, Any] = {"model": "smollm2-135m", "layer": 15, "sink": 1, "alpha": None,
                            "sigma_floor": 0.05, "spread": "constant", "answer": False}  # fmt: skip


def design(S: np.ndarray, P: np.ndarray, g: np.ndarray, A: np.ndarray | None = None) -> np.ndarray:
    """[S, P, log(1 + g)]: (n, 2d + 1); with the answer-so-far pools A, [S, A, P, log(1 + g)]:
    (n, 3d + 1)."""
    S, P = np.asarray(S, dtype=float), np.asarray(P, dtype=float)
    g = np.asarray(g, dtype=float).reshape(-1)
    if S.ndim != 2 or S.shape != P.shape or len(g) != len(S):
        raise ValueError(f"features: need step and prompt states of one shape (n, d) and n token counts, "
                         f"got {S.shape}, {P.shape} and {g.shape}")  # fmt: skip
    if A is not None and np.shape(A) != S.shape:
        raise ValueError(f"features: answer pools of shape {np.shape(A)}, step states {S.shape}")
    if (g < 1).any():
        raise ValueError("generated: probe-refine reads a state after >= 1 generated token")
    parts = [S] if A is None else [S, np.asarray(A, dtype=float)]
    return np.hstack([*parts, P, np.log1p(g)[:, None]])


@PREDICTORS.register("probe-refine")
class ProbeRefine(Predictor):
    """TRAIL while decoding: remaining length from the state at the g-th generated token."""

    name = "probe-refine"
    needs_serving_model = True

    def __init__(self, **params: Any) -> None:
        super().__init__(**checked_params(self.name, DEFAULTS, params))
        check_alpha(self.name, self.params["alpha"])
        check_spread(self.name, self.params["spread"])
        check_sigma_floor(self.name, self.params["sigma_floor"])
        if not isinstance(self.params["answer"], bool):
            raise ValueError(f"{self.name}: answer must be true or false, got {self.params['answer']!r}")
        self.hidden: int | None = None

    def front_refusal(self) -> str | None:
        return ("probe-refine refines a running request's estimate from the state at its generated "
                "tokens, which only the engine sees: serve it in the engine (python -m "
                "presched.engine.launch --features --refine FILE)")

    @property
    def answer(self) -> bool:
        """Whether the design reads the answer-so-far pool A_g too."""
        return bool(self.params["answer"])

    def specs(self, hidden: int) -> tuple[FeatureSpec, FeatureSpec]:
        """(step-state spec, prompt-state spec) this predictor reads."""
        p = self.params
        step = FeatureSpec(model=p["model"], layer=p["layer"], hidden=hidden, pooling="step", sink=p["sink"])
        return step, step.model_copy(update={"pooling": "mean"})

    def answer_key(self) -> str:
        """The metadata key of the answer-so-far pools (a single row: a vector; the engine's
        records: {g: vector})."""
        return self.specs(hidden=1)[0].model_copy(update={"pooling": "answer"}).key()

    def fit(self, requests: Sequence[Request], validation: Sequence[Request] | None = None) -> "ProbeRefine":
        """From requests with their true `output_tokens`: each carrying both states and
        `generated` in metadata (one row per request and step), or a request of the engine's
        records carrying {g: step state} (one row per g < output_tokens; see module doc);
        `validation` is required (calibration)."""
        if validation is None:
            raise ValueError("validation: probe-refine calibrates on a separate set of requests")
        S, P, g, L, A = self._rows(requests, "requests")
        Sc, Pc, gc, Lc, Ac = self._rows(validation, "validation")
        return self.fit_steps(S, P, g, L, Sc, Pc, gc, Lc, A=A, A_cal=Ac)

    def _rows(self, requests: Sequence[Request], where: str) -> tuple:
        """(S, P, g, L, A) of `requests` (A None unless `answer`): a request with `generated` is
        one row (`_read`'s rules); one with {g: state} under the step key one row per g < L
        (with `answer`, per g that has its answer pool too); others are skipped."""
        step, prompt = self.specs(hidden=1)  # keys leave out the width
        single = [r for r in requests if GENERATED in r.metadata]
        S, P, g, L, A = [], [], [], [], []
        if single:
            S1, P1, g1, A1 = self._read(single)
            S, P, g = list(S1), list(P1), list(g1)
            A = [] if A1 is None else list(A1)
            L = [float(_label(r)) for r in single]
        for r in requests:
            if GENERATED in r.metadata:
                continue
            states = r.metadata.get(step.key())
            if not isinstance(states, Mapping):
                self._check_other_specs(r)
                continue
            p = r.metadata.get(prompt.key())
            if p is None:
                continue
            answers = r.metadata.get(self.answer_key()) if self.answer else None
            if self.answer and not isinstance(answers, Mapping):
                continue
            n = _label(r)
            for at in sorted(states):
                if at < n and (answers is None or at in answers):  # still running after token `at`
                    S.append(np.asarray(states[at], dtype=float).reshape(-1))
                    P.append(np.asarray(p, dtype=float).reshape(-1))
                    g.append(float(at))
                    L.append(float(n))
                    if answers is not None:
                        A.append(np.asarray(answers[at], dtype=float).reshape(-1))
        if not S:
            also = f", an answer pool ({self.answer_key()!r}, records with answer_features)" if self.answer else ""
            raise ValueError(f"{where}: no request has a step state (at a generated token g < its "
                             f"output_tokens){also} and a pooled prompt state of {prompt.model!r} layer "
                             f"{prompt.layer} sink {prompt.sink}; train from records written with "
                             "plugin config features.record_steps, or from rows with metadata "
                             f"{step.key()!r}, {prompt.key()!r} and {GENERATED!r}")  # fmt: skip
        widths = sorted({len(v) for v in S} | {len(v) for v in P} | {len(v) for v in A})
        if len(widths) > 1:
            raise ValueError(f"features: {where} mix states of widths {widths} (records of other models?)")
        return np.stack(S), np.stack(P), np.array(g), np.array(L), (np.stack(A) if self.answer else None)

    def _check_other_specs(self, r: Request) -> None:
        """ValueError naming the field when `r` carries recorded step states of another model,
        layer or sink than this predictor's params."""
        p = self.params
        for key, value in r.metadata.items():
            m = _STEP_KEY.match(key) if isinstance(value, Mapping) else None
            if m is None:
                continue
            have = {"model": m["model"], "layer": int(m["layer"]), "sink": int(m["sink"])}
            diff = [f"{k}: request {r.id!r} has step states of {have[k]!r}, the params say {p[k]!r} "
                    f"(--param {k}=...)" for k in have if have[k] != p[k]]  # fmt: skip
            if diff:
                raise ValueError(f"{'; '.join(diff)}: probe-refine must be fitted on the hidden "
                                 "states it will read")  # fmt: skip

    def fit_steps(self, S, P, g, L, S_cal, P_cal, g_cal, L_cal, A=None, A_cal=None) -> "ProbeRefine":
        """Fit on rows of (step state, prompt state, g, true total length L > g), and with
        `answer` the rows' answer-so-far pools A, A_cal."""
        self._check_answer(A, "A")
        self._check_answer(A_cal, "A_cal")
        X, X_cal = design(S, P, g, A), design(S_cal, P_cal, g_cal, A_cal)
        g, g_cal = np.asarray(g, dtype=float).reshape(-1), np.asarray(g_cal, dtype=float).reshape(-1)
        L, L_cal = np.asarray(L, dtype=float).reshape(-1), np.asarray(L_cal, dtype=float).reshape(-1)
        if L.shape != g.shape or L_cal.shape != g_cal.shape:
            raise ValueError("lengths: need one true length per row")
        if (L <= g).any() or (L_cal <= g_cal).any():
            raise ValueError("lengths: every row must still be running (L > g): its remaining length is L - g")
        X, rem, X_cal, rem_cal = check_pairs(X, L - g, X_cal, L_cal - g_cal)
        self.hidden = (X.shape[1] - 1) // self._blocks
        self.head = RidgeHead(self.params["alpha"], self.params["sigma_floor"], self.params["spread"]).fit(X, rem, X_cal, rem_cal)
        self.fitted = True
        return self

    @property
    def _blocks(self) -> int:
        return 3 if self.answer else 2

    def _check_answer(self, A, name: str) -> None:
        if self.answer and A is None:
            raise ValueError(f"{name}: this probe-refine reads the answer-so-far pools (answer true); pass them")
        if not self.answer and A is not None:
            raise ValueError(f"{name}: this probe-refine does not read answer pools (answer false)")

    def predict_steps(self, S, P, g, A=None) -> LengthEstimate:
        """Total-length distributions given L > g (see module doc); `A`: the answer-so-far
        pools, with `answer` only."""
        self.check_fitted()
        self._check_answer(A, "A")
        X = design(S, P, g, A)
        g = np.asarray(g, dtype=float).reshape(-1, 1)
        if X.shape[1] != self._blocks * self.hidden + 1:
            raise ValueError(f"features: states of width {(X.shape[1] - 1) // self._blocks}, fitted on {self.hidden}")
        if not np.isfinite(X).all():
            raise ValueError("features: must be finite (NaN rows: states that were never read)")
        q, mu = self.head.quantiles(X)
        total = g + np.maximum(q, 1.0)  # L > g: at least one more token (the conformal q may be < 1)
        # L > g, so L >= g + 1: the CDF starts there, no mass at L <= g (survival(g) = 1)
        # rank_score on the other predictors' scale, log total length: log(g + exp(mu)) (mu is the
        # log remaining; at one g it ranks as mu does). Log remaining made a refined request look
        # shorter than an unrefined one of the same total to a policy reading stat=rank.
        return LengthEstimate(total, total[:, _MED], np.logaddexp(np.log(g[:, 0]), mu), lower=g[:, 0] + 1)

    def predict(self, requests: Sequence[Request]) -> LengthEstimate:
        self.check_fitted()
        if len(requests) == 0:
            raise ValueError("requests: empty")
        return self.predict_steps(*self._read(requests))

    def _read(self, requests: Sequence[Request]) -> tuple:
        step, prompt = self.specs(hidden=1)  # keys leave out the width
        keys = [step.key(), prompt.key(), GENERATED] + ([self.answer_key()] if self.answer else [])
        for r in requests:
            missing = [k for k in keys if r.metadata.get(k) is None]
            if missing:
                raise ValueError(f"request {r.id!r}: metadata has no {missing} (probe-refine reads the "
                                 "state at a generated token, the pooled prompt state and the tokens generated"
                                 f"{', and the answer-so-far pool' if self.answer else ''})")  # fmt: skip

        def stacked(key: str) -> np.ndarray:  # one vector per request, named when it is not
            return stack_rows(requests, [r.metadata[key] for r in requests], key)

        A = stacked(self.answer_key()) if self.answer else None
        return stacked(step.key()), stacked(prompt.key()), np.array([float(r.metadata[GENERATED]) for r in requests]), A

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


_STEP_KEY = re.compile(r"^hidden:(?!draft:)(?P<model>.+):L(?P<layer>\d+):step:s(?P<sink>\d+)$")
"""A served model's step-state `FeatureSpec.key()`."""


def _label(r: Request) -> int:
    if r.output_tokens is None:
        raise ValueError(f"request {r.id!r}: no output_tokens (the true length) to fit on")
    return int(r.output_tokens)
