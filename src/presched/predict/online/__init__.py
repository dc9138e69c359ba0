"""Online learning: a wrapper that makes any presched predictor learn from the requests it
served (censoring-aware conformal recalibration, a drift alarm, background refits; see
docs/predictors/online.md)."""

from presched.predict.online.calibrate import OnlineConformal, km_quantiles
from presched.predict.online.config import OnlineConfig
from presched.predict.online.drift import DriftAlarm, pit
from presched.predict.online.learner import OnlineLearner

__all__ = ["DriftAlarm", "OnlineConfig", "OnlineConformal", "OnlineLearner", "km_quantiles", "pit"]
