"""benchmarks/online.py's streams and runs: the two shifts, and frozen / online / retrained
predictions over one stream in arrival order, scored per window.

Shift (a) `sources`: the base is trained on CASTILLO's four code sources (Apps, BigCodeBench,
DS1000, Mbpp; every split) for `MODELS`; the stream serves Dolly + Alpaca + ShareGPT prompts of
the same models. Their prompts are split, prompt-disjoint and seeded: 70 % are the stream (each
prompt once, answered by one of the models chosen at random, shuffled: ~1,250 requests), 30 %
what "retrained" (text-gbm fitted offline on the target, every model's 10 samples) trains on, so
no predictor sees a stream prompt before it is served, and none sees it twice.

Shift (b) `model-swap`: Llama-3.1-8B's prompts (every source) are split in halves; the base is
trained on one half, the stream is the other (once each, shuffled), answered by Llama-3.1-8B
until `swap_at` completions and by `swap_to` (Qwen2.5-14B) after, while the requests still name
Llama-3.1-8B (a deployment swapped under the gateway). "Retrained" is text-gbm fitted on
`swap_to`'s answers to the base half (renamed to the served model). (CASTILLO's `train` split
holds only code prompts, DS1000 and Mbpp, so it is not used as the base here.)

The online learner sees completions `inflight` requests after their predictions (requests in
flight), predictions are made in batches of `batch` (as the gateway batches them), and refits
run inline where they fall due (deterministic; in the gateway they run on a thread, and the new
model arrives a few seconds later). Time per `observe` is process CPU time, refits excluded
(they are reported on their own line).
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any, Sequence

import numpy as np

from presched.predict import LEVELS, LengthEstimate
from presched.predict.data import castillo_requests, prompt_key
from presched.predict.metrics import coverage, kendall_tau_b
from presched.predict.online import OnlineConfig, OnlineLearner
from presched.predict.text_gbm import TextGBM
from presched.workload.request import Request

CODE = ("Apps", "BigCodeBench", "DS1000", "Mbpp")
TARGET = ("DollyDataset", "Alpaca", "ShareGPT")
MODELS = ("llama-3.1-8b", "qwen2.5-14b", "mistral-7b")
CORE = [i for i, lv in enumerate(LEVELS) if lv <= 0.9]  # q10..q90, as predictors.py's figure


@dataclasses.dataclass
class Shift:
    name: str
    base_train: list[Request]
    retrain_train: list[Request]
    stream: list[Request]
    change_at: int | None = None  # completions before the change (model swap)
    others: list[tuple[int, ...]] = dataclasses.field(default_factory=list)
    """Per stream row, the other samples of the answer served (same prompt, same answering
    model): what `calibrated_reference` reads."""


def _split_prompts(reqs: Sequence[Request], share: float, seed: int) -> tuple[list[Request], list[Request]]:
    """(rows of a seeded `share` of the prompts, rows of the others): prompt-disjoint."""
    keys = sorted({prompt_key(r) for r in reqs})
    rng = np.random.default_rng(seed)
    first = set(rng.permutation(keys)[: round(share * len(keys))].tolist())
    return [r for r in reqs if prompt_key(r) in first], [r for r in reqs if prompt_key(r) not in first]


def _one_sample(r: Request, model: str | None = None, length: int | None = None) -> Request:
    """The request as served: one answer (`output_tokens`), no other samples."""
    return dataclasses.replace(r, model=model or r.model, output_tokens=length or r.output_tokens, output_samples=())


def _others(r: Request, length: int) -> tuple[int, ...]:
    """`r`'s samples less one occurrence of the served `length`."""
    rest = list(r.output_samples)
    rest.remove(length)
    return tuple(rest)


def _once_each(reqs: Sequence[Request], seed: int) -> list[Request]:
    """One row per prompt (a seeded choice among the models that answered it), shuffled: the
    stream never repeats a prompt, so learning online cannot profit from seeing it twice."""
    by: dict[str, list[Request]] = {}
    for r in reqs:
        by.setdefault(prompt_key(r), []).append(r)
    rng = np.random.default_rng(seed)
    rows = [rows[int(rng.integers(len(rows)))] for _, rows in sorted(by.items())]
    return [rows[i] for i in rng.permutation(len(rows))]


def _new_prompts_shift(name: str, base: list[Request], target: list[Request], stream_share: float,
                       limit: int | None, seed: int) -> Shift:  # fmt: skip
    """Trained on `base`, serving `stream_share` of `target`'s prompts (each once, one answer);
    "retrained" fits the rest of them."""
    stream, retrain = _split_prompts(target, stream_share, seed)
    rows = _once_each(stream, seed + 1)
    stream = [_one_sample(r) for r in rows]
    others = [_others(r, r.output_tokens) for r in rows]
    if limit:
        base, retrain, stream, others = base[: 2 * limit], retrain[: 2 * limit], stream[:limit], others[:limit]
    return Shift(name, base, retrain, stream, others=others)


def sources_shift(models: Sequence[str] = MODELS, stream_share: float = 0.7, limit: int | None = None,
                  seed: int = 0) -> Shift:  # fmt: skip
    base = castillo_requests(None, models=models, datasets=CODE)
    target = castillo_requests(None, models=models, datasets=TARGET)
    return _new_prompts_shift("sources", base, target, stream_share, limit, seed)


def loso_shift(source: str, models: Sequence[str] = MODELS, stream_share: float = 0.7, limit: int | None = None,
               seed: int = 0) -> Shift:  # fmt: skip
    """Leave one source out, served online: trained on the other six CASTILLO sources, serving
    `stream_share` of `source`'s prompts."""
    base = castillo_requests(None, models=models, exclude_datasets=[source])
    target = castillo_requests(None, models=models, datasets=[source])
    return _new_prompts_shift(f"loso:{source}", base, target, stream_share, limit, seed)


