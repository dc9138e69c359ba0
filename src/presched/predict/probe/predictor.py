"""`probe` and `egtp`: output length from the serving model's own pooled prompt state.

    pred = PREDICTORS.create("probe", model="smollm2-135m", layer=15)
    pred.fit(train_requests, validation=calib_requests)   # features: Request.metadata[spec.key()]
    est = pred.predict(requests)                          # LengthEstimate, like every predictor
    pred.fit_features(X, y, X_cal, y_cal)                 # or straight from arrays
    est = pred.predict_features(X, spec)                  # refused when spec differs from the fit

`probe` reads the mean-pooled residual stream at `layer` (sink tokens left out: TRAIL's
step-0 embedding); `egtp` reads the entropy-weighted pool (EGTP); `draft-probe` reads the same
mean pool from a speculative-decoding draft model (OUTLETS; `model` is the draft model, the
spec's role 'draft', so a draft's vectors are never mistaken for the served model's). Both come from
`features.PromptFeaturizer` (transformers) or, in the engine, from the worker hook, which attach
the vector to `Request.metadata[FeatureSpec.key()]`. With `model_dir` set, missing vectors are
computed by a `PromptFeaturizer` on that folder (needs torch).

Head (numpy only): standardised features -> ridge regression on log length (mu), a second
ridge on the absolute in-sample residual (sigma, floored), then split-conformal normalised
quantiles on the calibration set (`validation`, else a prompt-disjoint `calib_frac`), as in
text-gbm. `point` = calibrated median, `rank_score` = mu. A saved probe stores its
`FeatureSpec`; features of another model, layer, pooling or sink are refused with the fields named.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from presched.predict.base import PREDICTORS, Predictor, checked_params, has_text
from presched.predict.conformal import ConformalQuantiles
from presched.predict.data import prompt_key
from presched.predict.estimate import LEVELS, LengthEstimate
from presched.predict.probe.spec import FeatureSpec
from presched.predict.text_gbm import fit_and_calibration
from presched.workload.request import Request

DEFAULTS: dict[str, Any] = {"model": "smollm2-135m", "layer": 15, "sink": 1, "alpha": None,
                            "sigma_floor": 0.05, "spread": "adaptive", "calib_frac": 0.2, "seed": 0,
                            "model_dir": None}  # fmt: skip
_MED = LEVELS.index(0.5)


ALPHAS = (1.0, 3.0, 10.0, 30.0, 100.0, 300.0, 1000.0, 3000.0, 10000.0)
"""The ridge penalties `alpha=None` chooses from (on standardised features)."""


def check_alpha(name: str, alpha: Any) -> None:
    """ValueError unless `alpha` is None (chosen on the fit data) or a positive number."""
    if alpha is not None and (isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not alpha > 0):
        raise ValueError(f"{name}: parameter 'alpha' must be a positive number or null (chosen "
                         f"from {ALPHAS} on held-out fit rows), got {alpha!r}")  # fmt: skip


def check_sigma_floor(name: str, sigma_floor: Any) -> None:
    """ValueError unless `sigma_floor` is a finite positive number: the conformal step divides
    by the spread, and a spread ridge may predict <= 0 for a row."""
    if (isinstance(sigma_floor, bool) or not isinstance(sigma_floor, (int, float))
            or not 0 < sigma_floor < float("inf")):  # fmt: skip
        raise ValueError(f"{name}: parameter 'sigma_floor' must be a positive number (the smallest "
                         f"spread in log space), got {sigma_floor!r}")  # fmt: skip


SPREADS = ("adaptive", "constant")
"""`RidgeHead` spreads: a ridge on the absolute residual, or one spread for every row."""


def check_spread(name: str, spread: Any) -> None:
    """ValueError unless `spread` is one of SPREADS."""
    if spread not in SPREADS:
        raise ValueError(f"{name}: parameter 'spread' must be one of {list(SPREADS)}, got {spread!r}")


def choose_alpha(Z: np.ndarray, ly: np.ndarray, seed: int = 0, groups: Sequence[Any] | None = None) -> float:
    """The penalty of ALPHAS with the least squared error of log length on a random fifth of the
    fit rows, fitted on the rest (the calibration set stays untouched for the conformal step).
    `groups` (one label per row, e.g. the prompt): a fifth of the groups is held out whole, so
    that copies of a held-out prompt (one row per model or per run) do not stay in the fitted
    part (rows held out one by one chose alpha 1 over 1000 on 5 copies per prompt: tau-b 0.11
    against 0.45)."""
    n = len(Z)
    if n < 10:
        return 10.0
    rng = np.random.default_rng(seed)
    if groups is not None and len(set(groups)) >= 5:
        labels = sorted(set(groups), key=str)
        out = {labels[i] for i in rng.permutation(len(labels))[: max(1, len(labels) // 5)]}
        keep = np.array([g not in out for g in groups])
    else:
        keep = np.ones(n, bool)
        keep[rng.permutation(n)[: max(2, n // 5)]] = False
    held = ~keep
    errs = []
    for a in ALPHAS:
        w, b = ridge(Z[keep], ly[keep], a)
        errs.append(float(np.mean((Z[held] @ w + b - ly[held]) ** 2)))
    return ALPHAS[int(np.argmin(errs))]


def ridge(X: np.ndarray, y: np.ndarray, alpha: float) -> tuple[np.ndarray, float]:
    """(w, b) minimising |y - Xw - b|^2 + alpha |w|^2 (intercept unpenalised)."""
    xm, ym = X.mean(0), y.mean()
    Xc = X - xm
    w = np.linalg.solve(Xc.T @ Xc + alpha * np.eye(X.shape[1]), Xc.T @ (y - ym))
    return w, float(ym - xm @ w)


MAX_LOG = math.log(1e8)
"""Largest log length a ridge head predicts (1e8 tokens: past any context window)."""
MAX_SIGMA = 5.0
"""Largest spread in log space (e^5 ~ 150x per standard deviation)."""


class RidgeHead:
    """Log-length regression with calibrated quantiles, numpy only: standardised features ->
    ridge on log(y) (mu), the spread sigma (`spread` 'adaptive': a second ridge on the absolute
    in-sample residual, floored at `sigma_floor`; 'constant': 1 for every row), split-conformal
    normalised quantiles on a calibration set. `alpha` None: chosen by `choose_alpha` on the fit
    rows (kept in `alpha` after `fit`).

    With 'constant' the quantiles are exp(mu) times one calibrated factor per level, so every
    statistic of the distribution (median, mean, E[L - g | L > g]) ranks rows as mu does. With
    'adaptive' a row's upper quantiles grow with its sigma: where the in-sample residual says
    little about the out-of-sample one (many features, few rows: probe-refine's step states),
    the mean is carried by the noisy upper tail and ranks worse than mu."""

    def __init__(self, alpha: float | None, sigma_floor: float, spread: str = "adaptive") -> None:
        check_spread("RidgeHead", spread)
        self.alpha, self.sigma_floor, self.spread = alpha, sigma_floor, spread

    def fit(self, X: np.ndarray, y: np.ndarray, X_cal: np.ndarray, y_cal: np.ndarray,
            groups: Sequence[Any] | None = None) -> "RidgeHead":  # fmt: skip
        self.x_mean, self.x_std = X.mean(0), X.std(0) + 1e-6
        Z = (X - self.x_mean) / self.x_std
        ly = np.log(y)
        if self.alpha is None:
            self.alpha = choose_alpha(Z, ly, groups=groups)
        self.w, self.b = ridge(Z, ly, self.alpha)
        if self.spread == "adaptive":
            self.sw, self.sb = ridge(Z, np.abs(ly - Z @ self.w - self.b), self.alpha)
        else:  # a file stores sw / sb either way: loading needs no spread
            self.sw, self.sb = np.zeros(Z.shape[1]), 1.0
        mu, sigma = self.mu_sigma(X_cal)
        self.conformal = ConformalQuantiles(LEVELS).fit(np.exp(mu), y_cal, scale=sigma)
        return self

    def mu_sigma(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(mu, sigma) of log y, mu within [0, MAX_LOG] and sigma within [sigma_floor, MAX_SIGMA]:
        a state far outside the training data extrapolates the ridge without bound, and
        exp(mu) overflowed to inf (a non-finite estimate is refused)."""
        Z = (np.asarray(X, dtype=float) - self.x_mean) / self.x_std
        return (np.clip(Z @ self.w + self.b, 0.0, MAX_LOG),
                np.clip(Z @ self.sw + self.sb, self.sigma_floor, MAX_SIGMA))

    def quantiles(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(quantiles (n, len(LEVELS)), mu) of y for features X."""
        mu, sigma = self.mu_sigma(X)
        return self.conformal.apply(np.exp(mu), scale=sigma), mu

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays, values = self.conformal.state()
        arrays.update(x_mean=self.x_mean, x_std=self.x_std, w=self.w, sw=self.sw, bias=np.array([self.b, self.sb]))
        values["alpha_fitted"] = self.alpha
        return arrays, values

    @classmethod
    def from_state(cls, alpha: float, sigma_floor: float, arrays: dict[str, np.ndarray],
                   values: dict[str, Any]) -> "RidgeHead":  # fmt: skip
        head = cls(values.get("alpha_fitted", alpha), sigma_floor)
        head.conformal = ConformalQuantiles.from_state(arrays, values)
        head.x_mean, head.x_std, head.w, head.sw = (arrays[k] for k in ("x_mean", "x_std", "w", "sw"))
        head.b, head.sb = (float(v) for v in arrays["bias"])
        return head


def check_pairs(X: np.ndarray, y: np.ndarray, X_cal: np.ndarray, y_cal: np.ndarray) -> tuple[np.ndarray, ...]:
    """The four fit arrays as floats; ValueError unless they are (n, d) features with one
    positive length per row, >= 2 fit rows and >= 1 calibration row."""
    X, X_cal = np.asarray(X, dtype=float), np.asarray(X_cal, dtype=float)
    y, y_cal = np.asarray(y, dtype=float), np.asarray(y_cal, dtype=float)
    if X.ndim != 2 or X_cal.ndim != 2 or X.shape[1] != X_cal.shape[1]:
        raise ValueError(f"features: expected two (n, d) arrays of one d, got {X.shape} and {X_cal.shape}")
    if len(X) != len(y) or len(X_cal) != len(y_cal) or len(X) < 2 or len(X_cal) < 1:
        raise ValueError("features and lengths: need >= 2 fit rows, >= 1 calibration row, one length per row")
    if not (np.isfinite(y).all() and np.isfinite(y_cal).all()) or (y <= 0).any() or (y_cal <= 0).any():
        raise ValueError("lengths: must be finite positive token counts")
    if not (np.isfinite(X).all() and np.isfinite(X_cal).all()):
        raise ValueError("features: must be finite (NaN rows: states that were never read)")
    return X, y, X_cal, y_cal


def stack_rows(requests: Sequence[Request], rows: list, key: str) -> np.ndarray:
    """(n, d) floats from each request's vector under `key`; ValueError naming the request when
    one is not a flat vector of numbers or its width differs from the first's."""
    out = []
    for r, v in zip(requests, rows):
        try:
            a = np.asarray(v, dtype=float).reshape(-1)
        except (TypeError, ValueError):
            raise ValueError(f"request {r.id!r}: features {key!r} must be a vector of numbers, got "
                             f"{type(v).__name__}") from None  # fmt: skip
        if out and a.shape != out[0].shape:
            raise ValueError(f"request {r.id!r}: features {key!r} have {a.size} values, "
                             f"request {requests[0].id!r}'s {out[0].size}")  # fmt: skip
        out.append(a)
    return np.stack(out)


def _with_key(reqs: Sequence[Request], y: np.ndarray, key: str) -> tuple[list[Request], np.ndarray]:
    keep = [i for i, r in enumerate(reqs) if r.metadata.get(key) is not None]
    return [reqs[i] for i in keep], np.asarray(y)[keep]


class HiddenStateProbe(Predictor):
    """Shared by `probe` and `egtp`; they differ only in the pooling they read."""

    pooling: str = "mean"
    role: str = "served"  # whose states: the served model's, or a draft model's (DraftProbe)
    needs_serving_model = True  # left out of `available_predictors` (text-only evaluations)
    needs_text = True  # `predict` runs the model on the prompt text (the engine hands the state
    # to `predict_features` instead): a gateway refuses a request without text, 400 naming prompt

    def __init__(self, **params: Any) -> None:
        super().__init__(**checked_params(self.name, DEFAULTS, params, nullable=("model_dir",)))
        check_alpha(self.name, self.params["alpha"])
        check_spread(self.name, self.params["spread"])
        check_sigma_floor(self.name, self.params["sigma_floor"])
        folder = None if self.params["model_dir"] is None else Path(str(self.params["model_dir"])).name
        if folder is not None and folder != self.params["model"]:  # its vectors would carry another name
            raise ValueError(f"{self.name}: parameter 'model' is {self.params['model']!r} but model_dir is the "
                             f"folder {folder!r}; the engine names a model's states by its folder: set model={folder}")
        self._featurizer: Any = None
        self.spec: FeatureSpec | None = None
        self.skipped = 0  # training requests without the state (`fit`)

    def wanted_spec(self, hidden: int) -> FeatureSpec:
        p = self.params
        return FeatureSpec(model=p["model"], layer=p["layer"], hidden=hidden, pooling=self.pooling,
                           sink=p["sink"], role=self.role)  # fmt: skip

    def front_refusal(self) -> str | None:
        if self.params["model_dir"] is not None:
            return None
        return (f"{self.name} reads the {self.role} model's hidden states, which the engine attaches, "
                f"and this file has no model_dir to compute them from prompt text; serve it in the "
                f"engine (python -m presched.engine.launch --features --probe FILE) or train it with "
                f"--param model_dir=DIR (the model's weights) to run it here")  # fmt: skip

    # --- features ---------------------------------------------------------------------------
    def features(self, requests: Sequence[Request]) -> np.ndarray:
        """(n, d) vectors of `requests`: attached ones (metadata[key]), the rest computed by the
        featurizer on `model_dir`; ValueError naming the request and key when neither exists."""
        p = self.params
        key = (self.spec or self.wanted_spec(hidden=1)).key()  # the key leaves out the width
        rows: list[np.ndarray | None] = [r.metadata.get(key) for r in requests]
        missing = [i for i, v in enumerate(rows) if v is None]
        if missing:
            if p["model_dir"] is None:
                r = requests[missing[0]]
                other = sorted(k for k in r.metadata if str(k).startswith("hidden:"))
                raise ValueError(f"request {r.id!r}: no hidden-state features {key!r} in metadata"
                                 + (f" (it has {other})" if other else "")
                                 + f"; attach them or set {self.name}'s model_dir")  # fmt: skip
            for i, v in zip(missing, self._compute([requests[i] for i in missing])):
                rows[i] = v
        return stack_rows(requests, rows, key)

    def _compute(self, requests: Sequence[Request]) -> np.ndarray:
        from presched.predict.probe.features import PromptFeaturizer

        p = self.params
        if self._featurizer is None:
            self._featurizer = PromptFeaturizer(p["model_dir"], layer=p["layer"], sink=p["sink"],
                                                model_name=p["model"])  # fmt: skip
        for r in requests:
            if not has_text(r.prompt):
                raise ValueError(f"request {r.id!r}: field 'prompt' is empty; {self.name} needs the text")
        return self._featurizer.encode([r.prompt for r in requests])[self.pooling]

    # --- fit / predict ----------------------------------------------------------------------
    def fit(self, requests: Sequence[Request], validation: Sequence[Request] | None = None) -> "HiddenStateProbe":
        p = self.params
        # text only where a vector is missing and model_dir computes it (features() says so)
        reqs, y, cal, y_cal = fit_and_calibration(requests, validation, p["calib_frac"], p["seed"],
                                                  need_text=False)  # fmt: skip
        if p["model_dir"] is None:  # records without the state (not read in the engine): skipped
            key = self.wanted_spec(hidden=1).key()
            before = len(reqs) + len(cal)
            (reqs, y), (cal, y_cal) = (_with_key(rs, ys, key) for rs, ys in ((reqs, y), (cal, y_cal)))
            self.skipped = before - len(reqs) - len(cal)
            if not reqs:  # every row dropped: name what was wanted and what the rows carry
                carried = sorted({str(k) for r in (*requests, *(validation or ())) for k in r.metadata
                                  if str(k).startswith("hidden:")})  # fmt: skip
                raise ValueError(
                    f"{self.name}: none of the {before} training requests carries features {key!r} "
                    f"(model:layer:pooling:sink, as recorded); they carry "
                    f"{', '.join(carried[:8]) if carried else 'no hidden-state features'}: set "
                    f"--param model= / layer= / sink= to what was recorded, or model_dir to compute them")
        X, X_cal = self.features(reqs), self.features(cal)
        return self.fit_features(X, y, X_cal, y_cal, groups=[prompt_key(r) for r in reqs])

    def fit_features(self, X: np.ndarray, y: np.ndarray, X_cal: np.ndarray, y_cal: np.ndarray,
                     spec: FeatureSpec | None = None, groups: Sequence[Any] | None = None) -> "HiddenStateProbe":  # fmt: skip
        """Fit on (features, true length) pairs; `spec` (default: this predictor's params) is
        stored; `groups` (the prompt of each fit row) for choosing alpha (`choose_alpha`)."""
        X, y, X_cal, y_cal = check_pairs(X, y, X_cal, y_cal)
        spec = spec or self.wanted_spec(X.shape[1])
        if spec.hidden != X.shape[1]:
            raise ValueError(f"features: {X.shape[1]} columns but spec.hidden is {spec.hidden}")
        if (spec.pooling, spec.role) != (self.pooling, self.role):
            raise ValueError(f"spec: {self.name} reads {self.pooling!r}-pooled states of the {self.role} "
                             f"model, got {spec.pooling!r}-pooled of the {spec.role} model")  # fmt: skip
        self.spec = spec
        self.head = RidgeHead(self.params["alpha"], self.params["sigma_floor"], self.params["spread"]).fit(
            X, y, X_cal, y_cal, groups=groups)
        self.fitted = True
        return self

    def predict(self, requests: Sequence[Request]) -> LengthEstimate:
        self.check_fitted()
        if len(requests) == 0:
            raise ValueError("requests: empty")
        return self.predict_features(self.features(requests))

    def predict_features(self, X: np.ndarray, spec: FeatureSpec | None = None) -> LengthEstimate:
        """Distributions from (n, d) features; `spec` (when the caller knows it) must equal the fit's."""
        self.check_fitted()
        assert self.spec is not None
        if spec is not None:
            self.spec.check(spec, f"{self.name}")
        X = np.asarray(X, dtype=float)
        if X.ndim != 2 or X.shape[1] != self.spec.hidden:
            raise ValueError(f"features: expected shape (n, {self.spec.hidden}) for {self.spec.key()}, got {X.shape}")
        if not np.isfinite(X).all():
            raise ValueError(f"features: rows {np.flatnonzero(~np.isfinite(X).all(1))[:5].tolist()} are not "
                             f"finite (NaN or inf in {self.spec.key()})")  # fmt: skip
        q, mu = self.head.quantiles(X)
        return LengthEstimate(q, q[:, _MED], mu)

    # --- persistence ------------------------------------------------------------------------
    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays, values = self.head.state()
        assert self.spec is not None
        values["spec"] = self.spec.model_dump()
        return arrays, values

    @classmethod
    def from_state(cls, params: dict[str, Any], arrays: dict[str, np.ndarray], values: dict[str, Any]) -> "HiddenStateProbe":
        pred = cls(**params)
        pred.spec = FeatureSpec.parse(values.get("spec"), f"{cls.name} file")
        if pred.spec.pooling != cls.pooling:
            raise ValueError(f"{cls.name} file: its features are {pred.spec.pooling!r}-pooled, not {cls.pooling!r}")
        if pred.spec.role != cls.role:
            raise ValueError(f"{cls.name} file: its features are the {pred.spec.role} model's, not the {cls.role} model's")
        pred.head = RidgeHead.from_state(pred.params["alpha"], pred.params["sigma_floor"], arrays, values)
        pred.fitted = True
        return pred


@PREDICTORS.register("probe")
class Probe(HiddenStateProbe):
    """TRAIL step 0: the mean-pooled residual stream at a middle layer (sink left out)."""

    name = "probe"
    pooling = "mean"


@PREDICTORS.register("egtp")
class EGTP(HiddenStateProbe):
    """EGTP: the residual stream pooled with weights proportional to next-token entropy."""

    name = "egtp"
    pooling = "egtp"


@PREDICTORS.register("draft-probe")
class DraftProbe(HiddenStateProbe):
    """OUTLETS: the mean-pooled prompt state of a speculative-decoding draft model (`model` names
    the draft model; `layer` its layer) predicting the served model's length. The draft runs
    anyway, so in the engine the features cost no extra forward (engine/plugin/draft.py)."""

    name = "draft-probe"
    pooling = "mean"
    role = "draft"
