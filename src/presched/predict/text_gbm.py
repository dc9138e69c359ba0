"""`text-gbm`: the default output-length predictor. Fast, CPU-only, calibrated.

    pred = PREDICTORS.create("text-gbm")            # or TextGBM(learning_rate=0.05, ...)
    pred.fit(train_requests, validation=calib_requests)
    est = pred.predict(requests)                    # LengthEstimate: 11 quantiles, point, rank

Pipeline (all in log-length space; y = a request's mean uncapped output length):

1. **Text score** (`features.NgramHasher`): hashed o200k-token 1–2-grams of the prompt's head and
   tail -> ridge regression on the prompt's *verbosity* t_p, the per-prompt mean of
   log y - b_m over the models that answered it (b_m: model offsets, fitted by alternating
   means). One prompt = one ridge row, so 13 models' answers to a prompt count once. Training
   rows get out-of-fold scores (`folds` folds over prompts), so the booster never sees a score
   fitted on its own label.
2. **Topics**: a `svd`-dimensional truncated SVD (LSA) of the same n-grams (columns present in
   >= `svd_min_df` training prompts): lets the booster find prompt families the ridge averages.
3. **Dense features** per request: text score, SVD topics, log prompt_tokens (the served model's
   count), log o200k count (toktok-rs), `features.CUE_NAMES` lexical cues, and the served model
   as numbers: its offset b_m, its residual spread s_m, family and log parameter count parsed
   from the name (`features.model_features`). An unseen model gets the mean b/s of its family
   (else of all models) and its parsed family/size: graceful fallback, no retraining needed.
   With `task_offsets` (on by default), also b_m and s_m fitted per task type (code / text, a fixed rule on the
   cues: `task_type.py`) and the prompt's type: a model's verbosity on code is not its verbosity
   on chat.
4. **Booster** (LightGBM, L2 on log y, `num_threads=1`, early stopping on `validation`) -> mu.
   A second booster predicts the spread sigma = E|log y - mu| from out-of-fold residuals.
5. **Split-conformal calibration** (`conformal.ConformalQuantiles`, normalised scores
   (log y - mu) / sigma) on `validation`: quantile j = exp(mu + sigma * offset_j), so every
   level's coverage is right on exchangeable data. `point` = calibrated median (the MAE-optimal
   guess); `rank_score` = mu.

Without `validation`, a prompt-disjoint `calib_frac` of the requests (by
`presched.predict.data.prompt_key`) is held out for early stopping and calibration.
Costs, accuracy and parameters: docs/predictors/text-gbm.md.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from presched.predict import features as F
from presched.predict.base import PREDICTORS, Predictor, check_ranges, check_requests, checked_params, training_targets
from presched.predict.conformal import ConformalQuantiles
from presched.predict.estimate import LEVELS, LengthEstimate
from presched.predict.task_type import TaskOffsets, code_task
from presched.workload.request import Request

DEFAULTS: dict[str, Any] = {
    "bits": 18, "order": 2, "head": 256, "tail": 64,            # n-gram hasher
    "alpha": 0.3, "folds": 5,                             # ridge text score (out-of-fold)
    "svd": 24, "svd_min_df": 5,                           # LSA topics
    "cues": True,                                         # the 36 lexical cues (False: faster, less accurate)
    "task_offsets": None,                                 # model offsets per task type (code / text, task_type.py):
                                                          # None = on with the cues; True refuses cues=False
    "learning_rate": 0.05, "num_leaves": 127, "min_data_in_leaf": 50, "feature_fraction": 0.8,
    "lambda_l2": 1.0, "max_rounds": 200, "early_stopping": 100,   # max_rounds bounds the cost per request
    "scale_model": True, "scale_folds": 3,                # spread booster on out-of-fold residuals
    "calib_frac": 0.2, "calibrate_by_model": False, "min_group": 300,
    "sigma_floor": 0.05, "seed": 0,
}  # fmt: skip
INF = float("inf")
RANGES = {  # (lo, hi, lo excluded): checked at construction, naming the parameter
    "order": (1, 4, False), "head": (1, 1 << 20, False), "tail": (0, 1 << 20, False), "alpha": (0, INF, True),
    "folds": (2, 100, False), "svd": (0, 1024, False), "svd_min_df": (1, 1 << 30, False),
    "learning_rate": (0, 1, True), "num_leaves": (2, 1 << 17, False), "min_data_in_leaf": (1, 1 << 30, False),
    "feature_fraction": (0, 1, True), "lambda_l2": (0, INF, False), "max_rounds": (1, 100_000, False),
    "early_stopping": (1, 100_000, False), "scale_folds": (2, 100, False), "calib_frac": (0, 0.9, True),
    "min_group": (1, 1 << 30, False), "sigma_floor": (0, 10, True),
}  # fmt: skip
_MED = LEVELS.index(0.5)


def labelled(requests: Sequence[Request], what: str = "requests",
             need_text: bool = True) -> tuple[list[Request], np.ndarray]:  # fmt: skip
    """The requests with a usable target, and their targets (text required unless not `need_text`)."""
    check_requests(requests, need_text=need_text)
    t, keep = training_targets(requests)
    if not keep.any():
        raise ValueError(f"{what}: none has a usable output length (output_tokens / output_samples)")
    return [r for r, k in zip(requests, keep) if k], t[keep]


def prompt_split(requests: Sequence[Request], frac: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Boolean masks (fit, held_out): a prompt-disjoint random `frac` of the prompts held out."""
    from presched.predict.data import prompt_key

    keys = np.array([prompt_key(r) for r in requests])
    uniq = np.unique(keys)
    rng = np.random.default_rng(seed)
    n_out = max(1, round(frac * uniq.size)) if uniq.size > 1 else 0
    out_keys = set(rng.choice(uniq, size=n_out, replace=False).tolist()) if n_out else set()
    held = np.array([k in out_keys for k in keys])
    return ~held, held



