"""Baselines: what any learned predictor must beat.

- `global-median`: every request gets the training set's length distribution (its quantiles;
  point = median). Cost: nothing. Rank score: constant (no ranking ability).
- `model-median`: the same per served model (`Request.model`); unseen models fall back to the
  global distribution. Captures that models differ in verbosity, nothing about the prompt.
- `linear-prompt`: per model, least squares of log(length) on log(prompt tokens); quantiles =
  prediction × the empirical quantiles of exp(residual) on the training set (one residual
  distribution per model). Reference for "does prompt length alone tell anything".

Targets are the per-request mean of its observed (uncapped) lengths (`training_targets`).
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from presched.predict.base import PREDICTORS, Predictor, check_requests, checked_params, training_targets
from presched.predict.estimate import LEVELS, LengthEstimate
from presched.workload.request import Request

_L = np.asarray(LEVELS)
GLOBAL = "__all__"


def _qs(x: np.ndarray) -> np.ndarray:
    return np.quantile(x, _L)


def _labelled(requests: Sequence[Request]) -> tuple[list[Request], np.ndarray]:
    check_requests(requests)
    t, keep = training_targets(requests)
    if not keep.any():
        raise ValueError("requests: none has a usable output length (output_tokens / output_samples)")
    return [r for r, k in zip(requests, keep) if k], t[keep]


class _Baseline(Predictor):
    """A baseline takes no parameters: any is refused, naming it."""

    def __init__(self, **params: Any) -> None:
        super().__init__(**checked_params(self.name, {}, params))


@PREDICTORS.register("global-median")
class GlobalMedian(_Baseline):
    name = "global-median"

    def fit(self, requests, validation=None):
        _, y = _labelled(requests)
        self.q = _qs(y)
        self.fitted = True
        return self

    def predict(self, requests):
        self.check_fitted()
        check_requests(requests)
        q = np.tile(self.q, (len(requests), 1))
        return LengthEstimate(q, q[:, LEVELS.index(0.5)], np.zeros(len(requests)))

    def state(self):
        return {"q": self.q}, {}

    @classmethod
    def from_state(cls, params, arrays, values):
        p = cls(**params)
        p.q = arrays["q"]
        return p


@PREDICTORS.register("model-median")
class ModelMedian(_Baseline):
    name = "model-median"

    def fit(self, requests, validation=None):
        reqs, y = _labelled(requests)
        models = np.array([r.model for r in reqs])
        self.table = {GLOBAL: _qs(y)}
        for m in np.unique(models):
            self.table[str(m)] = _qs(y[models == m])
        self.fitted = True
        return self

    def predict(self, requests):
        self.check_fitted()
        check_requests(requests)
        g = self.table[GLOBAL]
        q = np.array([self.table.get(r.model, g) for r in requests])
        med = q[:, LEVELS.index(0.5)]
        return LengthEstimate(q, med, med)

    def known_models(self) -> list[str]:
        return [n for n in self.table if n != GLOBAL]

    def unknown_model_fallback(self, model: str) -> str:
        return "the quantiles of all training lengths (every model pooled)"

    def state(self):
        names = sorted(self.table)
        return {"q": np.array([self.table[n] for n in names])}, {"models": names}

    @classmethod
    def from_state(cls, params, arrays, values):
        p = cls(**params)
        p.table = {n: row for n, row in zip(values["models"], arrays["q"])}
        return p


@PREDICTORS.register("linear-prompt")
class LinearPrompt(_Baseline):
    name = "linear-prompt"

    def fit(self, requests, validation=None):
        reqs, y = _labelled(requests)
        models = np.array([r.model for r in reqs])
        x = np.log([r.prompt_tokens for r in reqs])
        ly = np.log(y)
        self.coef: dict[str, np.ndarray] = {}
        for m in [GLOBAL, *np.unique(models)]:
            sel = np.ones(len(reqs), bool) if m == GLOBAL else models == m
            a = np.vstack([np.ones(sel.sum()), x[sel]]).T
            beta, *_ = np.linalg.lstsq(a, ly[sel], rcond=None)
            resid = ly[sel] - a @ beta
            self.coef[str(m)] = np.concatenate([beta, np.quantile(resid, _L)])
        self.fitted = True
        return self

    def predict(self, requests):
        self.check_fitted()
        check_requests(requests)
        g = self.coef[GLOBAL]
        rows = np.array([self.coef.get(r.model, g) for r in requests])
        mu = rows[:, 0] + rows[:, 1] * np.log([r.prompt_tokens for r in requests])
        q = np.exp(mu[:, None] + rows[:, 2:])
        return LengthEstimate(q, q[:, LEVELS.index(0.5)], mu)

    def known_models(self) -> list[str]:
        return [n for n in self.coef if n != GLOBAL]

    def unknown_model_fallback(self, model: str) -> str:
        return "the fit pooled over every model"

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        names = sorted(self.coef)
        return {"coef": np.array([self.coef[n] for n in names])}, {"models": names}

    @classmethod
    def from_state(cls, params, arrays, values):
        p = cls(**params)
        p.coef = {n: row for n, row in zip(values["models"], arrays["coef"])}
        return p
