"""Per-request records, stored column-wise (numpy), shared by every driver.

One row per completed request with its timestamps (seconds, same clock as arrivals) and counts.
Derived per-request metrics (vLLM bench serve names, seconds):

    queue_wait  = first_scheduled - arrival
    ttft        = first_token - arrival
    e2el        = finish - arrival
    tpot        = (finish - first_token) / (output_tokens - 1)      (NaN when output_tokens == 1)
    normalized  = e2el / output_tokens                              (seconds per output token)
    max_itl     = the longest gap between two of its consecutive tokens
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

import numpy as np
import pandas as pd

_FLOAT = ("arrival", "first_scheduled", "first_token", "finish", "max_itl",
          "slo_ttft", "slo_tpot", "slo_e2e")  # fmt: skip
_INT = ("prompt_tokens", "output_tokens", "preemptions", "recomputed_tokens", "instance")


@dataclass
class RecordTable:
    id: np.ndarray
    tenant: np.ndarray
    arrival: np.ndarray
    first_scheduled: np.ndarray
    first_token: np.ndarray
    finish: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    preemptions: np.ndarray
    recomputed_tokens: np.ndarray
    instance: np.ndarray
    max_itl: np.ndarray
    slo_ttft: np.ndarray  # per-request SLOs, NaN when unset
    slo_tpot: np.ndarray
    slo_e2e: np.ndarray

    @classmethod
    def from_seqs(cls, seqs: Iterable) -> "RecordTable":
        """From finished request states (simulator `Seq`s or anything with the same fields)."""
        seqs = list(seqs)
        unfinished = [s.id for s in seqs if s.finish is None]
        if unfinished:
            raise ValueError(f"{len(unfinished)} requests never finished, e.g. {unfinished[:3]}")
        nan = float("nan")
        cols = {
            "id": np.array([s.id for s in seqs], dtype=object),
            "tenant": np.array([s.tenant for s in seqs], dtype=object),
            "arrival": [s.arrival for s in seqs],
            "first_scheduled": [s.first_scheduled for s in seqs],
            "first_token": [s.first_token for s in seqs],
            "finish": [s.finish for s in seqs],
            "max_itl": [s.max_itl for s in seqs],
            "prompt_tokens": [s.prompt_tokens for s in seqs],
            "output_tokens": [s.generated for s in seqs],
            "preemptions": [s.preemptions for s in seqs],
            "recomputed_tokens": [s.recomputed_tokens for s in seqs],
            "instance": [s.instance for s in seqs],
        }
        for name in ("slo_ttft", "slo_tpot", "slo_e2e"):
            cols[name] = [nan if (v := getattr(s.request, name)) is None else v for s in seqs]
        return cls(**{k: (np.asarray(v, dtype=float) if k in _FLOAT else
                          np.asarray(v, dtype=np.int64) if k in _INT else v)
                      for k, v in cols.items()})  # fmt: skip

    def __len__(self) -> int:
        return len(self.id)

    @property
    def queue_wait(self) -> np.ndarray:
        return self.first_scheduled - self.arrival

    @property
    def ttft(self) -> np.ndarray:
        return self.first_token - self.arrival

    @property
    def e2el(self) -> np.ndarray:
        return self.finish - self.arrival

    @property
    def tpot(self) -> np.ndarray:
        n = self.output_tokens - 1
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(n > 0, (self.finish - self.first_token) / np.maximum(n, 1), np.nan)

    @property
    def normalized(self) -> np.ndarray:
        return self.e2el / self.output_tokens

    def to_frame(self) -> pd.DataFrame:
        df = pd.DataFrame({k: getattr(self, k) for k in self.__dataclass_fields__})
        for k in ("queue_wait", "ttft", "tpot", "e2el", "normalized"):
            df[k] = getattr(self, k)
        return df
