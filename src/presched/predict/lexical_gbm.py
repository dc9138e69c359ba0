"""`lexical-gbm`: a Clairvoyant-style anchor (19 hand lexical features -> gradient boosting).

An ANCHOR to beat, not a default. It reproduces, in spirit, the predictor of Clairvoyant
(arXiv 2606.07248; repo `Aravind0403/clairvoyant-scheduler`, `scheduler/internal/predictor/
features.go` + `profiler/feature_extractor.py`): XGBoost on 19 lexical features, 0.03 ms a
prediction. Its 19 features, in its order:

  6 numeric: prompt_token_len (len(text) // 4, as Clairvoyant), has_code_keyword (a word in its
  33 code/web keywords), has_length_constraint ("in N words/sentences", "no more than N",
  "under N words", briefly, concisely, shortly, one-liner, tl;dr), ends_with_question,
  has_format_keyword (list, table, bullet, step by step, enumerate, outline, numbered, format,
  structure), clause_count (commas + semicolons + " and " + " but " + " because ");
  13 one-hot: the first matching instruction verb in priority order summarize, explain,
  compare, translate, generate, implement, debug, refactor, list, write, describe, define,
  what, how, why; one-hot over what, write, explain, summarize, how, list, implement, compare,
  describe, generate, why, define, other (translate/debug/refactor match but have no column,
  as in the original).

Adaptations (documented, because one presched predictor serves many models): one extra
feature, the served model's mean log length in training (unseen models: the mean over models of
the same family, else over all); LightGBM (`num_threads=1`) instead of XGBoost, L2 on
log length, early stopping on `validation`; quantiles by split-conformal residual offsets
(`conformal.ConformalQuantiles`, log space) on `validation` (or a prompt-disjoint
`calib_frac` of the requests). Point = calibrated median; rank score = the log prediction.
"""

from __future__ import annotations

import re
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from presched.predict import features as F
from presched.predict.base import PREDICTORS, Predictor, check_ranges, check_requests, checked_params
from presched.predict.conformal import ConformalQuantiles
from presched.predict.estimate import LEVELS, LengthEstimate
from presched.predict.text_gbm import fit_and_calibration
from presched.workload.request import Request

_CODE_KEYWORDS = frozenset(
    ["code", "function", "def", "class", "script", "program", "implement", "algorithm", "debug", "refactor", "import", "variable", "loop", "recursion", "api", "sql", "regex", "react", "angular", "vue", "nextjs", "typescript", "javascript", "html", "css", "node", "express", "django", "flask", "component", "endpoint", "middleware", "query"]
)
_CONSTRAINT = re.compile(r"\bin\s+\d+\s+words?\b|\bin\s+\d+\s+sentences?\b|\bno\s+more\s+than\s+\d+"
                         r"|\bunder\s+\d+\s+words?\b|\bbriefly\b|\bconcisely\b|\bshortly\b"
                         r"|\bone[\s-]liner\b|\btl;?dr\b", re.IGNORECASE)  # fmt: skip
_FORMAT = ("list", "table", "bullet", "step by step", "enumerate", "outline", "numbered", "format", "structure")
_VERBS = [(v, re.compile(p, re.IGNORECASE)) for v, p in [
    ("summarize", r"\bsummariz(?:e|ing)\b"), ("explain", r"\bexplain\b"), ("compare", r"\bcompar(?:e|ing)\b"),
    ("translate", r"\btranslat(?:e|ing)\b"), ("generate", r"\bgenerat(?:e|ing)\b"),
    ("implement", r"\bimplement\b"), ("debug", r"\bdebug\b"), ("refactor", r"\brefactor\b"),
    ("list", r"\blist\b"), ("write", r"\bwrite\b"), ("describe", r"\bdescrib(?:e|ing)\b"),
    ("define", r"\bdefin(?:e|ing)\b"), ("what", r"\bwhat\b"), ("how", r"\bhow\b"), ("why", r"\bwhy\b")]]  # fmt: skip
_ONE_HOT = ("what", "write", "explain", "summarize", "how", "list", "implement", "compare", "describe",
            "generate", "why", "define", "other")  # fmt: skip
_WORDS = re.compile(r"[^\W_]+")

FEATURE_NAMES: tuple[str, ...] = (
    "prompt_token_len", "has_code_keyword", "has_length_constraint", "ends_with_question",
    "has_format_keyword", "clause_count", *(f"verb_{v}" for v in _ONE_HOT),
)  # fmt: skip

DEFAULTS: dict[str, Any] = {"learning_rate": 0.1, "num_leaves": 63, "max_depth": 6, "min_data_in_leaf": 20,
                                "max_rounds": 1000, "early_stopping": 50, "calib_frac": 0.2, "seed": 0}  # fmt: skip
RANGES = {"learning_rate": (0, 1, True), "num_leaves": (2, 1 << 17, False), "max_depth": (-1, 64, False),
          "min_data_in_leaf": (1, 1 << 30, False), "max_rounds": (1, 100_000, False),
          "early_stopping": (1, 100_000, False), "calib_frac": (0, 0.9, True)}  # (lo, hi, lo excluded)
