"""The evaluation harness: fit predictors on one side of a prompt-disjoint split, score the other.

    splits = [castillo_view("in-dist"), castillo_view("cross-model")]
    result = evaluate(["model-median", "text-gbm"], splits)
    result.rows        # one dict per (view, predictor): every metric, timings, size on disk

Views on CASTILLO (each a `Split` of train / calibration / test request lists; no prompt is on
two sides, since CASTILLO's own splits are prompt-disjoint and the calibration carve is grouped
by `prompt_key`):

- `in-dist`: train = CASTILLO train + validate minus a seeded, prompt-grouped 25 % of validate;
  calibration = that 25 % (passed to `fit` as `validation`: early stopping, conformal);
  test = the test split (all 13 models, 7 prompt sets).
- `cross-model`: the same sets, train/calibration restricted to 9 models and test to the other
  4, `HELD_OUT_MODELS`: one from each family with more than one model (Qwen, Gemma, Llama,
  Mistral), each with a sibling left in training; Phi-4-mini, alone in its family, stays in.
- `cross-dataset`: train/calibration without ShareGPT (CASTILLO train has none anyway; it goes
  from validate), test = the ShareGPT rows of the test split (all 13 models).

Any file in the generic schema works too (`generic_split`): a seeded prompt-grouped split into
train / calibration / test fractions, or the file's own `split` column when every row has one.

Targets are `training_targets` (mean of a request's uncapped samples; samples ≥ `CAP` are
flagged and left out); requests with no usable target are not scored (`n_unlabelled`).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from presched.predict.base import PREDICTORS, Predictor, training_targets
from presched.predict.data import castillo_requests, prompt_key
from presched.predict.estimate import LengthEstimate
from presched.predict.metrics import score_all, ssjf_edges
from presched.workload.request import Request

DEFAULT = "text-gbm"
"""The predictor presched ships as its default."""
ANCHORS = ("s3", "ssjf", "listmle", "lexical-gbm", "encoder-l1")
"""Re-implementations of published predictors the default is compared with."""
BASELINES = ("global-median", "model-median", "linear-prompt")
OPTIONAL_MODULES = ("presched.predict.text_gbm", "presched.predict.text_gbm_static", "presched.predict.lexical_gbm",
                    "presched.predict.encoder")
"""Modules that register more predictors; imported when present (the encoder family needs torch)."""

VIEWS = ("in-dist", "cross-model", "cross-dataset")
HELD_OUT_MODELS = (
    "Qwen--Qwen2.5-14B-Instruct",
    "google--gemma-3-4b-it",
    "meta-llama--Llama-3.1-8B-Instruct",
    "mistralai--Mistral-7B-Instruct-v0.3",
)
"""Cross-model view: the 4 test models (one per multi-model family); the other 9 train."""
HELD_OUT_DATASET = "ShareGPT"
CALIBRATION_FRACTION = 0.25
"""Share of CASTILLO validate prompts held out of training for calibration / early stopping."""


@dataclass
class Split:
    """One view: what to fit on, what to calibrate on, what to score."""

    view: str
    train: list[Request]
    calibration: list[Request]
    test: list[Request]
    description: str = ""

    def sizes(self) -> dict[str, int]:
        return {"n_train": len(self.train), "n_calibration": len(self.calibration), "n_test": len(self.test)}


# --- predictors ---------------------------------------------------------------------------------
def discover_predictors() -> dict[str, str]:
    """Import the optional predictor modules so that they register; returns {module: reason}
    for those that could not be imported (absent, or a dependency such as torch missing)."""
    import importlib

    missing = {}
    for mod in OPTIONAL_MODULES:
        try:
            importlib.import_module(mod)
        except Exception as e:  # noqa: BLE001 - any import failure means "not available"
            missing[mod] = f"{type(e).__name__}: {e}"
    return missing


def ensure_registered(names: Sequence[str]) -> dict[str, str]:
    """Import the optional modules only if some of `names` is not registered yet (importing the
    encoder family loads torch, seconds); returns what could not be imported."""
    return {} if all(n in PREDICTORS for n in names) else discover_predictors()


def available_predictors(include_oracles: bool = False) -> list[str]:
    """Registered predictor names (after `discover_predictors`), default first, then anchors,
    then the rest; oracles (which read the labels) only when asked. Predictors that read the
    serving model (`probe`, `egtp`, `probe-refine`: its hidden states; `self-report`: its answers;
    `needs_serving_model`) are left out: text data has no such features; name them explicitly.
    So are those whose fitting needs a module not installed (`fit_requires`: text-gbm-static
    without the `static` extra), rather than listed to fail."""
    import importlib.util

    def installed(n: str) -> bool:  # `fit_requires`: modules fitting needs (an optional extra)
        return all(importlib.util.find_spec(m) is not None for m in getattr(PREDICTORS.get(n), "fit_requires", ()))

    names = [n for n in PREDICTORS.names() if (include_oracles or not getattr(PREDICTORS.get(n), "oracle", False))
             and not getattr(PREDICTORS.get(n), "needs_serving_model", False) and installed(n)]  # fmt: skip
    order = {n: i for i, n in enumerate((DEFAULT, *ANCHORS, *BASELINES))}
    return sorted(names, key=lambda n: (order.get(n, len(order)), n))


# --- splitting ----------------------------------------------------------------------------------
def group_split(requests: Sequence[Request], fraction: float, seed: int = 0) -> tuple[list[Request], list[Request]]:
    """(rest, part): `part` holds the requests of a seeded random `fraction` of the prompts
    (grouped by `prompt_key`, so a prompt's rows for every model stay together)."""
    if not 0 <= fraction < 1:
        raise ValueError(f"fraction: expected a number in [0, 1), got {fraction!r}")
    keys = sorted({prompt_key(r) for r in requests})
    rng = np.random.default_rng(seed)
    chosen = set(np.asarray(keys, dtype=object)[rng.permutation(len(keys))[: round(fraction * len(keys))]])
    part = [r for r in requests if prompt_key(r) in chosen]
    rest = [r for r in requests if prompt_key(r) not in chosen]
    return rest, part


def subsample(requests: Sequence[Request], n: int | None, seed: int = 0) -> list[Request]:
    """At most about `n` requests, whole prompts at a time in seeded random order (file order kept)."""
    if n is None or len(requests) <= n:
        return list(requests)
    by_key: dict[str, list[int]] = {}
    for i, r in enumerate(requests):
        by_key.setdefault(prompt_key(r), []).append(i)
    keys = sorted(by_key)
    rng = np.random.default_rng(seed)
    picked: list[int] = []
    for j in rng.permutation(len(keys)):
        if len(picked) >= n:
            break
        picked.extend(by_key[keys[j]])
    return [requests[i] for i in sorted(picked)]


@functools.lru_cache(maxsize=2)
def _castillo_all(path: str | None) -> tuple[Request, ...]:
    return tuple(castillo_requests(["train", "validate", "test"], path=path))


def castillo_view(view: str, seed: int = 0, quick: int | None = None, path: str | Path | None = None) -> Split:
    """One of `VIEWS` on CASTILLO (see the module doc). `quick=N` keeps about N requests in each
    of train, calibration and test (whole prompts, seeded) for a fast smoke run."""
    if view not in VIEWS:
        raise ValueError(f"view: expected one of {', '.join(VIEWS)}, got {view!r}")
    rows = _castillo_all(str(path) if path is not None else None)
    by_split: dict[str, list[Request]] = {"train": [], "validate": [], "test": []}
    for r in rows:
        by_split[r.metadata["split"]].append(r)
    validate_rest, calib = group_split(by_split["validate"], CALIBRATION_FRACTION, seed)
    train, test = by_split["train"] + validate_rest, by_split["test"]
    if view == "in-dist":
        desc = (f"train = CASTILLO train + 75% of validate prompts; calibration = the other 25% "
                f"(seed {seed}); test = CASTILLO test, all 13 models")  # fmt: skip
    elif view == "cross-model":
        held = set(HELD_OUT_MODELS)
        train = [r for r in train if r.model not in held]
        calib = [r for r in calib if r.model not in held]
        test = [r for r in test if r.model in held]
        desc = f"train/calibration on 9 models; test on {', '.join(m.split('--')[-1] for m in HELD_OUT_MODELS)}"
    else:
        train = [r for r in train if r.metadata.get("dataset") != HELD_OUT_DATASET]
        calib = [r for r in calib if r.metadata.get("dataset") != HELD_OUT_DATASET]
        test = [r for r in test if r.metadata.get("dataset") == HELD_OUT_DATASET]
        desc = f"train/calibration without {HELD_OUT_DATASET}; test = {HELD_OUT_DATASET} rows of CASTILLO test"
    if quick:
        train, calib, test = (subsample(x, quick, seed) for x in (train, calib, test))
        desc += f" [quick: ~{quick} requests per side]"
    return Split(view, train, calib, test, desc)


def generic_split(
    requests: Sequence[Request],
    test_fraction: float = 0.2,
    calibration_fraction: float = 0.1,
    seed: int = 0,
    view: str = "in-dist",
) -> Split:
    """Split a user's log (generic schema) prompt-disjointly: a seeded `test_fraction` of the
    prompts to test, then `calibration_fraction` of all prompts to calibration, the rest to
    train. If any row has a `split` value, the file's split is used instead (validate =
    calibration): every row's must then be train, validate or test, with train and test rows
    (ValueError naming field 'split' and the first bad value otherwise; a typo such as 'val'
    must not quietly turn the user's split into a random one)."""
    requests = list(requests)
    if not requests:
        raise ValueError("data: the file has no requests")
    if any(r.metadata.get("split") is not None for r in requests):
        return _own_split(requests, view)
    if not (0 < test_fraction < 1 and 0 <= calibration_fraction < 1 and test_fraction + calibration_fraction < 1):
        raise ValueError(f"test_fraction must be in (0, 1) and calibration_fraction in [0, 1), together "
                         f"below 1; got {test_fraction:g} and {calibration_fraction:g}")  # fmt: skip
    rest, test = group_split(requests, test_fraction, seed)
    train, calib = group_split(rest, calibration_fraction / (1 - test_fraction), seed + 1)
    if not train or not test:
        raise ValueError(f"data: {len(requests)} requests are too few to split into train and test")
    desc = (f"prompt-disjoint random split (seed {seed}): {1 - test_fraction - calibration_fraction:.0%} train, "
            f"{calibration_fraction:.0%} calibration, {test_fraction:.0%} test")  # fmt: skip
    return Split(view, train, calib, test, desc)


def _own_split(requests: list[Request], view: str) -> Split:
    """The file's `split` column as train / calibration (validate) / test."""
    sides: dict[str, list[Request]] = {"train": [], "validate": [], "test": []}
    for r in requests:
        s = r.metadata.get("split")
        if s not in sides:
            got = "no value" if s is None else repr(s)
            raise ValueError(f"data: field 'split': request {r.id!r} has {got}; when a row has a split, "
                             f"every row's must be one of train, validate, test")  # fmt: skip
        sides[s].append(r)
    for s in ("train", "test"):
        if not sides[s]:
            raise ValueError(f"data: field 'split': no row is {s!r}; the file's split needs train and "
                             f"test rows (validate is optional)")  # fmt: skip
    return Split(view, sides["train"], sides["validate"], sides["test"], "the file's own split column")


def check_labelled(requests: Sequence[Request], what: str) -> None:
    """A clear error when no request has an observed length to learn from / score against."""
    _, keep = training_targets(requests)
    if not keep.any():
        raise ValueError(f"{what}: no request has a usable output length (field 'output_tokens' or "
                         f"'output_samples', below {14_999} tokens)")  # fmt: skip


# --- running ------------------------------------------------------------------------------------
@dataclass
class Evaluation:
    rows: list[dict[str, Any]] = field(default_factory=list)
    arrays: dict[tuple[str, str], dict[str, np.ndarray]] = field(default_factory=dict)
    """(view, predictor) -> y, point, quantiles, rank, models of the scored test rows (for plots)."""
    splits: dict[str, dict[str, Any]] = field(default_factory=dict)


def _percentile(x: list[float], p: float) -> float:
    return float(np.percentile(x, p)) if x else float("nan")


def fresh(r: Request, nonce: int) -> Request:
    """The request with a unique line appended to its prompt, so that no cache keyed by the
    prompt text (e.g. an embedding cache) can answer it: latency must be the cost of a prompt
    the predictor has never seen. Requests without text are returned as they are."""
    if r.prompt is None:
        return r
    return dataclasses.replace(r, id=f"{r.id}~{nonce}", prompt=f"{r.prompt}\n[{nonce:08x}]")


def predict_timed(pred: Predictor, requests: Sequence[Request], *, batch_size: int = 64, batches: int = 10,
                  single_calls: int = 200, seed: int = 0) -> tuple[LengthEstimate, dict[str, float]]:  # fmt: skip
    """Predict all `requests` (in chunks of 256, for the accuracy metrics; not timed), then time
    on never-seen prompts (`fresh`, random test requests): `single_calls` one-request calls, and
    `batches` calls of `batch_size` requests (per-request time = call time / batch size).
    Returns the estimate and the latencies in ms per request (p50 / p99)."""
    requests = list(requests)
    est = LengthEstimate.concat([pred.predict(requests[i : i + 256]) for i in range(0, len(requests), 256)])
    rng = np.random.default_rng(seed)
    base = int.from_bytes(os.urandom(3), "big") << 8  # new per run: a disk cache of an earlier
    nonce = iter(range(base, base + (1 << 30)))  # run must not answer the timed prompts either
    pick = lambda k: [fresh(requests[i], next(nonce)) for i in rng.integers(0, len(requests), size=k)]
    pred.predict(pick(min(8, batch_size)))  # warm-up
    single = []
    for r in pick(single_calls):
        t0 = time.perf_counter()
        pred.predict([r])
        single.append((time.perf_counter() - t0) * 1000)
    per_req = []
    for _ in range(batches):
        chunk = pick(batch_size)
        t0 = time.perf_counter()
        pred.predict(chunk)
        per_req.append((time.perf_counter() - t0) * 1000 / len(chunk))
    return est, {
        "latency_single_p50_ms": _percentile(single, 50), "latency_single_p99_ms": _percentile(single, 99),
        "latency_batch_p50_ms": _percentile(per_req, 50), "latency_batch_p99_ms": _percentile(per_req, 99),
        "batch_size": batch_size, "batches": len(per_req), "single_calls": len(single),
    }  # fmt: skip


def size_on_disk(pred: Predictor) -> int | None:
    """Bytes of the saved `.npz` (None if the predictor cannot be saved)."""
    try:
        with tempfile.TemporaryDirectory() as d:
            return pred.save(Path(d) / "model.npz").stat().st_size
    except NotImplementedError:
        return None


def score_predictor(pred: Predictor, split: Split, edges: np.ndarray, *, batch_size: int = 64,
                    batches: int = 10, single_calls: int = 200, seed: int = 0) -> tuple[dict[str, Any], dict[str, np.ndarray]]:  # fmt: skip
    """Metrics, latencies and size of a fitted predictor on `split.test`, and the arrays to plot."""
    est, lat = predict_timed(pred, split.test, batch_size=batch_size, batches=batches,
                             single_calls=single_calls, seed=seed)
    row: dict[str, Any] = {**lat, "size_bytes": size_on_disk(pred)}
    row.update(score_all(est, split.test, edges))
    y, keep = training_targets(split.test)
    arrays = {"y": y[keep], "point": est.point[keep], "quantiles": est.quantiles[keep],
              "rank": est.rank_score[keep], "models": np.array([r.model for r in split.test])[keep]}  # fmt: skip
    return row, arrays


def evaluate(
    predictor_names: Sequence[str],
    splits: Sequence[Split],
    *,
    params: dict[str, dict[str, Any]] | None = None,
    batch_size: int = 64,
    batches: int = 10,
    single_calls: int = 200,
    seed: int = 0,
    on_step: Callable[[str], None] | None = None,
) -> Evaluation:
    """Fit every predictor on every split's train (with its calibration as `validation`),
    score it on the test side. A predictor that fails gets a row with `status` "error" and the
    message; the others go on. `on_step(label)` is called after each (view, predictor)."""
    result = Evaluation()
    for split in splits:
        for what, reqs in (("train", split.train), ("test", split.test)):
            check_labelled(reqs, f"{split.view} {what} set")
        y_train, keep = training_targets(split.train)
        edges = ssjf_edges(y_train[keep])
        result.splits[split.view] = {**split.sizes(), "description": split.description,
                                     "class_edges": edges.tolist()}  # fmt: skip
        for name in predictor_names:
            row: dict[str, Any] = {"view": split.view, "predictor": name, **split.sizes()}
            try:
                pred = PREDICTORS.create(name, **(params or {}).get(name, {}))
                t0 = time.perf_counter()
                pred.fit(split.train, validation=split.calibration or None)
                row["fit_s"] = time.perf_counter() - t0
                scored, arrays = score_predictor(pred, split, edges, batch_size=batch_size, batches=batches,
                                                 single_calls=single_calls, seed=seed)  # fmt: skip
                row.update(scored)
                row["status"] = "ok"
                result.arrays[(split.view, name)] = arrays
            except Exception as e:  # noqa: BLE001 - report and go on with the next predictor
                row["status"] = "error"
                row["error"] = f"{type(e).__name__}: {e}"
                row["traceback"] = traceback.format_exc(limit=6)
            result.rows.append(row)
            if on_step:
                on_step(f"{split.view} / {name}")
    return result


def evaluate_saved(pred: Predictor, requests: Sequence[Request], label: str, *, batch_size: int = 64,
                   batches: int = 10, single_calls: int = 200, seed: int = 0) -> Evaluation:  # fmt: skip
    """Score an already fitted (loaded) predictor on all of `requests`. Its training targets are
    unknown here, so SSJF's class edges come from the scored requests themselves."""
    check_labelled(requests, "data")
    split = Split("saved-model", [], [], list(requests), "all rows of the data, scored by a saved model")
    y, keep = training_targets(requests)
    edges = ssjf_edges(y[keep])
    result = Evaluation()
    result.splits[split.view] = {**split.sizes(), "description": split.description,
                                 "class_edges": edges.tolist(), "class_edges_from": "scored data"}  # fmt: skip
    row: dict[str, Any] = {"view": split.view, "predictor": label, **split.sizes()}
    scored, arrays = score_predictor(pred, split, edges, batch_size=batch_size, batches=batches,
                                     single_calls=single_calls, seed=seed)
    row.update(scored, status="ok")
    result.rows.append(row)
    result.arrays[(split.view, label)] = arrays
    return result
