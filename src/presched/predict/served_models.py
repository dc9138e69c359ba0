"""Which served models a predictor was fitted on, and what happens to the others.

    known = ServedModels.of(pred)              # None: the predictor ignores the model
    reqs, unknown = known.resolve(requests)    # names matched to the fitted ones; the unseen ones
    resolve_for(pred, requests)                # the same, and one UnknownModelWarning per unseen model

Predictors condition on the served model (`Request.model`): text-gbm through the model's
verbosity offset and spread learnt in training, model-median and linear-prompt through a table
per model, the encoder family through a learnt model vector. A model name never seen in training
gets the predictor's **fallback** (`Predictor.unknown_model_fallback`, documented per predictor
in docs/predictors.md): text-gbm and lexical-gbm use the mean of the fitted models of the same
family (parsed from the name: llama, qwen, gemma, mistral, phi, ...), else of all fitted models;
the baselines their all-model row; the encoder family its "unknown model" slot. The ranking of
prompts for that model is still informed by the text; its length scale and the calibration of
its quantiles are not, so a fallback is a guess to be replaced by training on that model's
answers (`presched train --from-log`).

Names are matched canonically (`model_key`): case-insensitive, and the Hugging Face form
`org/name` equals CASTILLO's `org--name`, so `meta-llama/Llama-3.1-8B-Instruct` (what a client
sends to the gateway) is the model fitted as `meta-llama--Llama-3.1-8B-Instruct`.
"""

from __future__ import annotations

import dataclasses
import warnings
import weakref
from collections.abc import Sequence
from typing import Any

from presched.workload.request import Request


class UnknownModelWarning(UserWarning):
    """A request names a served model the predictor was not fitted on (it gets the fallback)."""


def model_key(name: str) -> str:
    """Canonical form of a served-model name: lower case, `org/name` as `org--name`."""
    return name.strip().lower().replace("/", "--")


@dataclasses.dataclass(frozen=True)
class ServedModels:
    """The fitted model names of one predictor, by canonical key."""

    by_key: dict[str, str]

    @classmethod
    def of(cls, pred: Any) -> ServedModels | None:
        """From `pred.known_models()`; None when the predictor does not condition on the model."""
        names = pred.known_models() if hasattr(pred, "known_models") else None
        return None if names is None else cls({model_key(n): n for n in names})

    def match(self, name: str) -> str | None:
        """The fitted name `name` stands for, or None if the predictor never saw it."""
        if name in self.by_key.values():
            return name
        return self.by_key.get(model_key(name))

    def resolve(self, requests: Sequence[Request]) -> tuple[list[Request], list[str]]:
        """(requests whose model names are replaced by the fitted spelling where they match,
        the distinct names that match no fitted model, in first-seen order)."""
        out, unknown, cache = [], {}, {}
        for r in requests:
            if r.model not in cache:
                cache[r.model] = self.match(r.model)
            hit = cache[r.model]
            if hit is None:
                unknown.setdefault(r.model, None)
                out.append(r)
            else:
                out.append(r if hit == r.model else dataclasses.replace(r, model=hit))
        return out, list(unknown)


_warned: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def fallback_note(pred: Any, model: str) -> str:
    """One sentence: what `pred` predicts for the unseen `model`."""
    how = pred.unknown_model_fallback(model) if hasattr(pred, "unknown_model_fallback") else "its model-independent estimate"
    named = getattr(pred, "base", pred)  # the online learner: the model it refits
    return (f"predictor {getattr(named, 'name', type(named).__name__)!r} was not fitted on served model "
            f"{model!r}; it uses {how}. Train on that model's answers (presched train --from-log) "
            f"before trusting its lengths and quantiles")  # fmt: skip


def resolve_for(pred: Any, requests: Sequence[Request]) -> tuple[list[Request], list[str]]:
    """`ServedModels.resolve` for `pred`, warning (`UnknownModelWarning`) once per predictor
    object and unseen model name. A predictor that ignores the model returns the requests as
    they are and no unknown names."""
    known = ServedModels.of(pred)
    if known is None:
        return list(requests), []
    reqs, unknown = known.resolve(requests)
    seen = _warned.setdefault(pred, set())
    for m in unknown:
        if m not in seen:
            seen.add(m)
            warnings.warn(fallback_note(pred, m), UnknownModelWarning, stacklevel=2)
    return reqs, unknown
