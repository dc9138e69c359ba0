"""The predictor interface.

    pred = PREDICTORS.create("text-gbm")
    pred.fit(train_requests, validation=calib_requests)   # who: `presched train`, benchmarks
    est = pred.predict(requests)                          # batch-first: one LengthEstimate row each
    pred.save("model.npz"); same = load_predictor("model.npz")

What a predictor may read of a `Request`: `prompt` (text; may be None for trace-only data),
`prompt_tokens`, `model` (the served model: one predictor serves many models, conditioned on it),
`tenant`, `max_tokens`, `metadata`. It must never read `output_tokens` / `output_samples` in
`predict`: those are the labels, read only by `fit` through `training_targets`. A predictor that
cannot predict a request without prompt text says so (`needs_text = True`; `check_requests(...,
need_text=True)` raises on such a request): the gateway and the endpoint picker read it
(`reads_text`) and refuse a request without text (`has_text`) with 400 before predicting it.

Saved models are a single `.npz` file (numpy arrays + one JSON header, no pickle): the header
names the predictor, its parameters and `FORMAT_VERSION`; loading a file of another format
version, or of an unknown predictor, is refused with a clear error.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar, Sequence

import numpy as np

from presched import __version__
from presched.predict.estimate import LengthEstimate
from presched.registry import Registry
from presched.workload.request import Request

FORMAT_VERSION = 2  # 2: text-gbm reads case-kept n-grams, bytes-level cues (v1 files would mis-predict)
CAP = 14_999
"""Samples at or above this many tokens hit CASTILLO's generation cap (degenerate runs): they
are flagged and left out of training targets."""


class ModelFileError(ValueError):
    """A saved predictor file that cannot be loaded (missing, corrupt, other format version)."""


_KINDS = ((bool, "true or false"), (int, "an integer"), (float, "a number"), (str, "a string"),
          (list, "a list"))


def checked_params(name: str, defaults: dict[str, Any], given: dict[str, Any],
                   nullable: Sequence[str] = ()) -> dict[str, Any]:  # fmt: skip
    """`defaults` updated with `given`, each given value of its default's kind (an integer where
    the default is one, a number for a float; a default of None, and the `nullable` names, also
    take null). ValueError naming the predictor and the parameter otherwise, so `--param
    max_rounds=abc` is refused before any fitting instead of failing inside LightGBM."""
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        known = f"; known: {sorted(defaults)}" if defaults else " (it takes no parameters)"
        raise ValueError(f"{name}: unknown parameter(s) {unknown}{known}")
    for key, value in given.items():
        default = defaults[key]
        if default is None or (value is None and key in nullable):
            continue
        kind, what = next(((k, w) for k, w in _KINDS if isinstance(default, k)), (None, ""))
        if kind is None:
            continue
        accepted = (int, float) if kind is float else kind
        if not isinstance(value, accepted) or (kind is not bool and isinstance(value, bool)):
            raise ValueError(f"{name}: parameter {key!r} must be {what}, got {value!r}")
    return {**defaults, **given}


def check_ranges(name: str, params: dict[str, Any], ranges: dict[str, tuple[float, float, bool]]) -> None:
    """ValueError naming the predictor and the parameter unless each `params[key]` lies in
    `ranges[key] = (lo, hi, lo_open)`: lo <= value <= hi (lo < value when `lo_open`), so a
    value a library would refuse deep inside `fit` (or quietly replace) is refused up front."""
    for key, (lo, hi, lo_open) in ranges.items():
        v = params[key]
        if v is None:
            continue
        if not (lo < v if lo_open else lo <= v) or not v <= hi:
            interval = f"{'(' if lo_open else '['}{lo:g}, {hi:g}]"
            raise ValueError(f"{name}: parameter {key!r} must be in {interval}, got {v!r}")


class Predictor(ABC):
    name: ClassVar[str] = "base"
    oracle: ClassVar[bool] = False
    needs_text: ClassVar[bool] = False
    """True: `predict` raises on a request without prompt text (`has_text` false)."""

    def __init__(self, **params: Any) -> None:
        self.params = params
        self.fitted = False

    @abstractmethod
    def fit(self, requests: Sequence[Request], validation: Sequence[Request] | None = None) -> "Predictor":
        """Learn from requests with known lengths (`training_targets`). `validation` (optional,
        disjoint prompts) is for early stopping and conformal calibration. Returns self."""

    @abstractmethod
    def predict(self, requests: Sequence[Request]) -> LengthEstimate:
        """One distribution per request, in order. Must not read the requests' lengths."""

    # --- served models (presched.predict.served_models) ----------------------------------------
    def known_models(self) -> list[str] | None:
        """The served-model names this predictor was fitted on, or None if it does not
        condition on the model (then no model is "unknown" to it)."""
        return None

    def unknown_model_fallback(self, model: str) -> str:
        """What it predicts for a served model it was not fitted on (a phrase for warnings)."""
        return "its estimate pooled over all the models it was fitted on"

    def front_refusal(self) -> str | None:
        """Why this predictor cannot serve behind the gateway or the endpoint picker (they hand
        it a request's prompt text only, never the engine's hidden states), or None when it can.
        Both refuse such a file at start, naming `predictor`, instead of a 500 per request."""
        return None

    # --- persistence: subclasses provide their state as arrays + JSON-able values -------------
    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        """(arrays, json_values) that `from_state` turns back into an equal predictor."""
        raise NotImplementedError(f"{self.name} cannot be saved")

    @classmethod
    def from_state(cls, params: dict[str, Any], arrays: dict[str, np.ndarray], values: dict[str, Any]) -> "Predictor":
        raise NotImplementedError(f"{cls.name} cannot be loaded")

    def save(self, path: str | Path) -> Path:
        if not self.fitted:
            raise ValueError(f"{self.name}: fit it before saving")
        arrays, values = self.state()
        header = {"format": FORMAT_VERSION, "presched": __version__, "predictor": self.name,
                  "params": self.params, "values": values}  # fmt: skip
        path = Path(path)
        if path.suffix != ".npz":
            path = path.with_suffix(".npz")
        path.parent.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(path, __header__=np.array(json.dumps(header)), **arrays)
        return path

    def check_fitted(self) -> None:
        if not self.fitted:
            raise ValueError(f"{self.name}: call fit() (or load a saved model) before predict()")


