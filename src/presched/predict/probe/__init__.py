"""Predictors that read the serving model's own hidden states (issue 15): `probe` (mean-pooled
residual stream at a middle layer, sink tokens left out), `egtp` (entropy-weighted pool) and
`probe-refine` (the state at the g-th generated token: remaining length while decoding) and
`draft-probe` (a speculative-decoding draft model's pooled prompt state, OUTLETS).
Importing this package registers them and needs only numpy; `features` (the transformers
reference that computes the vectors) needs torch and is imported only when used.
"""

from presched.predict.probe.predictor import EGTP, DraftProbe, HiddenStateProbe, Probe
from presched.predict.probe.refine import ProbeRefine
from presched.predict.probe.spec import FeatureSpec

__all__ = ["EGTP", "DraftProbe", "FeatureSpec", "HiddenStateProbe", "Probe", "ProbeRefine"]
