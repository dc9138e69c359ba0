"""`PredictionsConfig` and `predictions_for`: where the length predictions of a simulated run
come from, for `presched bench` and `presched simulate` (and any driver that replays a workload).

    predictions: {source: model, path: text-gbm.npz}        # a predictor saved by `presched train`
    predictions: {source: noisy-oracle, sigma: 0.8}         # true lengths with log-normal error
    predictions: {source: prompt-oracle}                    # the prompt's other observed lengths
    predictions: {source: none}                             # no predictions (default)

Length-aware policies (sjf, srpt, rank, ...) need predictions; FCFS and the oracles do not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal, Sequence

from pydantic import Field, model_validator

from presched.config import Config
from presched.predict.estimate import LengthEstimate
from presched.workload.request import Request


class PredictionsConfig(Config):
    source: Literal["none", "model", "noisy-oracle", "prompt-oracle"] = Field(
        "none",
        description="Length predictions for policies and routers that use them: 'none'; 'model' "
        "(a predictor file saved by `presched train`, see path); 'noisy-oracle' (the true lengths "
        "with log-normal error sigma: a controlled-accuracy stand-in, not deployable); "
        "'prompt-oracle' (each request's distribution from the other lengths observed for its "
        "prompt, e.g. CASTILLO's 10 samples: the ceiling of a prompt-only predictor, not deployable).",
    )
    path: Path | None = Field(None, description="source 'model': the predictor file (.npz).")
    sigma: float = Field(
        0.0, ge=0, description="source 'noisy-oracle': log-scale error (0 = exact lengths; ~0.8-1.0 ranks like a good text predictor)."
    )
    seed: int = Field(0, ge=0, description="source 'noisy-oracle': seed of the error draws.")

    @model_validator(mode="after")
    def _consistent(self) -> "PredictionsConfig":
        if self.source == "model" and self.path is None:
            raise ValueError("path is required with source 'model' (a file from `presched train`)")
        if self.source != "model" and self.path is not None:
            raise ValueError(f"path is only used with source 'model' (source is {self.source!r})")
        return self


def predictions_for(requests: Sequence[Request], cfg: PredictionsConfig) -> LengthEstimate | None:
    """One row per request, in order, or None for source 'none'."""
    if cfg.source == "none":
        return None
    if cfg.source == "noisy-oracle":
        from presched.predict.noisy_oracle import noisy_oracle

        return noisy_oracle(requests, cfg.sigma, cfg.seed)
    if cfg.source == "prompt-oracle":
        from presched.predict.noisy_oracle import prompt_oracle

        return prompt_oracle(requests)
    from presched.predict.base import load_predictor
    from presched.predict.served_models import resolve_for

    pred = load_predictor(cfg.path)
    reqs, _ = resolve_for(pred, requests)  # an UnknownModelWarning per model it was not fitted on
    return pred.predict(reqs)
