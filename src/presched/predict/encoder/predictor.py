"""`EncoderPredictor`: the shared body of the encoder proxies (S3, SSJF, L1 regression, ListMLE).

A subclass supplies the head's task: `_setup` (e.g. bucket edges from the training lengths),
`_out_dim`, `_targets` (per-row training targets), `_loss`, `_calibrate` (on validation outputs)
and `_estimate` (head outputs -> `LengthEstimate`), plus `_extra_state` / `_load_extra`.

Training (`fit`), per the SSJF recipe (fine-tune, then freeze the encoder):
1. stage 1 (`finetune_epochs` > 0): the encoder and the head train together on unique training
   prompts, `finetune_batch` prompts per step, each prompt's rows (one per served model) sharing
   its embedding; AdamW, encoder lr `finetune_lr`, head lr `head_lr`, linear warm-up (6 %) and
   decay; stopped early after `finetune_max_seconds`.
2. stage 2: the encoder is frozen; all prompts are embedded once (through the cache: the key
   holds the encoder fingerprint, so fine-tuned embeddings are distinct) and the head trains on
   those embeddings for up to `head_epochs` epochs, keeping the epoch with the best validation
   Kendall tau-b of rank score vs length (`early_stop="tau"`, default; "loss": the validation
   loss), patience `patience`. (On CASTILLO the validation loss of every head bottoms out after
   1 epoch while its ranking keeps improving for 10–30 epochs.)
3. calibration on the validation rows (`validation`, else a prompt-disjoint `calib_fraction` of
   the training prompts held out from training).

Rows: one per request with a usable label (`training_targets`): its prompt, served model, target
(mean of uncapped samples) and all uncapped samples (NaN-padded).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from presched.predict.base import Predictor, check_ranges, check_requests, checked_params, request_samples, training_targets
from presched.predict.data import prompt_key
from presched.predict.encoder.embed import PRETRAINED, EmbeddingCache, MiniLMEncoder, embed_texts
from presched.predict.encoder.head import Head, ModelVocab
from presched.predict.estimate import LengthEstimate
from presched.workload.request import Request

DEFAULTS: dict[str, Any] = {
    "max_length": 256,  # encoder tokens per prompt (head + tail kept when longer)
    "truncation": "head_tail",
    "embed_batch": 32,
    "finetune_epochs": 1.0,  # stage 1: epochs over unique training prompts (0 = off)
    "finetune_max_seconds": 240.0,  # stage 1 wall-clock cap (None = no cap)
    "finetune_lr": 2e-5,
    "finetune_batch": 16,  # prompts per stage-1 step
    "head_lr": 3e-4,
    "head_epochs": 40,
    "head_batch": 256,
    "patience": 5,
    "early_stop": "tau",  # stage 2 keeps the epoch with the best validation tau-b ("loss": loss)
    "weight_decay": 0.01,
    "hidden": 128,
    "model_dim": 16,
    "dropout": 0.3,
    "model_dropout": 0.1,  # share of training rows that see the "unknown model" slot
    "calib_fraction": 0.2,  # held out of training when no validation set is given
    "seed": 0,
    "num_threads": 1,
    "cache_dir": None,  # embedding cache folder (None: $PRESCHED_CACHE_DIR or ~/.cache/presched)
    "disk_cache": True,
}
INF = float("inf")
RANGES = {  # (lo, hi, lo excluded): checked at construction (base.check_ranges), naming the parameter
    "max_length": (8, 512, False), "embed_batch": (1, 4096, False), "finetune_epochs": (0, 100, False),
    "finetune_max_seconds": (0, 1e7, True), "finetune_lr": (0, 1, True), "finetune_batch": (1, 4096, False),
    "head_lr": (0, 1, True), "head_epochs": (1, 10_000, False), "head_batch": (1, 1 << 16, False),
    "patience": (1, 10_000, False), "weight_decay": (0, 1, False), "hidden": (1, 4096, False),
    "model_dim": (1, 1024, False), "dropout": (0, 0.99, False), "model_dropout": (0, 1, False),
    "calib_fraction": (0, 0.9, True), "num_threads": (1, 256, False),
}  # fmt: skip


@dataclass
class Rows:
    texts: list[str]  # unique prompt texts
    text_idx: np.ndarray  # (n,) into texts
    models: list[str]
    y: np.ndarray  # (n,) mean uncapped length
    samples: np.ndarray  # (n, S) uncapped samples, NaN-padded

    def __len__(self) -> int:
        return len(self.y)

    def take(self, mask: np.ndarray) -> Rows:
        keep_text = np.unique(self.text_idx[mask])
        remap = np.full(len(self.texts), -1)
        remap[keep_text] = np.arange(len(keep_text))
        return Rows([self.texts[i] for i in keep_text], remap[self.text_idx[mask]],
                    [m for m, k in zip(self.models, mask) if k], self.y[mask], self.samples[mask])  # fmt: skip


def make_rows(requests: Sequence[Request]) -> tuple[Rows, list[str]]:
    """Labelled rows (unlabelled requests dropped) and their prompt keys."""
    y, keep = training_targets(requests)
    reqs = [r for r, k in zip(requests, keep) if k]
    if not reqs:
        raise ValueError(
            "requests: none has a usable output length (output_tokens / output_samples)"
        )
    samples = [request_samples(r) for r in reqs]
    width = max(len(s) for s in samples)
    pad = np.full((len(reqs), width), np.nan)
    for i, s in enumerate(samples):
        pad[i, : len(s)] = s
    texts = list(dict.fromkeys(r.prompt for r in reqs))
    pos = {t: i for i, t in enumerate(texts)}
    rows = Rows(
        texts, np.array([pos[r.prompt] for r in reqs]), [r.model for r in reqs], y[keep], pad
    )
    return rows, [prompt_key(r) for r in reqs]


def _holdout(keys: list[str], fraction: float) -> np.ndarray:
    """Deterministic prompt-disjoint mask: True for rows whose prompt hashes into `fraction`."""
    h = np.array([int(hashlib.sha256(k.encode()).hexdigest()[:8], 16) / 16**8 for k in keys])
    return h < fraction


class EncoderPredictor(Predictor):
    name = "encoder-base"
    needs_text = True
    loss_name = "?"

    def __init__(self, **params: Any) -> None:
        if params.get("early_stop", "tau") not in ("tau", "loss"):
            raise ValueError(f"{self.name}: early_stop must be 'tau' or 'loss'")
        super().__init__(**checked_params(self.name, {**DEFAULTS, **self.extra_defaults()}, params,
                                          nullable=("finetune_max_seconds", "class_weight")))  # fmt: skip
        p = self.params
        check_ranges(self.name, p, RANGES)
        self.encoder = MiniLMEncoder(
            p["max_length"], p["truncation"], p["embed_batch"], p["num_threads"]
        )
        self.cache = EmbeddingCache(p["cache_dir"], disk=p["disk_cache"])
        self.finetuned = False
        self.timings: dict[str, float] = {}

    # --- subclass hooks ---------------------------------------------------------------------
    @classmethod
    def extra_defaults(cls) -> dict[str, Any]:
        return {}

    def _setup(self, rows: Rows) -> None: ...

    def _out_dim(self) -> int:
        raise NotImplementedError

    def _init_head(self, rows: Rows) -> None: ...

    def _targets(self, rows: Rows) -> np.ndarray:
        raise NotImplementedError

    def _loss(
        self, out: torch.Tensor, tgt: torch.Tensor, gen: torch.Generator | None = None
    ) -> torch.Tensor:
        raise NotImplementedError

    def _rank(self, out: np.ndarray) -> np.ndarray:
        """The rank score of head outputs (larger = longer)."""
        return out[:, 0]

    def _val_score(self, out: torch.Tensor, tgt: torch.Tensor, y: np.ndarray) -> float:
        """What stage 2 early-stops on (lower is better): minus the validation Kendall tau-b of
        rank score vs mean length (`early_stop="tau"`), or the validation loss ("loss")."""
        if self.params["early_stop"] == "tau":
            from scipy.stats import kendalltau

            return -float(kendalltau(self._rank(out.numpy().astype(np.float64)), y).statistic)
        return float(self._loss(out, tgt, torch.Generator().manual_seed(12345)))

    def _calibrate(self, out: np.ndarray, rows: Rows, model_idx: np.ndarray) -> None: ...

    def _estimate(self, out: np.ndarray, model_idx: np.ndarray) -> LengthEstimate:
        raise NotImplementedError

    def _extra_state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        return {}, {}

    def _load_extra(self, arrays: dict[str, np.ndarray], values: dict[str, Any]) -> None: ...

    # --- fit ----------------------------------------------------------------------------------
    def fit(self, requests, validation=None):
        p = self.params
        check_requests(requests, need_text=True)
        torch.set_num_threads(p["num_threads"])
        torch.manual_seed(p["seed"])
        self.timings = {}
        rows, keys = make_rows(requests)
        if validation is not None and len(validation):
            check_requests(validation, need_text=True)
            train, val = rows, make_rows(validation)[0]
        else:
            hold = _holdout(keys, p["calib_fraction"])
            if hold.all() or not hold.any():
                hold = np.arange(len(rows)) % 5 == 0
            train, val = rows.take(~hold), rows.take(hold)
        self.vocab = ModelVocab.fit(train.models)
        self._setup(train)
        self.head = Head(self._out_dim(), len(self.vocab), hidden=p["hidden"], model_dim=p["model_dim"],
                         dropout=p["dropout"])  # fmt: skip
        self._init_head(train)
        tr_tgt = torch.as_tensor(self._targets(train), dtype=torch.float32)
        va_tgt = torch.as_tensor(self._targets(val), dtype=torch.float32)
        tr_m, va_m = self.vocab.index(train.models), self.vocab.index(val.models)

        t0 = time.perf_counter()
        if p["finetune_epochs"] and p["finetune_epochs"] > 0:
            self._stage1(train, tr_tgt, tr_m)
        t1 = time.perf_counter()
        e_tr = torch.from_numpy(self._embed(train.texts))
        e_va = torch.from_numpy(self._embed(val.texts))
        t2 = time.perf_counter()
        self._stage2(e_tr[train.text_idx], tr_tgt, tr_m, e_va[val.text_idx], va_tgt, va_m, val.y)
        t3 = time.perf_counter()
        self._calibrate(self._head_out(e_va[val.text_idx], va_m), val, va_m)
        self.timings.update({"stage1_s": t1 - t0, "embed_s": t2 - t1, "stage2_s": t3 - t2,
                        "calibrate_s": time.perf_counter() - t3, "train_rows": len(train),
                        "train_prompts": len(train.texts), "val_rows": len(val)})  # fmt: skip
        self.fitted = True
        return self

    def _embed(self, texts: list[str]) -> np.ndarray:
        return embed_texts(self.encoder, texts, self.cache)

    def _drop_models(self, m: np.ndarray, gen: np.random.Generator) -> torch.Tensor:
        m = m.copy()
        m[gen.random(len(m)) < self.params["model_dropout"]] = 0
        return torch.from_numpy(m)

    def _stage1(self, train: Rows, tgt: torch.Tensor, m_idx: np.ndarray) -> None:
        p = self.params
        rng = np.random.default_rng(p["seed"])
        gen = torch.Generator().manual_seed(p["seed"])
        enc = self.encoder.model
        rows_of = [[] for _ in train.texts]
        for i, t in enumerate(train.text_idx):
            rows_of[t].append(i)
        n_prompts = len(train.texts)
        steps = max(1, int(np.ceil(p["finetune_epochs"] * n_prompts / p["finetune_batch"])))
        opt = torch.optim.AdamW([{"params": enc.parameters(), "lr": p["finetune_lr"]},
                                 {"params": self.head.parameters(), "lr": p["head_lr"]}],
                                weight_decay=p["weight_decay"])  # fmt: skip
        warm = max(1, int(0.06 * steps))
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda s: min((s + 1) / warm, max(0.0, (steps - s) / max(1, steps - warm)))
        )
        enc.train(), self.head.train()
        order = np.concatenate(
            [rng.permutation(n_prompts) for _ in range(int(np.ceil(p["finetune_epochs"])))]
        )
        start, cap = time.perf_counter(), p["finetune_max_seconds"]
        for s in range(steps):
            batch = order[s * p["finetune_batch"] : (s + 1) * p["finetune_batch"]]
            if not len(batch):
                break
            emb = self.encoder.forward([train.texts[t] for t in batch])
            local = {t: j for j, t in enumerate(batch)}
            ridx = np.array([i for t in batch for i in rows_of[t]])
            out = self.head(
                emb[[local[t] for t in train.text_idx[ridx]]], self._drop_models(m_idx[ridx], rng)
            )
            loss = self._loss(out, tgt[ridx], gen)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(
                list(enc.parameters()) + list(self.head.parameters()), 1.0
            )
            opt.step()
            sched.step()
            if cap is not None and time.perf_counter() - start > cap:
                break
        self.timings["stage1_steps"] = s + 1
        enc.eval()
        self.encoder.refresh_fingerprint()
        self.finetuned = True

    def _stage2(self, x, tgt, m_idx, xv, tgtv, mv, yv) -> None:
        p = self.params
        rng = np.random.default_rng(p["seed"] + 1)
        gen = torch.Generator().manual_seed(p["seed"] + 1)
        opt = torch.optim.AdamW(
            self.head.parameters(), lr=p["head_lr"], weight_decay=p["weight_decay"]
        )
        best, best_state, bad = np.inf, None, 0
        mv_t = torch.from_numpy(mv)
        for epoch in range(p["head_epochs"]):
            self.head.train()
            perm = rng.permutation(len(tgt))
            for i in range(0, len(perm), p["head_batch"]):
                b = perm[i : i + p["head_batch"]]
                if len(b) < 2:
                    continue
                loss = self._loss(self.head(x[b], self._drop_models(m_idx[b], rng)), tgt[b], gen)
                opt.zero_grad()
                loss.backward()
                opt.step()
            self.head.eval()
            with torch.no_grad():
                vl = self._val_score(self.head(xv, mv_t), tgtv, yv)
            if vl < best - 1e-6:
                best, bad = vl, 0
                best_state = {k: v.clone() for k, v in self.head.state_dict().items()}
            else:
                bad += 1
                if bad >= p["patience"]:
                    break
        self.timings["stage2_epochs"] = epoch + 1
        self.timings["val_loss"] = best
        if best_state is not None:
            self.head.load_state_dict(best_state)
        self.head.eval()

    def _head_out(self, x: torch.Tensor, m_idx: np.ndarray) -> np.ndarray:
        self.head.eval()
        with torch.no_grad():
            return self.head(x, torch.from_numpy(m_idx)).numpy().astype(np.float64)

    # --- predict ------------------------------------------------------------------------------
    def embed(self, requests: Sequence[Request]) -> np.ndarray:
        """The (cached) prompt embeddings the head reads, one row per request."""
        return self._embed([r.prompt for r in requests])

    def outputs(self, requests: Sequence[Request]) -> tuple[np.ndarray, np.ndarray]:
        """(raw head outputs, model indices) for requests."""
        self.check_fitted()
        check_requests(requests, need_text=True)
        torch.set_num_threads(self.params["num_threads"])
        m = self.vocab.index([r.model for r in requests])
        return self._head_out(torch.from_numpy(self.embed(requests)), m), m

    def predict(self, requests):
        out, m = self.outputs(requests)
        return self._estimate(out, m)

    def known_models(self) -> list[str]:
        return list(self.vocab.names[1:])

    def unknown_model_fallback(self, model: str) -> str:
        return "its learnt 'unknown model' vector (trained on the model_dropout share of rows)"

    # --- persistence --------------------------------------------------------------------------
    def state(self):
        arrays = {f"head/{k}": v.detach().numpy().copy() for k, v in self.head.state_dict().items()}
        if self.finetuned:
            arrays.update({f"enc/{k}": v for k, v in self.encoder.weights().items()})
        extra_a, extra_v = self._extra_state()
        arrays.update({f"x/{k}": v for k, v in extra_a.items()})
        values = {"models": self.vocab.names[1:], "finetuned": self.finetuned,
                  "fingerprint": self.encoder.fingerprint, "out_dim": self._out_dim(),
                  "timings": self.timings, **extra_v}  # fmt: skip
        return arrays, values

    @classmethod
    def from_state(cls, params, arrays, values):
        pred = cls(**params)
        pred.vocab = ModelVocab(values["models"])
        pred._load_extra({k[2:]: v for k, v in arrays.items() if k.startswith("x/")}, values)
        p = pred.params
        pred.head = Head(values["out_dim"], len(pred.vocab), hidden=p["hidden"], model_dim=p["model_dim"],
                         dropout=p["dropout"])  # fmt: skip
        pred.head.load_state_dict(
            {k[5:]: torch.from_numpy(v) for k, v in arrays.items() if k.startswith("head/")}
        )
        pred.head.eval()
        if values.get("finetuned"):
            pred.encoder.set_weights({k[4:]: v for k, v in arrays.items() if k.startswith("enc/")})
            pred.finetuned = True
            if pred.encoder.fingerprint != values["fingerprint"]:
                raise ValueError(
                    f"{cls.name}: encoder weights do not match their saved fingerprint"
                )
        elif values.get("fingerprint", PRETRAINED) != PRETRAINED:
            raise ValueError(f"{cls.name}: saved file lacks its fine-tuned encoder weights")
        pred.timings = values.get("timings", {})
        return pred
