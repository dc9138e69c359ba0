"""`encoder-l1`: SSJF's regression proxy (task type 0, L1 loss; Qiu et al., arXiv 2404.08509) on
all-MiniLM-L6-v2, predicting log length (`log_target=True`, default) or length.

Loss: mean |f(x) − log y| over training rows (y = the request's mean uncapped length), so
exp(f(x)) estimates the conditional median of y: point = exp(f(x)), rank score = f(x).
Quantiles: split conformal on the validation rows. Residuals r = log(sample) − f(x) over every
observed sample; per served model (pooled when a model has < 200 residuals) the empirical
r-quantiles at each level; q_j = exp(f(x) + r_j). With `log_target=False` everything is
additive in tokens instead.
"""

from __future__ import annotations

import numpy as np
import torch

from presched.predict.base import PREDICTORS
from presched.predict.encoder.calibrate import conformal_offsets
from presched.predict.encoder.predictor import EncoderPredictor, Rows
from presched.predict.estimate import LengthEstimate


@PREDICTORS.register("encoder-l1")
class EncoderL1(EncoderPredictor):
    name = "encoder-l1"
    loss_name = "l1"

    @classmethod
    def extra_defaults(cls):
        # the L1 loss is the MAE-relevant criterion and keeps improving for ~20 epochs
        return {"log_target": True, "early_stop": "loss"}

    def _f(self, x: np.ndarray) -> np.ndarray:
        return np.log(np.maximum(x, 1.0)) if self.params["log_target"] else x

    def _finv(self, z: np.ndarray) -> np.ndarray:
        return np.exp(z) if self.params["log_target"] else z

    def _init_head(self, rows: Rows) -> None:
        # the output bias starts at the median target (faster, steadier start)
        with torch.no_grad():
            self.head.net[-1].bias.fill_(float(np.median(self._f(rows.y))))

    def _out_dim(self) -> int:
        return 1

    def _targets(self, rows: Rows) -> np.ndarray:
        return self._f(rows.y)[:, None]

    def _loss(self, out, tgt, gen=None):
        return (out - tgt).abs().mean()

    def _calibrate(self, out, rows, model_idx):
        pred = out[:, 0]
        resid = self._f(rows.samples) - pred[:, None]
        groups = np.broadcast_to(model_idx[:, None], resid.shape)
        self.offsets = conformal_offsets(resid.reshape(-1), groups.reshape(-1), len(self.vocab))

    def _estimate(self, out, model_idx):
        z = out[:, 0]
        q = self._finv(z[:, None] + self.offsets[model_idx])
        return LengthEstimate(q, self._finv(z), z)

    def _extra_state(self):
        return {"offsets": self.offsets}, {}

    def _load_extra(self, arrays, values):
        self.offsets = arrays["offsets"]
