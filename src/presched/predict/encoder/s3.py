"""`s3`: S3's output-length bucket classifier (Jin et al., NeurIPS 2023, arXiv 2306.06000) on
all-MiniLM-L6-v2 (S3 fine-tuned DistilBERT, which is not available offline).

10 equal-width length buckets [0, w), [w, 2w), ..., [9w, ∞) with w = `s3_upper` / 10
(default: the training samples' p99 rounded up to 100 tokens); cross-entropy classification
of the prompt (+ served model) into a bucket. See `classify.py` for the distribution, point and
rank score, `predictor.py` for the two-stage training.
"""

from __future__ import annotations

from presched.predict.base import PREDICTORS
from presched.predict.encoder.buckets import s3_edges
from presched.predict.encoder.classify import BucketClassifier


@PREDICTORS.register("s3")
class S3(BucketClassifier):
    name = "s3"

    @classmethod
    def extra_defaults(cls):
        return {"n_buckets": 10, "s3_upper": None, "class_weight": None}

    def _edges(self, samples):
        return s3_edges(samples, self.params["n_buckets"], self.params["s3_upper"])