def fit_and_calibration(
    requests: Sequence[Request], validation: Sequence[Request] | None, frac: float, seed: int,
    need_text: bool = True,
) -> tuple[list[Request], np.ndarray, list[Request], np.ndarray]:
    """(fit requests, their targets, calibration requests, their targets): `validation` when
    given, else a prompt-disjoint `frac` of `requests` held out (`prompt_split`). `need_text`:
    refuse requests without prompt text (False for predictors that read other features)."""
    reqs, y = labelled(requests, need_text=need_text)
    if validation is not None:
        cal, y_cal = labelled(validation, "validation", need_text)
        return reqs, y, cal, y_cal
    fit_m, cal_m = prompt_split(reqs, frac, seed)
    if not cal_m.any() or not fit_m.any():
        raise ValueError("requests: need at least two distinct prompts to hold one out for calibration")
    cal = [r for r, k in zip(reqs, cal_m) if k]
    return [r for r, k in zip(reqs, fit_m) if k], y[fit_m], cal, y[cal_m]

def model_offsets(prompt_idx: np.ndarray, model_idx: np.ndarray, ly: np.ndarray, n_models: int,
                  iters: int = 5) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """Two-way additive fit ly ~ t_p + b_m by alternating means. Returns (unique prompt indices,
    t_p per unique prompt, b_m per model) with b centred (row-weighted mean 0)."""
    u, inv = np.unique(prompt_idx, return_inverse=True)
    b = np.zeros(n_models)
    cnt_p = np.bincount(inv)
    cnt_m = np.maximum(np.bincount(model_idx, minlength=n_models), 1)
    for _ in range(iters):
        tp = np.bincount(inv, ly - b[model_idx]) / cnt_p
        b = np.bincount(model_idx, ly - tp[inv], minlength=n_models) / cnt_m
        b -= np.average(b[model_idx])
    tp = np.bincount(inv, ly - b[model_idx]) / cnt_p
    return u, tp, b