def swap_shift(served: str = "llama-3.1-8b", swap_to: str = "qwen2.5-14b", swap_at: int = 1200,
               limit: int | None = None, seed: int = 0) -> Shift:  # fmt: skip
    old = castillo_requests(None, models=[served])
    new = {prompt_key(r): r for r in castillo_requests(None, models=[swap_to])}
    old = [r for r in old if prompt_key(r) in new]
    base, stream_rows = _split_prompts(old, 0.5, seed)  # every source on both sides
    served_name = old[0].model
    retrain = [dataclasses.replace(new[prompt_key(r)], model=served_name) for r in base]
    stream, others = [], []
    for k, r in enumerate(_once_each(stream_rows, seed + 2)):
        answer = r if k < swap_at else new[prompt_key(r)]
        stream.append(_one_sample(r, served_name, answer.output_tokens))
        others.append(_others(answer, answer.output_tokens))
    if limit:
        base, retrain, stream, others = base[: 2 * limit], retrain[: 2 * limit], stream[:limit], others[:limit]
    return Shift(f"model-swap:{served}->{swap_to}", base, retrain, stream, min(swap_at, len(stream)), others)


def score(est: LengthEstimate, y: np.ndarray, lo: int, window: int) -> dict[str, float]:
    """tau-b and coverage error (q10..q90, pts) of requests lo .. lo + window (nan past the end)."""
    if lo + window > len(y):
        return {"start": lo, "tau_b": float("nan"), "coverage_err_max_pts": float("nan"),
                "coverage_err_mean_pts": float("nan")}  # fmt: skip
    sl = slice(lo, lo + window)
    err = np.abs(coverage(est.quantiles[sl], y[sl]) - np.asarray(LEVELS))[CORE] * 100
    return {"start": lo, "tau_b": kendall_tau_b(est.rank_score[sl], y[sl]),
            "coverage_err_max_pts": float(err.max()), "coverage_err_mean_pts": float(err.mean())}  # fmt: skip


def calibrated_reference(shift: Shift, seed: int = 0) -> tuple[LengthEstimate, np.ndarray]:
    """A perfectly calibrated reference for the coverage figure, on the stream itself: request
    i's quantile at level k/10 (k = 1..9) is the k-th smallest of the other 9 samples of its
    answer. The served answer and those 9 are exchangeable draws, so P(y <= X_(k)) = k / 10
    exactly (the closed form of order statistics) once ties are broken at random, here by a
    uniform sub-token jitter on all ten lengths; (quantiles, jittered lengths). Only q10..q90 are
    meaningful (q95 and q99 repeat the largest sample); its coverage error in a window is the
    sampling noise of that window's coverage, nothing else."""
    if not shift.others or any(len(o) != 9 for o in shift.others):
        raise ValueError("calibrated_reference needs the other 9 samples of every answer")
    rng = np.random.default_rng(seed)
    y = np.array([r.output_tokens for r in shift.stream], dtype=float) + rng.random(len(shift.stream))
    rest = np.sort(np.array(shift.others, dtype=float) + rng.random((len(shift.others), 9)), axis=1)
    q = np.concatenate([rest, rest[:, -1:], rest[:, -1:]], axis=1)  # q10..q90, then q95 = q99 = max
    return LengthEstimate(q, q[:, 4], q[:, 4]), y


def window_scores(est: LengthEstimate, y: np.ndarray, window: int) -> list[dict[str, float]]:
    return [score(est, y, lo, window) for lo in range(0, len(y) - window + 1, window)]


def run_online(base: TextGBM, shift: Shift, cfg: OnlineConfig, inflight: int, batch: int) -> dict[str, Any]:
    """Serve the stream through an `OnlineLearner` (inline refits); its estimates in stream order."""
    learner = OnlineLearner(base, cfg, anchor=shift.base_train, background=False)
    n = len(shift.stream)
    q = np.zeros((n, len(LEVELS)))
    point, rank = np.zeros(n), np.zeros(n)
    observe_cpu, done = 0.0, 0
    alarms: list[int] = []  # completions done when the drift alarm fired
    versions = np.zeros(n, dtype=int)
    for lo in range(0, n, batch):
        part = shift.stream[lo : lo + batch]
        est = learner.predict(part)
        q[lo : lo + len(part)], point[lo : lo + len(part)], rank[lo : lo + len(part)] = est.quantiles, est.point, est.rank_score
        versions[lo : lo + len(part)] = learner.version
        upto = min(n, lo + len(part)) - inflight if lo + batch < n else n
        refit0 = sum(learner.refit_seconds)
        t0 = time.process_time()
        while done < upto:
            r = shift.stream[done]
            fired = learner.alarm.num_alarms
            learner.observe(r, r.output_tokens, now=float(done))
            done += 1
            if learner.alarm.num_alarms > fired:
                alarms.append(done)
        observe_cpu += time.process_time() - t0 - (sum(learner.refit_seconds) - refit0)
    return {"estimate": LengthEstimate(q, point, rank), "observe_us": 1e6 * observe_cpu / max(1, learner.counts["learned"]),
            "refit_seconds": list(learner.refit_seconds), "alarms": alarms, "versions": versions.tolist(),
            "status": learner.status()}  # fmt: skip


def predict_all(pred: TextGBM, stream: Sequence[Request], batch: int = 512) -> LengthEstimate:
    return LengthEstimate.concat([pred.predict(stream[i : i + batch]) for i in range(0, len(stream), batch)])
