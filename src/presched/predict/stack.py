"""`stack`: a weighted blend of member predictors in log-length space, calibrated as one.

    pred = PREDICTORS.create("stack")     # members text-gbm + ssjf (frozen MiniLM), weights fitted
    pred.fit(train_requests, validation=calib_requests)
    est = pred.predict(requests)          # LengthEstimate

Why: the cheap n-gram tier (`text-gbm`) and the encoder tier (`ssjf` on a frozen MiniLM) rank
different things well: text-gbm memorises a prompt source's templates (in-distribution τ-b
0.57, 0.24 on a source it never saw), the sentence embedding carries over to unseen sources
better (0.29) but ranks seen ones worse (0.49). Their blend beats both on both views
(docs/predictors/stack.md).

For member i with calibrated median m_i and spread s_i = (log q90_i - log q10_i) / 2.563 (its
q10..q90 width in standard-normal units):

    mu = sum_i w_i log m_i            s = sum_i w_i s_i            (w on the simplex)

w is the grid point (steps of 1 / `grid`) whose mu ranks the calibration set best (Kendall
τ-b; ties: the earlier grid point, which gives the first member most weight), unless `weights`
fixes it. Then split conformal on the same calibration set with normalised scores
(log y - mu) / s gives the quantiles (`conformal.ConformalQuantiles`); `point` = the calibrated
median, `rank_score` = mu. The members are fitted first, each with the same `validation` for
its own early stopping and calibration, so choosing w and the offsets there reuses it once more
(one weight per member: a small optimism, measured in the docs).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from presched.predict.base import PREDICTORS, Predictor, check_ranges, checked_params, predictor_class
from presched.predict.conformal import ConformalQuantiles
from presched.predict.estimate import LEVELS, LengthEstimate
from presched.predict.metrics import kendall_tau_b
from presched.predict.text_gbm import fit_and_calibration
from presched.workload.request import Request

DEFAULTS: dict[str, Any] = {
    "members": ["text-gbm", "ssjf"],                        # registered predictor names
    "member_params": {"ssjf": {"finetune_epochs": 0}},      # per member name: its parameters
    "weights": None,                                        # fixed weights (one per member), else fitted
    "grid": 10, "calib_frac": 0.2, "sigma_floor": 0.05, "seed": 0,
}  # fmt: skip
RANGES = {"grid": (1, 100, False), "calib_frac": (0, 0.9, True), "sigma_floor": (0, 10, True)}
_Z90 = 2 * 1.2815515655446004  # q10..q90 width of a standard normal
_I10, _I50, _I90 = LEVELS.index(0.1), LEVELS.index(0.5), LEVELS.index(0.9)


MAX_GRID_POINTS = 10_000  # weight vectors tried at fit time (each a tau-b on the calibration set)


def grid_points(n: int, steps: int) -> int:
    """How many weight vectors `simplex(n, steps)` gives: C(steps + n - 1, n - 1)."""
    return math.comb(steps + n - 1, n - 1)


def simplex(n: int, steps: int) -> list[tuple[float, ...]]:
    """Weights of n members in steps of 1/steps, summing to 1, first member's largest first
    (the compositions of `steps` into n parts, generated directly: not a filter over all
    (steps + 1)^n tuples)."""

    def parts(k: int, left: int):
        if k == 1:
            yield (left,)
            return
        for first in range(left, -1, -1):
            for rest in parts(k - 1, left - first):
                yield (first, *rest)

    return [tuple(x / steps for x in c) for c in parts(n, steps)]


@PREDICTORS.register("stack")
class Stack(Predictor):
    name = "stack"

    def __init__(self, **params: Any) -> None:
        super().__init__(**checked_params(self.name, DEFAULTS, params, nullable=("weights",)))
        p = self.params
        check_ranges(self.name, p, RANGES)
        names, given = p["members"], p["member_params"]
        if not names or not all(isinstance(n, str) for n in names) or len(set(names)) != len(names):
            raise ValueError(f"{self.name}: parameter 'members' must list distinct predictor names, got {names!r}")
        if not isinstance(given, dict) or not all(isinstance(v, dict) for v in given.values()):
            raise ValueError(f"{self.name}: parameter 'member_params' must map member names to parameter "
                             f"dicts, got {given!r}")  # fmt: skip
        extra = sorted(set(given) - set(names))
        if extra:
            raise ValueError(f"{self.name}: parameter 'member_params' names {extra}, not among members {names}")
        if "stack" in names:
            raise ValueError(f"{self.name}: parameter 'members' cannot hold a stack")
        w = p["weights"]
        if w is None and grid_points(len(names), p["grid"]) > MAX_GRID_POINTS:
            raise ValueError(f"{self.name}: {len(names)} members on a grid of {p['grid']} make "
                             f"{grid_points(len(names), p['grid']):,} weight vectors to try, over "
                             f"{MAX_GRID_POINTS:,}: lower parameter 'grid' or give 'weights'")  # fmt: skip
        if w is not None and (len(w) != len(names) or min(w) < 0 or not math.isclose(sum(w), 1.0)):
            raise ValueError(f"{self.name}: parameter 'weights' must be {len(names)} numbers >= 0 summing "
                             f"to 1, got {w!r}")  # fmt: skip
        # made now, so a member's bad parameter is refused before any fitting
        self.members: list[Predictor] = [predictor_class(n)(**given.get(n, {})) for n in names]
        self.needs_text = any(m.needs_text for m in self.members)
        self.weights = None if w is None else tuple(float(x) for x in w)
        self.fit_info: dict[str, Any] = {}

    # --- the blend ----------------------------------------------------------------------------
    def _parts(self, requests: Sequence[Request]) -> tuple[np.ndarray, np.ndarray]:
        """(log medians, spreads), one column per member."""
        mus, sigs = [], []
        for m in self.members:
            q = m.predict(requests).quantiles
            mus.append(np.log(q[:, _I50]))
            sigs.append((np.log(q[:, _I90]) - np.log(q[:, _I10])) / _Z90)
        return np.column_stack(mus), np.column_stack(sigs)

    def _blend(self, mu: np.ndarray, sig: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        w = np.asarray(self.weights)
        return mu @ w, np.maximum(sig @ w, self.params["sigma_floor"])

    def fit(self, requests: Sequence[Request], validation: Sequence[Request] | None = None) -> Stack:
        p = self.params
        reqs, _, cal, y_cal = fit_and_calibration(requests, validation, p["calib_frac"], p["seed"],
                                                  need_text=self.needs_text)  # fmt: skip
        for m in self.members:
            m.fit(reqs, validation=cal)
        mu, sig = self._parts(cal)
        taus = {}
        if self.weights is None:
            for w in simplex(len(self.members), p["grid"]):
                t = kendall_tau_b(mu @ np.asarray(w), y_cal)
                taus[w] = t if math.isfinite(t) else -math.inf
            self.weights = max(taus, key=taus.__getitem__)  # ties: the earlier (max keeps the first)
        m_cal, s_cal = self._blend(mu, sig)
        self.conformal = ConformalQuantiles(LEVELS, log=True).fit(np.exp(m_cal), y_cal, None, s_cal)
        self.fit_info = {"weights": list(self.weights), "calibration_rows": len(cal),
                         "calibration_tau": {",".join(f"{x:g}" for x in w): round(t, 4) for w, t in taus.items()}}  # fmt: skip
        self.fitted = True
        return self

    def predict(self, requests: Sequence[Request]) -> LengthEstimate:
        self.check_fitted()
        mu, s = self._blend(*self._parts(requests))
        q = self.conformal.apply(np.exp(mu), None, s)
        return LengthEstimate(q, q[:, _I50], mu)

    def known_models(self) -> list[str] | None:
        known = [m.known_models() for m in self.members]
        return None if all(k is None for k in known) else sorted({x for k in known if k for x in k})

    def unknown_model_fallback(self, model: str) -> str:
        """Each member's own fallback (the base text, 'pooled over all models', was wrong here)."""
        return "; ".join(f"{m.name}: {m.unknown_model_fallback(model)}" for m in self.members
                         if m.known_models() is not None) or super().unknown_model_fallback(model)  # fmt: skip

    # --- persistence: each member's arrays under its index, its values in a list --------------
    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays, members = {}, []
        for i, m in enumerate(self.members):
            a, v = m.state()
            arrays.update({f"m{i}/{k}": x for k, x in a.items()})
            members.append({"name": m.name, "params": m.params, "values": v})
        c_arrays, c_values = self.conformal.state()
        arrays.update(c_arrays)
        return arrays, {"members": members, "weights": list(self.weights), "fit_info": self.fit_info, **c_values}

    @classmethod
    def from_state(cls, params: dict[str, Any], arrays: dict[str, np.ndarray], values: dict[str, Any]) -> Stack:
        p = cls(**params)
        for i, mv in enumerate(values["members"]):
            prefix = f"m{i}/"
            sub = {k[len(prefix):]: x for k, x in arrays.items() if k.startswith(prefix)}
            m = predictor_class(mv["name"]).from_state(mv["params"], sub, mv["values"])
            m.fitted = True
            p.members[i] = m
        p.weights = tuple(values["weights"])
        p.fit_info = dict(values.get("fit_info", {}))
        p.conformal = ConformalQuantiles.from_state(arrays, values)
        return p