def _lgb_params(p: dict[str, Any], seed: int) -> dict[str, Any]:
    return {"objective": "l2", "learning_rate": p["learning_rate"], "num_leaves": p["num_leaves"],
                "min_data_in_leaf": p["min_data_in_leaf"], "feature_fraction": p["feature_fraction"],
                "bagging_fraction": 0.8, "bagging_freq": 1, "lambda_l2": p["lambda_l2"], "num_threads": 1,
                "verbose": -1, "seed": seed, "deterministic": True, "force_row_wise": True}  # fmt: skip


@PREDICTORS.register("text-gbm")
class TextGBM(Predictor):
    name = "text-gbm"
    needs_text = True

    def __init__(self, **params: Any) -> None:
        super().__init__(**checked_params("text-gbm", DEFAULTS, params))
        p = self.params
        check_ranges(self.name, p, RANGES)
        if p["task_offsets"] not in (None, True, False):
            raise ValueError(f"{self.name}: parameter 'task_offsets' must be true, false or null, got {p['task_offsets']!r}")
        if p["task_offsets"] and not p["cues"]:
            raise ValueError(f"{self.name}: parameter 'task_offsets' needs 'cues' (its task rule reads them)")
        self.hasher = F.NgramHasher(bits=p["bits"], order=p["order"], head=p["head"], tail=p["tail"])
        self.task_offsets: TaskOffsets | None = None
        self._svd_pos: np.ndarray | None = None  # column id -> index in svd_cols (-1: not used)
        self.fit_info: dict[str, Any] = {}

    # --- features ---------------------------------------------------------------------------
    def _project(self, X: Any) -> np.ndarray:
        """LSA topics X[:, svd_cols] @ svd_comp.T. The columns are remapped through a lookup
        table (scipy's column fancy-indexing costs ~0.3 ms per call) and multiplied by a
        C-ordered float32 copy of the basis (measured 1.6x faster than the float64 transpose)."""
        import scipy.sparse as sp

        if not self.svd_comp.size:
            return np.zeros((X.shape[0], 0))
        if self._svd_pos is None:
            self._svd_pos = np.full(self.hasher.n_features, -1, dtype=np.int32)
            self._svd_pos[self.svd_cols] = np.arange(self.svd_cols.size)
            self._svd_basis = np.ascontiguousarray(self.svd_comp.T, dtype=np.float32)
        pos = self._svd_pos[X.indices]
        keep = pos >= 0
        kept = np.concatenate(([0], np.cumsum(keep)))[X.indptr]
        Xs = sp.csr_matrix((X.data[keep], pos[keep], kept), shape=(X.shape[0], self.svd_cols.size))
        return np.asarray(Xs @ self._svd_basis, dtype=np.float64)

    def _model_rows(self, models: Sequence[str]) -> np.ndarray:
        """(n, 4): b_m, s_m (fallback: family mean, else overall mean), family, log params."""
        cache: dict[str, list[float]] = {}
        out = np.empty((len(models), 4))
        for i, m in enumerate(models):
            row = cache.get(m)
            if row is None:
                fam, logp, _ = F.model_features([m])[0]
                if m in self.model_index:
                    bs = self.model_stats[self.model_index[m]]
                else:
                    same = [j for n, j in self.model_index.items() if F.same_family(m, n)]
                    bs = self.model_stats[same].mean(axis=0) if same else self.model_stats.mean(axis=0)
                row = cache[m] = [bs[0], bs[1], fam, logp]
            out[i] = row
        return out

    def _dense(self, score: np.ndarray, proj: np.ndarray, tok: np.ndarray, cues: np.ndarray,
               inv: np.ndarray, requests: Sequence[Request], extra: np.ndarray | None = None) -> np.ndarray:  # fmt: skip
        pt = np.log(np.array([r.prompt_tokens for r in requests], dtype=float))
        models = [r.model for r in requests]
        cols = [score[inv], proj[inv], pt, np.log1p(tok[inv]), cues[inv], self._model_rows(models)]
        if self.task_offsets is not None:
            task = code_task(cues)[inv]
            cols += [self.task_offsets.rows(models, task), task]
        if extra is not None and extra.shape[1]:
            cols.append(extra[inv])
        return np.column_stack(cols)

    # --- extra per-prompt features: none here; subclasses (text_gbm_static) add theirs -------
    def _extra_fit(self, ids: np.ndarray, off: np.ndarray, tp: np.ndarray, fold: np.ndarray) -> np.ndarray:
        """Fit the extra features on the training prompts (o200k ids, verbosity targets `tp`,
        the text score's `fold` of each prompt) and return theirs, out of fold where fitted."""
        return np.zeros((off.size - 1, 0))

    def _extra(self, ids: np.ndarray, off: np.ndarray) -> np.ndarray:
        """The extra features of unseen prompts."""
        return np.zeros((off.size - 1, 0))

    def _extra_names(self) -> list[str]:
        return []

    def _cues(self, texts: Sequence[str]) -> np.ndarray:
        """The lexical cues, or no columns with `cues=False` (the Python per-prompt stage)."""
        return F.lexical_cues(texts) if self.params["cues"] else np.zeros((len(texts), 0))

    def known_models(self) -> list[str]:
        return list(self.models)

    def unknown_model_fallback(self, model: str) -> str:
        fam = F.model_family(model)
        same = [n for n in self.models if F.same_family(model, n)]
        per_task = " (overall and per task type)" if self.task_offsets is not None else ""
        if same:
            return (f"the mean verbosity offset and spread{per_task} of the {len(same)} {F.FAMILIES[fam]} model(s) "
                    f"it was fitted on, and the size parsed from the name")  # fmt: skip
        return f"the mean verbosity offset and spread{per_task} of all {len(self.models)} models it was fitted on"

    def feature_names(self) -> list[str]:
        return ["text_score", *(f"svd{i}" for i in range(self.svd_comp.shape[0])), "log_prompt_tokens",
                "log_o200k", *(F.CUE_NAMES if self.params["cues"] else ()), "model_offset", "model_spread",
                "family", "log_params", *(("task_offset", "task_spread", "code_task") if self.task_offsets else ()),
                *self._extra_names()]  # fmt: skip

    # --- fit --------------------------------------------------------------------------------
    def fit(self, requests: Sequence[Request], validation: Sequence[Request] | None = None) -> TextGBM:
        import lightgbm as lgb
        from sklearn.decomposition import TruncatedSVD
        from sklearn.linear_model import Ridge

        t0 = time.perf_counter()
        p = self.params
        reqs, y, cal, y_cal = fit_and_calibration(requests, validation, p["calib_frac"], p["seed"])
        ly, ly_cal = np.log(y), np.log(y_cal)
        rng = np.random.default_rng(p["seed"])

        # prompts and models of the training rows
        text_idx: dict[str, int] = {}
        ti = np.array([text_idx.setdefault(r.prompt, len(text_idx)) for r in reqs])
        texts = list(text_idx)
        self.models = sorted({r.model for r in reqs})
        self.model_index = {m: i for i, m in enumerate(self.models)}
        mi = np.array([self.model_index[r.model] for r in reqs])
        u, tp, b = model_offsets(ti, mi, ly, len(self.models))
        resid = ly - tp[np.searchsorted(u, ti)] - b[mi]
        s = np.sqrt(np.bincount(mi, resid**2, minlength=len(self.models)) / np.maximum(np.bincount(mi), 1))
        self.model_stats = np.column_stack([b, s])

        # 1. ridge text score, out of fold over prompts
        ids, off = F.encode(texts)
        X, tok = self.hasher.from_ids(ids, off), np.diff(off)
        ridge = Ridge(alpha=p["alpha"]).fit(X, tp)
        self.coef = ridge.coef_.astype(np.float32)  # float32 as saved (and half the cache footprint)
        self.intercept = float(ridge.intercept_)
        score = np.empty(len(texts))
        fold = rng.permutation(len(texts)) % max(p["folds"], 2)
        for f in range(max(p["folds"], 2)):
            tr, te = fold != f, fold == f
            if tr.any() and te.any():
                score[te] = Ridge(alpha=p["alpha"]).fit(X[tr], tp[tr]).predict(X[te])
        # 2. LSA topics over columns seen in enough prompts
        dfreq = np.bincount(X.indices, minlength=X.shape[1])
        self.svd_cols = np.flatnonzero(dfreq >= p["svd_min_df"]).astype(np.int64)
        self._svd_pos = None  # rebuilt by _project
        k = min(p["svd"], self.svd_cols.size - 1, len(texts) - 1)
        if k >= 1:
            svd = TruncatedSVD(k, random_state=p["seed"], n_iter=5).fit(X[:, self.svd_cols])
            self.svd_comp = svd.components_.astype(np.float32)
        else:
            self.svd_comp = np.zeros((0, self.svd_cols.size), dtype=np.float32)
        extra = self._extra_fit(ids, off, tp, fold)
        cues = self._cues(texts)
        self.task_offsets = (TaskOffsets.fit(self.models, ti, mi, ly, code_task(cues)[ti], model_offsets)
                             if p["cues"] and p["task_offsets"] is not False else None)  # fmt: skip
        D = self._dense(score, self._project(X), tok, cues, ti, reqs, extra)
        t_feat = time.perf_counter() - t0

        # validation features (full ridge)
        D_cal = self._features(cal)
        # 4. point booster with early stopping on validation
        params = _lgb_params(p, p["seed"])
        dtr = lgb.Dataset(D, ly, free_raw_data=False)
        dva = lgb.Dataset(D_cal, ly_cal, reference=dtr)
        bst = lgb.train(params, dtr, p["max_rounds"], valid_sets=[dva],
                        callbacks=[lgb.early_stopping(p["early_stopping"], verbose=False)])  # fmt: skip
        n_rounds = max(bst.best_iteration or p["max_rounds"], 1)
        self.booster = lgb.Booster(model_str=bst.model_to_string(num_iteration=n_rounds))
        # spread booster on out-of-fold residuals (folds over prompts)
        self.scale_booster = None
        if p["scale_model"]:
            oof = np.empty(len(reqs))
            pfold = rng.permutation(len(texts)) % max(p["scale_folds"], 2)
            rfold = pfold[ti]
            for f in range(max(p["scale_folds"], 2)):
                tr, te = rfold != f, rfold == f
                if tr.any() and te.any():
                    bf = lgb.train(params, lgb.Dataset(D[tr], ly[tr]), n_rounds)
                    oof[te] = bf.predict(D[te], num_threads=1)
            mu_tr = oof
            mu_cal = self.booster.predict(D_cal, num_threads=1)
            sparams = {**params, "objective": "l2", "learning_rate": 0.1, "num_leaves": 15}
            dst = lgb.Dataset(np.column_stack([D, mu_tr]), np.abs(ly - mu_tr))
            dsv = lgb.Dataset(np.column_stack([D_cal, mu_cal]), np.abs(ly_cal - mu_cal), reference=dst)
            sb = lgb.train(sparams, dst, p["max_rounds"], valid_sets=[dsv],
                           callbacks=[lgb.early_stopping(50, verbose=False)])  # fmt: skip
            self.scale_booster = lgb.Booster(model_str=sb.model_to_string(num_iteration=max(sb.best_iteration, 1)))
        # 5. conformal calibration on validation
        mu_cal, sig_cal = self._mu_sigma(D_cal)
        self.conformal = ConformalQuantiles(LEVELS, log=True, min_group=p["min_group"])
        self.conformal.fit(np.exp(mu_cal), y_cal, [r.model for r in cal] if p["calibrate_by_model"] else None,
                           sig_cal)  # fmt: skip
        self.fit_info = {"rows": len(reqs), "prompts": len(texts), "calibration_rows": len(cal), "rounds": n_rounds,
                             "scale_rounds": self.scale_booster.num_trees() if self.scale_booster else 0,
                             "feature_seconds": round(t_feat, 2), "seconds": round(time.perf_counter() - t0, 2)}  # fmt: skip
        self.fitted = True
        return self

    # --- predict ----------------------------------------------------------------------------
    def _features(self, requests: Sequence[Request]) -> np.ndarray:
        text_idx: dict[str, int] = {}
        inv = np.array([text_idx.setdefault(r.prompt, len(text_idx)) for r in requests])
        texts = list(text_idx)
        ids, off = F.encode(texts)
        X = self.hasher.from_ids(ids, off)
        score = (X @ self.coef).astype(np.float64) + self.intercept
        return self._dense(score, self._project(X), np.diff(off), self._cues(texts), inv, requests,
                           self._extra(ids, off))  # fmt: skip

    def _mu_sigma(self, D: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        mu = self.booster.predict(D, num_threads=1)
        if self.scale_booster is None:
            return mu, np.ones_like(mu)
        sig = self.scale_booster.predict(np.column_stack([D, mu]), num_threads=1)
        return mu, np.maximum(sig, self.params["sigma_floor"])

    def predict(self, requests: Sequence[Request]) -> LengthEstimate:
        self.check_fitted()
        check_requests(requests, need_text=True)
        mu, sig = self._mu_sigma(self._features(requests))
        groups = [r.model for r in requests] if self.conformal.groups else None
        q = self.conformal.apply(np.exp(mu), groups, sig)
        return LengthEstimate(q, q[:, _MED], mu)

    # --- persistence ------------------------------------------------------------------------
    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays = {"coef": self.coef.astype(np.float32), "svd_cols": self.svd_cols.astype(np.int64),
                  "svd_comp": self.svd_comp.astype(np.float32), "model_stats": self.model_stats}  # fmt: skip
        if self.task_offsets is not None:
            arrays["task_stats"] = self.task_offsets.stats
        c_arrays, c_values = self.conformal.state()
        arrays.update(c_arrays)
        values = {"intercept": self.intercept, "models": self.models, "fit_info": self.fit_info,
                  "booster": self.booster.model_to_string(),
                  "scale_booster": self.scale_booster.model_to_string() if self.scale_booster else None,
                  **c_values}  # fmt: skip
        return arrays, values

    @classmethod
    def from_state(cls, params: dict[str, Any], arrays: dict[str, np.ndarray], values: dict[str, Any]) -> TextGBM:
        import lightgbm as lgb

        p = cls(**params)
        p.coef = arrays["coef"].astype(np.float32)
        p.intercept = float(values["intercept"])
        p.svd_cols = arrays["svd_cols"].astype(np.int64)
        p.svd_comp = arrays["svd_comp"].astype(np.float32)
        p.model_stats = np.asarray(arrays["model_stats"], dtype=float)
        p.models = list(values["models"])
        p.model_index = {m: i for i, m in enumerate(p.models)}
        p.task_offsets = TaskOffsets(p.models, arrays["task_stats"]) if "task_stats" in arrays else None
        p.fit_info = dict(values.get("fit_info", {}))
        p.booster = lgb.Booster(model_str=values["booster"])
        p.scale_booster = lgb.Booster(model_str=values["scale_booster"]) if values.get("scale_booster") else None
        p.conformal = ConformalQuantiles.from_state(arrays, values)
        return p
