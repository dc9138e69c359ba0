"""`text-gbm-static`: text-gbm plus a static MiniLM embedding of the prompt (model2vec).

    pred = PREDICTORS.create("text-gbm-static")          # or TextGBMStatic(static_dims=64, ...)

The hashed n-grams of text-gbm memorise a prompt source's templates (in-dist τ-b 0.56, but 0.21
on a source held out of training: `presched eval --view loso`). This variant adds features
meant to transfer across sources, from `static_embed.StaticTable` (MiniLM distilled with
model2vec, keyed on the o200k ids text-gbm already computes; no tokenizer, no network at run time):

- `sem_score`: ridge (`static_alpha`) of the prompt's verbosity t_p on its `static_dims`-dim
  embedding, out of fold over prompts in training, as text-gbm's n-gram score is;
- the first `static_features` embedding dimensions themselves (PCA order: the first carry most
  variance), for the booster to split on;
- no LSA topics by default (`svd=0`; text-gbm's 24 with `svd=24`), and `ngram_score=False`
  drops the n-gram ridge score too (its column is constant 0): fewer memorising n-gram features.

Everything else (booster, spread model, conformal calibration, model conditioning) is text-gbm's.
Fitting needs the `encoder` extra and `model2vec` (to distil, once, cached); predicting needs
neither: the table is saved in the model file. Measured figures: docs/predictors/text-gbm-static.md.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from presched.predict.base import PREDICTORS
from presched.predict.static_embed import StaticTable
from presched.predict.text_gbm import DEFAULTS as BASE_DEFAULTS
from presched.predict.text_gbm import TextGBM

STATIC_DEFAULTS: dict[str, Any] = {"static_dims": 64, "static_features": 16, "static_alpha": 1.0,
                                   "ngram_score": True}  # fmt: skip
BASE_OVERRIDES: dict[str, Any] = {"svd": 0}
"""text-gbm parameters whose default differs here: no LSA topics (best leave-one-source-out τ-b
of the variants measured, docs/predictors/text-gbm-static.md). Task offsets are on, as in
text-gbm (measured here too: +0.010 mean LOSO τ-b over two seeds)."""


@PREDICTORS.register("text-gbm-static")
class TextGBMStatic(TextGBM):
    name = "text-gbm-static"
    fit_requires = ("model2vec",)  # the `static` extra: left out of the default eval list without it

    def __init__(self, **params: Any) -> None:
        unknown = set(params) - set(BASE_DEFAULTS) - set(STATIC_DEFAULTS)
        if unknown:
            raise ValueError(f"{self.name}: unknown parameter(s) {sorted(unknown)}; "
                             f"known: {sorted({**BASE_DEFAULTS, **STATIC_DEFAULTS})}")  # fmt: skip
        static = {**STATIC_DEFAULTS, **{k: v for k, v in params.items() if k in STATIC_DEFAULTS}}
        super().__init__(**{**BASE_OVERRIDES, **{k: v for k, v in params.items() if k in BASE_DEFAULTS}})
        if not 0 <= static["static_features"] <= static["static_dims"]:
            raise ValueError(f"{self.name}: static_features must be in [0, static_dims], got {static['static_features']}")
        self.params.update(static)
        self.table: StaticTable | None = None

    def _extra_fit(self, ids: np.ndarray, off: np.ndarray, tp: np.ndarray, fold: np.ndarray) -> np.ndarray:
        from sklearn.linear_model import Ridge

        p = self.params
        full = StaticTable.distill(p["static_dims"], ids, head=p["head"], tail=p["tail"])
        emb = full.embed(ids, off)
        ridge = Ridge(alpha=p["static_alpha"]).fit(emb, tp)
        sem = np.full(emb.shape[0], float(ridge.intercept_))
        for f in np.unique(fold):
            tr, te = fold != f, fold == f
            if tr.any():
                sem[te] = Ridge(alpha=p["static_alpha"]).fit(emb[tr], tp[tr]).predict(emb[te])
        # keep only what predict reads: [ridge score without intercept, the first components]
        k = p["static_features"]
        self.table = full.project(np.column_stack([ridge.coef_, np.eye(full.dims)[:, :k]]))
        self.sem_intercept = float(ridge.intercept_)
        return np.column_stack([sem, emb[:, :k]])

    def _extra(self, ids: np.ndarray, off: np.ndarray) -> np.ndarray:
        out = self.table.embed(ids, off)
        out[:, 0] += self.sem_intercept
        return out

    def _extra_names(self) -> list[str]:
        return ["sem_score", *(f"static{i}" for i in range(self.params["static_features"]))]

    def _dense(self, score, proj, tok, cues, inv, requests, extra=None):
        if not self.params["ngram_score"]:
            score = np.zeros_like(score)
        return super()._dense(score, proj, tok, cues, inv, requests, extra)

    # --- persistence ------------------------------------------------------------------------
    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays, values = super().state()
        arrays.update(self.table.state())
        values["sem_intercept"] = self.sem_intercept
        return arrays, values

    @classmethod
    def from_state(cls, params: dict[str, Any], arrays: dict[str, np.ndarray], values: dict[str, Any]) -> TextGBMStatic:
        p = super().from_state(params, arrays, values)
        p.table = StaticTable.from_state(arrays, head=p.params["head"], tail=p.params["tail"])
        p.sem_intercept = float(values["sem_intercept"])
        return p