_MED = LEVELS.index(0.5)


def clairvoyant_features(texts: Sequence[str]) -> np.ndarray:
    """(n, 19) Clairvoyant's lexical features (FEATURE_NAMES), one row per prompt."""
    out = np.zeros((len(texts), len(FEATURE_NAMES)))
    for i, t in enumerate(texts):
        lower = t.lower()
        verb = next((v for v, rx in _VERBS if rx.search(t)), "other")
        out[i, :6] = [len(t) // 4, not _CODE_KEYWORDS.isdisjoint(_WORDS.findall(lower)),
                      bool(_CONSTRAINT.search(t)), t.rstrip().endswith("?"),
                      any(k in lower for k in _FORMAT),
                      t.count(",") + t.count(";") + lower.count(" and ") + lower.count(" but ")
                      + lower.count(" because ")]  # fmt: skip
        if verb in _ONE_HOT:
            out[i, 6 + _ONE_HOT.index(verb)] = 1.0
    return out


@PREDICTORS.register("lexical-gbm")
class LexicalGBM(Predictor):
    name = "lexical-gbm"
    needs_text = True

    def __init__(self, **params: Any) -> None:
        super().__init__(**checked_params("lexical-gbm", DEFAULTS, params))
        check_ranges(self.name, self.params, RANGES)
        self.fit_info: dict[str, Any] = {}

    def _model_col(self, models: Sequence[str]) -> np.ndarray:
        cache: dict[str, float] = {}
        for m in set(models):
            if m in self.model_mean:
                cache[m] = self.model_mean[m]
            else:
                same = [v for n, v in self.model_mean.items() if F.same_family(m, n)]
                cache[m] = float(np.mean(same if same else list(self.model_mean.values())))
        return np.array([cache[m] for m in models])

    def _features(self, requests: Sequence[Request]) -> np.ndarray:
        return np.column_stack([clairvoyant_features([r.prompt for r in requests]),
                                self._model_col([r.model for r in requests])])  # fmt: skip

    def fit(self, requests: Sequence[Request], validation: Sequence[Request] | None = None) -> LexicalGBM:
        import lightgbm as lgb

        t0 = time.perf_counter()
        p = self.params
        reqs, y, cal, y_cal = fit_and_calibration(requests, validation, p["calib_frac"], p["seed"])
        ly = np.log(y)
        models = np.array([r.model for r in reqs])
        self.model_mean = {str(m): float(ly[models == m].mean()) for m in np.unique(models)}
        D, D_cal = self._features(reqs), self._features(cal)
        params = {"objective": "l2", "learning_rate": p["learning_rate"], "num_leaves": p["num_leaves"],
                      "max_depth": p["max_depth"], "min_data_in_leaf": p["min_data_in_leaf"], "num_threads": 1,
                      "verbose": -1, "seed": p["seed"], "deterministic": True, "force_row_wise": True}  # fmt: skip
        dtr = lgb.Dataset(D, ly)
        bst = lgb.train(params, dtr, p["max_rounds"], valid_sets=[lgb.Dataset(D_cal, np.log(y_cal), reference=dtr)],
                        callbacks=[lgb.early_stopping(p["early_stopping"], verbose=False)])  # fmt: skip
        n = max(bst.best_iteration or p["max_rounds"], 1)
        self.booster = lgb.Booster(model_str=bst.model_to_string(num_iteration=n))
        mu_cal = self.booster.predict(D_cal, num_threads=1)
        self.conformal = ConformalQuantiles(LEVELS, log=True).fit(np.exp(mu_cal), y_cal)
        self.fit_info = {"rows": len(reqs), "calibration_rows": len(cal), "rounds": n,
                             "seconds": round(time.perf_counter() - t0, 2)}  # fmt: skip
        self.fitted = True
        return self

    def predict(self, requests: Sequence[Request]) -> LengthEstimate:
        self.check_fitted()
        check_requests(requests, need_text=True)
        mu = self.booster.predict(self._features(requests), num_threads=1)
        q = self.conformal.apply(np.exp(mu))
        return LengthEstimate(q, q[:, _MED], mu)

    def known_models(self) -> list[str]:
        return list(self.model_mean)

    def unknown_model_fallback(self, model: str) -> str:
        return "the mean log length of the fitted models of its family (else of all fitted models)"

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        names = sorted(self.model_mean)
        arrays, values = self.conformal.state()
        arrays["model_mean"] = np.array([self.model_mean[n] for n in names])
        values.update(models=names, booster=self.booster.model_to_string(), fit_info=self.fit_info)
        return arrays, values

    @classmethod
    def from_state(cls, params: dict[str, Any], arrays: dict[str, np.ndarray], values: dict[str, Any]) -> LexicalGBM:
        import lightgbm as lgb

        p = cls(**params)
        p.model_mean = {n: float(v) for n, v in zip(values["models"], arrays["model_mean"])}
        p.booster = lgb.Booster(model_str=values["booster"])
        p.conformal = ConformalQuantiles.from_state(arrays, values)
        p.fit_info = dict(values.get("fit_info", {}))
        return p
