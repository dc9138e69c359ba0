"""Fitted step-time model: DistServe's closed form, one linear formula per kind of step.

With P prefill tokens, `pairs` causal attention pairs of the prefill chunks, B decoding requests
and C their total context (tokens), all coefficients >= 0:

    step with any prefill (P > 0):
        t = a_prefill + b_prefill * P + c_prefill * (2 * pairs) + b_decode * C + c_decode * B
    decode-only step (P = 0):
        t = a_decode + b_decode * C + c_decode * B

Units: a_* seconds per step; b_prefill seconds per prefill token; c_prefill seconds per unit of
2 * pairs (a whole prompt of n tokens has 2 * pairs = n (n + 1), i.e. ~ seconds per token
squared, the quadratic attention cost); b_decode seconds per context token of a decoding
request (KV-cache reads); c_decode seconds per decoding request.

Mixed-step rule: a step that carries prefill pays the prefill intercept (not the decode one)
plus the decode requests' own per-context and per-request costs; the decode part is the same
line as in a decode-only step minus its intercept. `prefill_context` (KV reads of the chunks)
is not a separate term; for chunked prompts it grows with pairs and is folded into c_prefill.

The model is linear in C for fixed B everywhere, so `decode_line` is valid to infinity.

`FittedStepModel.fit(rows)` estimates the six coefficients from measured steps by non-negative
least squares on relative errors (each row weighted by 1 / seconds, which suits the reported
mean absolute percentage error); `fit_to(model, shapes)` does the same with another model's
predictions, e.g. to turn a roofline into this cheap, profile-shaped form.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
from pydantic import Field, ValidationError

from presched.config import Config, format_validation_error
from presched.sim.steptime.base import StepTimeModel


class FittedCoefficients(Config):
    """The six coefficients of the fitted step-time form (module docstring)."""

    a_prefill: float = Field(ge=0, description="Seconds per step that carries prefill.")
    b_prefill: float = Field(ge=0, description="Seconds per prefill token.")
    c_prefill: float = Field(
        ge=0, description="Seconds per unit of 2 * prefill attention pairs (~ per token squared)."
    )
    a_decode: float = Field(ge=0, description="Seconds per decode-only step.")
    b_decode: float = Field(
        ge=0, description="Seconds per context token of the decoding requests (KV reads)."
    )
    c_decode: float = Field(ge=0, description="Seconds per decoding request.")


COEFFICIENT_NAMES = tuple(FittedCoefficients.model_fields)


class StepSample(NamedTuple):
    """One measured (or modelled) step: its shape and its duration in seconds."""

    prefill_tokens: int
    prefill_pairs: float
    prefill_context: int
    num_decode: int
    decode_context: int
    seconds: float


class FitResult(NamedTuple):
    """What `fit` returns: the model and its mean absolute percentage error on the rows
    (a fraction: 0.05 = 5%)."""

    model: "FittedStepModel"
    mape: float


class FittedStepModel(StepTimeModel):
    """Closed-form step time with fitted coefficients; formulas in the module docstring."""

    def __init__(
        self,
        coefficients: FittedCoefficients | Mapping[str, float],
        source: str = "",
    ) -> None:
        if not isinstance(coefficients, FittedCoefficients):
            coefficients = FittedCoefficients.model_validate(dict(coefficients))
        self.coefficients = coefficients
        self.source = source
        c = coefficients
        self._ap, self._bp, self._cp = c.a_prefill, c.b_prefill, c.c_prefill
        self._ad, self._bd, self._cd = c.a_decode, c.b_decode, c.c_decode

    def step_time(
        self,
        prefill_tokens: int,
        prefill_pairs: float,
        prefill_context: int,
        num_decode: int,
        decode_context: int,
    ) -> float:
        decode = self._bd * decode_context + self._cd * num_decode
        if prefill_tokens > 0:
            return self._ap + self._bp * prefill_tokens + self._cp * 2 * prefill_pairs + decode
        return self._ad + decode

    def decode_line(self, num_decode: int, decode_context: int) -> tuple[float, float, float]:
        return self.step_time(0, 0, 0, num_decode, decode_context), self._bd, math.inf

    def describe(self) -> str:
        c = self.coefficients
        text = (
            f"fitted prefill {c.a_prefill * 1e3:.3g} ms + {c.b_prefill * 1e6:.3g} us/tok "
            f"+ {c.c_prefill * 1e9:.3g} ns/tok^2; decode {c.a_decode * 1e3:.3g} ms "
            f"+ {c.b_decode * 1e9:.3g} ns/ctx tok + {c.c_decode * 1e6:.3g} us/seq"
        )
        return f"{text} ({self.source})" if self.source else text

    # ---- saving and loading -------------------------------------------------------------

    def to_dict(self, **metadata: Any) -> dict[str, Any]:
        """JSON-ready: {"kind": "fitted", "coefficients": {...}, "units": {...}, "source": ...,
        plus any `metadata` given (e.g. mape, hardware, date)}."""
        out: dict[str, Any] = {
            "kind": "fitted",
            "coefficients": self.coefficients.model_dump(),
            "units": {
                "a_prefill": "s/step",
                "b_prefill": "s/prefill token",
                "c_prefill": "s/(2*attention pairs)",
                "a_decode": "s/step",
                "b_decode": "s/context token",
                "c_decode": "s/decoding request",
            },
            "source": self.source,
        }
        out.update(metadata)
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], where: str = "coefficients") -> "FittedStepModel":
        """Inverse of `to_dict`. Also accepts a flat mapping of the six coefficients. Other
        top-level keys (units, source, mape, ...) are kept only as `source`. Errors name
        `where` and the field."""
        if not isinstance(data, Mapping):
            raise ValueError(f"{where}: expected a JSON object, got {type(data).__name__}")
        if "kind" in data and data["kind"] != "fitted":
            raise ValueError(f"{where}.kind: expected 'fitted', got {data['kind']!r}")
        coefs = data.get("coefficients", None)
        if coefs is None:
            coefs = {k: v for k, v in data.items() if k in COEFFICIENT_NAMES}
            if not coefs:
                raise ValueError(
                    f"{where}: no 'coefficients' object and none of {', '.join(COEFFICIENT_NAMES)}"
                )
            where_c = where
        else:
            where_c = f"{where}.coefficients"
        try:
            parsed = FittedCoefficients.model_validate(coefs)
        except ValidationError as e:
            raise ValueError(format_validation_error(e, where_c)) from None
        return cls(parsed, source=str(data.get("source", "")))

    def save(self, path: str | Path, **metadata: Any) -> None:
        """Write `to_dict(**metadata)` as JSON to `path`."""
        Path(path).write_text(json.dumps(self.to_dict(**metadata), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "FittedStepModel":
        """Read a JSON file written by `save` (or any `from_dict` input); errors name the file."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise FileNotFoundError(f"coefficients file {str(path)!r} does not exist") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON ({e})") from None
        return cls.from_dict(data, where=str(path))

    # ---- fitting --------------------------------------------------------------------------

    @classmethod
    def fit(
        cls,
        rows: Iterable[StepSample | Sequence[float] | Mapping[str, float]],
        source: str = "fit",
    ) -> FitResult:
        """Least-squares fit of the six coefficients to measured steps.

        `rows`: StepSample tuples, 6-sequences in StepSample's order, or mappings with
        StepSample's field names. Needs at least one step with prefill, one decode-only step
        and six rows in all. Minimises sum(((pred - seconds) / seconds)^2) subject to all
        coefficients >= 0 (Lawson-Hanson NNLS). Returns FitResult(model, mape).
        """
        samples = [_as_sample(r, i) for i, r in enumerate(rows)]
        if len(samples) < len(COEFFICIENT_NAMES):
            raise ValueError(
                f"rows: need at least {len(COEFFICIENT_NAMES)} steps, got {len(samples)}"
            )
        arr = np.array([tuple(s) for s in samples], dtype=float)
        p, pairs, _, b, c, y = arr.T
        is_prefill = p > 0
        if not is_prefill.any():
            raise ValueError("rows: no step with prefill_tokens > 0; cannot fit the prefill terms")
        if is_prefill.all():
            raise ValueError("rows: no decode-only step (prefill_tokens == 0); cannot fit a_decode")
        design = np.column_stack(
            [is_prefill.astype(float), p, 2 * pairs, (~is_prefill).astype(float), c, b]
        )
        weights = 1.0 / y
        x = _nnls(design * weights[:, None], np.ones_like(y))
        model = cls(dict(zip(COEFFICIENT_NAMES, (float(v) for v in x))), source=source)
        pred = design @ x
        mape = float(np.mean(np.abs(pred - y) / y))
        return FitResult(model, mape)

    @classmethod
    def fit_to(
        cls,
        model: StepTimeModel,
        shapes: Iterable[Sequence[float]],
        source: str | None = None,
    ) -> FitResult:
        """Fit this form to another model's `step_time` over `shapes`, each a 5-tuple
        (prefill_tokens, prefill_pairs, prefill_context, num_decode, decode_context);
        `typical_shapes()` gives a realistic default set."""
        rows = []
        for shape in shapes:
            p, pairs, pc, b, c = shape
            rows.append(StepSample(p, pairs, pc, b, c, model.step_time(p, pairs, pc, b, c)))
        return cls.fit(rows, source=source if source is not None else f"fit to {model.describe()}")


