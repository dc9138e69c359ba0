"""`ssjf`: SSJF's proxy-model length classifier (Qiu et al., AIOps'24, arXiv 2404.08509; repo
`James-QiuHaoran/LLM-serving-with-proxy-models`, task type 2) on all-MiniLM-L6-v2 (SSJF used
BERT-base).

5 percentile classes of the training lengths, cut at p25 / p50 / p75 / p99; cross-entropy
weighted by inverse class frequency (SSJF's weighted NLL), the weights undone at prediction
(`classify.py`) so the distribution stays calibrated. `predict_class` gives the 5-class label.
"""

from __future__ import annotations

from presched.predict.base import PREDICTORS
from presched.predict.encoder.buckets import percentile_edges
from presched.predict.encoder.classify import BucketClassifier


@PREDICTORS.register("ssjf")
class SSJF(BucketClassifier):
    name = "ssjf"

    @classmethod
    def extra_defaults(cls):
        return {"percentiles": [25, 50, 75, 99], "class_weight": "inverse"}

    def _edges(self, samples):
        return percentile_edges(samples, tuple(self.params["percentiles"]))
