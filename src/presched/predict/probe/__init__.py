"""Predictors that read the serving model's own hidden states (issue 15): `probe` (mean-pooled
residual stream at a middle layer, sink tokens left out) and `egtp` (entropy-weighted pool).
Importing this package registers both and needs only numpy; `features` (the transformers
reference that computes the vectors) needs torch and is imported only when used.
"""

from presched.predict.probe.predictor import EGTP, HiddenStateProbe, Probe
from presched.predict.probe.spec import FeatureSpec

__all__ = ["EGTP", "FeatureSpec", "HiddenStateProbe", "Probe"]