PREDICTORS: Registry[Predictor] = Registry("predictor")

LAZY_MODULES = ("presched.predict.text_gbm_static", "presched.predict.encoder")
"""Predictors registered on first use: the encoder family imports heavy libraries (torch), and
text-gbm-static is left out of `presched.predict`'s own imports (its fitting needs the `static`
extra). `predictor_class` (so `load_predictor` and `stack`'s members) imports them when a name
is not registered yet."""


def predictor_class(name: str) -> type[Predictor]:
    """The registered class called `name`, importing the lazy families if needed (an
    `UnknownNameError` lists the known names, or says which extra to install)."""
    if name not in PREDICTORS:
        import importlib

        for mod in LAZY_MODULES:
            try:
                importlib.import_module(mod)
            except ImportError as e:
                if name in ("s3", "ssjf", "encoder-l1", "listmle"):
                    raise ValueError(f"predictor {name!r} needs the encoder extra "
                                     f"(pip install 'presched[encoder]'): {e}") from None  # fmt: skip
    return PREDICTORS.get(name)  # type: ignore[return-value]


def load_predictor(path: str | Path) -> Predictor:
    """Load any saved predictor; refuses files of another format version clearly."""
    path = Path(path)
    if not path.exists():
        raise ModelFileError(f"model file not found: {path}")
    try:
        with np.load(path, allow_pickle=False) as z:
            header = json.loads(str(z["__header__"]))
            arrays = {k: z[k] for k in z.files if k != "__header__"}
    except (OSError, ValueError, KeyError):  # numpy's reasons (zip, pickles) say nothing useful here
        raise ModelFileError(f"{path}: not a presched model file (expected the .npz that "
                             "`presched train` writes)") from None
    fmt = header.get("format")
    if fmt != FORMAT_VERSION:
        raise ModelFileError(
            f"{path}: model file format {fmt} (written by presched {header.get('presched')}); "
            f"this presched ({__version__}) reads format {FORMAT_VERSION}: retrain with "
            f"`presched train`"
        )
    cls = predictor_class(header["predictor"])
    pred = cls.from_state(header.get("params", {}), arrays, header.get("values", {}))
    pred.fitted = True
    return pred


# --- labels -------------------------------------------------------------------------------------
def request_samples(r: Request) -> np.ndarray:
    """All observed lengths of a request (its samples, else its one output), capped ones removed:
    at CASTILLO's generation cap, or at the request's own `max_tokens` (cut there, so only a lower
    bound, as `presched train --from-log` treats a `length` finish). Rows a log reader already
    judged (`metadata["censored"]`: it knew the finish reason, and kept a cut row only when
    asked to, `--keep-censored`) are taken as it left them."""
    s = np.asarray(r.output_samples if r.output_samples else
                   ([r.output_tokens] if r.output_tokens is not None else []), dtype=float)  # fmt: skip
    s = s[s < CAP]
    return s if r.max_tokens is None or "censored" in r.metadata else s[s < r.max_tokens]


def training_targets(requests: Sequence[Request]) -> tuple[np.ndarray, np.ndarray]:
    """(target, keep): target = mean of a request's uncapped observed lengths; keep = False for
    requests with no usable label (all samples capped, or none), which `fit` must skip."""
    t = np.full(len(requests), np.nan)
    for i, r in enumerate(requests):
        s = request_samples(r)
        if s.size:
            t[i] = s.mean()
    return t, np.isfinite(t)


def has_text(prompt: str | None) -> bool:
    """Whether a prompt has text a text predictor can read (not None, not only whitespace)."""
    return prompt is not None and bool(prompt.strip())


def reads_text(pred: Any) -> bool:
    """Whether `pred` needs prompt text (`Predictor.needs_text`); a wrapper that is no
    `Predictor` (the online learner) answers for the model it wraps (its `base`)."""
    if isinstance(pred, Predictor):
        return pred.needs_text
    base = getattr(pred, "base", None)
    return reads_text(base) if base is not None and base is not pred else False


def check_requests(requests: Sequence[Request], need_text: bool = False) -> None:
    """Clear errors for input a predictor cannot use (empty batch, missing prompt text)."""
    if len(requests) == 0:
        raise ValueError("requests: empty")
    if need_text:
        for r in requests:
            if not has_text(r.prompt):
                raise ValueError(f"request {r.id!r}: field 'prompt' is empty; this predictor reads prompt text")
