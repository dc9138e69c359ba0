"""Output-length predictors returning distributions (`LengthEstimate`), chosen by name."""

from presched.predict import baselines, lexical_gbm, probe, self_report, stack, text_gbm  # noqa: F401  (registers them)
from presched.predict.base import (
    CAP,
    PREDICTORS,
    ModelFileError,
    Predictor,
    load_predictor,
    predictor_class,
    training_targets,
)
from presched.predict.estimate import LEVELS, LengthEstimate, RequestEstimate

__all__ = ["CAP", "LEVELS", "PREDICTORS", "LengthEstimate", "ModelFileError", "Predictor",
           "RequestEstimate", "load_predictor", "predictor_class", "training_targets"]  # fmt: skip
