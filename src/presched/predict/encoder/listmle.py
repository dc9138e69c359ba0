"""`listmle`: the Learning-to-Rank proxy (Fu et al., NeurIPS 2024, arXiv 2408.15792; repo
`hao-ai-lab/vllm-ltr`) on all-MiniLM-L6-v2 (LTR used OPT-125m/350m).

The head outputs one score s per request, trained with ListMLE over lists of `list_size` (32)
requests drawn at random from the batch. For a list ordered by true length, longest first
(π; ties broken at random), the loss is the negative Plackett-Luce log-likelihood

    L(s, π) = Σ_i [ log Σ_{j ≥ i} exp(s_π(j)) − s_π(i) ]

(mean over lists). Labels are lengths in groups of `label_group` (10) tokens, as in LTR
(which scores short-first; here larger score = longer, matching `rank_score`).
Rank score = s. Quantiles and point: an isotonic map from score to length fitted on the
validation rows (`calibrate.ScoreMap`: equal-count score bins, per-bin sample quantiles and
median of mean lengths, made non-decreasing in score); point = the map's median length.
"""

from __future__ import annotations

import numpy as np
import torch

from presched.predict.base import PREDICTORS
from presched.predict.encoder.calibrate import ScoreMap
from presched.predict.encoder.predictor import EncoderPredictor, Rows
from presched.predict.estimate import LengthEstimate


def listmle_loss(
    scores: torch.Tensor, labels: torch.Tensor, gen: torch.Generator | None = None
) -> torch.Tensor:
    """ListMLE of one or more lists: scores, labels of shape (m,) or (lists, m); larger label =
    should rank first. Ties in labels are broken at random (with `gen`)."""
    if scores.dim() == 1:
        scores, labels = scores[None], labels[None]
    noise = torch.rand(labels.shape, generator=gen) * 1e-3  # < one label step: random tie order
    order = torch.argsort(labels + noise, dim=-1, descending=True)
    s = torch.gather(scores, -1, order)
    tail_lse = torch.logcumsumexp(s.flip(-1), dim=-1).flip(-1)
    return (tail_lse - s).sum(-1).mean()


@PREDICTORS.register("listmle")
class ListMLE(EncoderPredictor):
    name = "listmle"
    loss_name = "listmle"

    @classmethod
    def extra_defaults(cls):
        return {"list_size": 32, "label_group": 10, "map_bins": 50}

    def _out_dim(self) -> int:
        return 1

    def _targets(self, rows: Rows) -> np.ndarray:
        return np.floor(rows.y / self.params["label_group"])[:, None]

    def _loss(self, out, tgt, gen=None):
        """Lists of `list_size` rows drawn at random from the batch (a short remainder list is
        kept if it has >= 2 rows)."""
        n, m = out.shape[0], self.params["list_size"]
        perm = torch.randperm(n, generator=gen)
        s, y = out[perm, 0], tgt[perm, 0]
        full = (n // m) * m
        parts = []
        if full:
            parts.append(
                listmle_loss(s[:full].view(-1, m), y[:full].view(-1, m), gen) * (full // m)
            )
        if n - full >= 2:
            parts.append(listmle_loss(s[full:], y[full:], gen))
        count = full // m + (1 if n - full >= 2 else 0)
        return torch.stack(parts).sum() / max(count, 1)

    def _calibrate(self, out, rows, model_idx):
        self.map = ScoreMap.fit(out[:, 0], rows.samples, rows.y, self.params["map_bins"])

    def _estimate(self, out, model_idx):
        q, point = self.map(out[:, 0])
        return LengthEstimate(q, point, out[:, 0])

    def _extra_state(self):
        return {"centres": self.map.centres, "table": self.map.table, "point": self.map.point}, {}

    def _load_extra(self, arrays, values):
        self.map = ScoreMap(arrays["centres"], arrays["table"], arrays["point"])
