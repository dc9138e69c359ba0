"""The prediction head shared by all encoder proxies, conditioned on the served model.

    vocab = ModelVocab.fit(["m1", "m2"])          # index 0 = "unknown" (unseen models)
    head = Head(out_dim=10, n_models=len(vocab))
    out = head(text_emb, vocab.index(models))      # (n, out_dim)

Network (SSJF's head, with the model identity fed in as a learned embedding instead of a one-hot):
[text embedding × sqrt(384) ‖ model embedding (16)] → Linear 128 → ReLU → Linear 128 → ReLU →
Linear out_dim. The text embedding is L2-normalised, so × sqrt(384) brings its coordinates to
about unit scale. During training a fraction `model_dropout` of rows see the "unknown" slot,
so that slot learns the all-model average and serves unseen models.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

UNKNOWN = "<unknown>"


class ModelVocab:
    def __init__(self, names: Sequence[str]) -> None:
        self.names = [UNKNOWN, *[n for n in names if n != UNKNOWN]]
        self._pos = {n: i for i, n in enumerate(self.names)}

    @classmethod
    def fit(cls, models: Sequence[str]) -> ModelVocab:
        return cls(sorted(set(models)))

    def index(self, models: Sequence[str]) -> np.ndarray:
        return np.array([self._pos.get(m, 0) for m in models], dtype=np.int64)

    def __len__(self) -> int:
        return len(self.names)


class Head(nn.Module):
    def __init__(self, out_dim: int, n_models: int, in_dim: int = 384, hidden: int = 128,
                 model_dim: int = 16, dropout: float = 0.1) -> None:  # fmt: skip
        super().__init__()
        self.scale = float(np.sqrt(in_dim))
        self.model_emb = nn.Embedding(n_models, model_dim)
        self.net = nn.Sequential(
            nn.Linear(in_dim + model_dim, hidden), nn.ReLU(), nn.Dropout(dropout),
            nn.Linear(hidden, hidden), nn.ReLU(), nn.Dropout(dropout),
            nn.Linear(hidden, out_dim),
        )  # fmt: skip

    def forward(self, emb: torch.Tensor, model_idx: torch.Tensor) -> torch.Tensor:
        return self.net(torch.cat([emb * self.scale, self.model_emb(model_idx)], dim=-1))
