"""Length predictions for requests inside the engine: from the request, else from a predictor.

A request may carry its prediction in `vllm_xargs` (the OpenAI body's vLLM extension, which
reaches the engine as `sampling_params.extra_args`):

    "vllm_xargs": {"presched_quantiles": [q10, q20, ..., q90, q95, q99],   # 11 numbers, tokens
                   "presched_point": 180}                                    # optional
    "vllm_xargs": {"presched_pred_mean": 180.0, "presched_pred_q90": 420.0}  # what `presched
                                                                             # serve` sends today

The first is the full `LengthEstimate` row (at `predict.estimate.LEVELS`). The second (mean and,
optionally, q90) becomes a log-normal with that mean and q90 (sigma 1 without q90; a q90 at or
below the mean, a heavy tail, gets sigma > 2.56). Values that are not finite positive numbers
make the request count as having no prediction (`bad_xargs` in the plugin's counters); the
request is still served.

Without one, the predictor given at start (`PluginConfig.predictor`, e.g. text-gbm from
`presched train`) predicts from the prompt text, decoded from the prompt token ids with the
served model's tokenizer. Progressive refinement needs nothing here: policies read
E[L - g | L > g] (and quantiles of L - g) off the estimate as `seq.generated` grows.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import numpy as np

from presched.predict.estimate import LEVELS, RequestEstimate
from presched.xargs import MEAN as XARG_MEAN
from presched.xargs import POINT as XARG_POINT
from presched.xargs import Q90 as XARG_Q90
from presched.xargs import QUANTILES as XARG_QUANTILES

log = logging.getLogger(__name__)

_Z = {0.1: -1.2816, 0.2: -0.8416, 0.3: -0.5244, 0.4: -0.2533, 0.5: 0.0, 0.6: 0.2533,
      0.7: 0.5244, 0.8: 0.8416, 0.9: 1.2816, 0.95: 1.6449, 0.99: 2.3263}  # fmt: skip
_MAX_TOKENS = 1e7


class BadPrediction(ValueError):
    """A prediction in vllm_xargs that cannot be used; the message names the field."""


def _num(field: str, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise BadPrediction(f"vllm_xargs.{field}: expected a number, got {v!r}")
    try:
        x = float(v)
    except ValueError:
        raise BadPrediction(f"vllm_xargs.{field}: expected a number, got {v!r}") from None
    if not (math.isfinite(x) and 0 < x <= _MAX_TOKENS):
        raise BadPrediction(f"vllm_xargs.{field}: expected a number in (0, {_MAX_TOKENS:g}], got {v!r}")
    return x


def lognormal_quantiles(mean: float, q90: float | None) -> list[float]:
    """Quantiles at LEVELS of the log-normal with this mean and q90: the smaller of the two
    sigmas that fit when q90 > mean, the only positive one (> 2.5632, a heavy tail) when
    q90 <= mean. Without q90: sigma 1. A q90 above mean * e^0.821, the largest any log-normal
    of this mean has, gets that largest (sigma 1.2816)."""
    sigma = 1.0
    if q90 is not None:
        d = math.log(q90 / mean)  # = 1.2816 sigma - sigma^2 / 2
        disc = 1.2816**2 - 2 * d
        if disc < 0:
            sigma = 1.2816
        else:  # roots 1.2816 -/+ sqrt(disc); the smaller is <= 0 when q90 <= mean
            r = math.sqrt(disc)
            sigma = 1.2816 - r if 1.2816 - r > 0 else 1.2816 + r
        sigma = max(sigma, 1e-3)
    mu = math.log(mean) - sigma**2 / 2
    return [math.exp(mu + sigma * _Z[p]) for p in LEVELS]


def from_xargs(xargs: dict) -> RequestEstimate | None:
    """The prediction a request carries (module doc), None if it carries none; BadPrediction
    if it carries a broken one."""
    if XARG_QUANTILES in xargs:
        q = xargs[XARG_QUANTILES]
        if not isinstance(q, (list, tuple)) or len(q) != len(LEVELS):
            raise BadPrediction(f"vllm_xargs.{XARG_QUANTILES}: expected a list of {len(LEVELS)} numbers "
                                f"(quantiles at {', '.join(f'{p:g}' for p in LEVELS)}), got {q!r}")  # fmt: skip
        qs = np.maximum.accumulate([_num(f"{XARG_QUANTILES}[{i}]", v) for i, v in enumerate(q)])
        point = _num(XARG_POINT, xargs[XARG_POINT]) if XARG_POINT in xargs else float(qs[LEVELS.index(0.5)])
        return RequestEstimate(np.maximum(qs, 1.0), max(point, 1.0), point)
    if XARG_MEAN in xargs:
        mean = _num(XARG_MEAN, xargs[XARG_MEAN])
        q90 = _num(XARG_Q90, xargs[XARG_Q90]) if XARG_Q90 in xargs else None
        qs = np.maximum.accumulate(np.maximum(lognormal_quantiles(mean, q90), 1.0))
        return RequestEstimate(qs, max(mean, 1.0), mean)
    return None


class EnginePredictor:
    """A presched predictor loaded in the engine process, fed the prompt text decoded from the
    request's token ids (the engine core never sees the text itself)."""

    def __init__(self, path: Path, tokenizer: str, model_name: str) -> None:
        from presched.predict.base import load_predictor

        from presched.predict.served_models import ServedModels, fallback_note

        self.predictor = load_predictor(path)
        known = ServedModels.of(self.predictor)
        matched = known.match(model_name) if known is not None else model_name
        if matched is None:
            log.warning("presched: %s", fallback_note(self.predictor, model_name))
        self.model_name = matched or model_name  # the fitted spelling when it is a known model
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(tokenizer)
        self.predict("presched-warm-up", self.tokenizer.encode("warm up"))  # lazy imports, caches
        log.info("presched: predictor %s loaded from %s (tokenizer %s)",
                 self.predictor.name, path, tokenizer)  # fmt: skip

    def predict(self, request_id: str, prompt_token_ids) -> RequestEstimate:
        from presched.workload.request import Request

        ids = list(prompt_token_ids or ())
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        r = Request(id=request_id, prompt_tokens=max(len(ids), 1), prompt=text,
                    model=self.model_name)  # fmt: skip
        return self.predictor.predict([r])[0]