def typical_shapes(
    max_batch: int = 256,
    max_prefill_tokens: int = 8192,
    max_context: int = 4096,
) -> list[tuple[int, float, int, int, int]]:
    """A deterministic grid of step shapes like vLLM's under chunked prefill: decode-only
    steps (B in 1..max_batch by powers of two, per-request context 128..max_context), prefill
    chunks of 64..max_prefill_tokens tokens after 0..max_context tokens of earlier context,
    and mixed steps (a chunk plus a decode batch). Returns 5-tuples in step_time's order."""
    batches = _powers_of_two(1, max_batch)
    contexts = [c for c in (128, 256, 512, 1024, 2048, 4096, 8192, 16384) if c <= max_context]
    chunks = _powers_of_two(64, max_prefill_tokens)
    befores = [0] + [c for c in (512, 2048, 8192) if c <= max_context]
    shapes: list[tuple[int, float, int, int, int]] = []
    for b in batches:
        for ctx in contexts:
            shapes.append((0, 0.0, 0, b, b * ctx))
    for chunk in chunks:
        for before in befores:
            pairs = chunk * (before + (chunk + 1) / 2)
            shapes.append((chunk, pairs, before + chunk, 0, 0))
            for b in batches[::2]:
                shapes.append((chunk, pairs, before + chunk, b, b * contexts[len(contexts) // 2]))
    return shapes


def _powers_of_two(lo: int, hi: int) -> list[int]:
    out, v = [], lo
    while v <= hi:
        out.append(v)
        v *= 2
    return out


def _as_sample(row: Any, i: int) -> StepSample:
    if isinstance(row, Mapping):
        missing = [f for f in StepSample._fields if f not in row]
        if missing:
            raise ValueError(f"rows[{i}]: missing field(s) {', '.join(missing)}")
        values = [row[f] for f in StepSample._fields]
    else:
        values = list(row)
        if len(values) != len(StepSample._fields):
            raise ValueError(
                f"rows[{i}]: expected {len(StepSample._fields)} values "
                f"({', '.join(StepSample._fields)}), got {len(values)}"
            )
    for name, v in zip(StepSample._fields, values):
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise ValueError(f"rows[{i}].{name}: got {v!r}, expected a number")
        if not math.isfinite(v) or v < 0:
            raise ValueError(f"rows[{i}].{name}: got {v!r}, expected a finite number >= 0")
    if not values[-1] > 0:
        raise ValueError(f"rows[{i}].seconds: got {values[-1]!r}, expected > 0")
    return StepSample(*values)


def _nnls(a: np.ndarray, y: np.ndarray, max_iter: int | None = None) -> np.ndarray:
    """min ||a x - y||_2 subject to x >= 0 (Lawson & Hanson 1974, active set). Columns are
    scaled to unit norm first for conditioning; all-zero columns get x = 0."""
    norms = np.linalg.norm(a, axis=0)
    scale = np.where(norms > 0, norms, 1.0)
    a = a / scale
    m, n = a.shape
    max_iter = max_iter if max_iter is not None else 3 * n + 30
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    tol = 10 * np.finfo(float).eps * max(m, n) * max(1.0, float(np.abs(a).sum(axis=0).max()))
    w = a.T @ (y - a @ x)
    for _ in range(max_iter):
        candidates = ~passive & (w > tol)
        if not candidates.any():
            break
        passive[np.argmax(np.where(candidates, w, -np.inf))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], y, rcond=None)[0]
            if (z[passive] > tol).all():
                break
            blocking = passive & (z <= tol)
            denom = x[blocking] - z[blocking]
            safe = np.where(denom > 0, denom, 1.0)
            alpha = float(np.min(np.where(denom > 0, x[blocking] / safe, 0.0)))
            x = x + alpha * (z - x)
            passive &= x > tol
            x[~passive] = 0.0
        x = z
        w = a.T @ (y - a @ x)
    return np.maximum(x, 0.0) / scale
