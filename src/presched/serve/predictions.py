"""Work the gateway keeps off its event loop: length predictions and prompt token counts.

`Worker` is one thread that runs CPU-bound calls (a LightGBM batch, a tokenizer over a long
prompt) while the event loop goes on relaying streams; one thread, so predictors and tokenizers
need not be thread-safe, and calls run in the order they were made.

`PredictBatcher` predicts the lengths of requests that arrive together in one call. Predictors
are batch-first (a LightGBM call costs about the same for 1 row as for 50), so the gateway does
not predict per request: the requests that ask in the same event-loop turn form one batch, and
those that ask while a batch is being predicted form the next one. Under load this amortises the
predictor's fixed cost; when idle it adds one loop turn and a thread hand-off (microseconds).
When the predictor raises on a batch, each of its requests is predicted again on its own (same
worker call), so a request it cannot predict fails alone and no other client gets its error.

A predictor that reads prompt text (`predict.base.reads_text`: text-gbm, lexical-gbm, the
encoders, self-report) cannot predict a request without any (token ids, chat content null, a
blank prompt): `text_refusal` says so, and both fronts (the gateway's app, the endpoint picker)
refuse such a request with 400 naming `prompt` before predicting it, as the gateway refuses a
request an oracle policy cannot read (400 naming `ignore_eos`).

Served models the predictor was not fitted on (`presched.predict.served_models`; names match
canonically, `org/name` = `org--name`) are predicted with its documented fallback, counted per
model in `unknown_models` (`presched_predictor_unknown_model_total{model}` in /metrics; at most
`MAX_MODEL_LABELS` names, the rest as "other") and logged once per model as a warning.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

from presched.predict.base import has_text, reads_text
from presched.predict.served_models import ServedModels, fallback_note
from presched.workload.request import Request

logger = logging.getLogger(__name__)
MAX_MODEL_LABELS = 32
"""Distinct model names counted by name in `unknown_models` (clients choose the name: bound the
metric's label set); later ones are counted as "other"."""


class _WrongCount(ValueError):
    """The predictor returned another number of estimates than it was asked for (a broken
    predictor: the whole batch fails, as predicting its requests one by one would not help)."""


class Worker:
    """One background thread for CPU-bound calls: `await worker.run(fn, *args)`."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="presched-worker")

    async def run(self, fn: Callable, *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


class PredictBatcher:
    def __init__(self, predictor: Any, worker: Worker | None = None, inline_s: float = 0.0) -> None:
        """`inline_s` > 0: while the predictor's calls take at most that long (a moving average of
        the measured calls) and no batch is pending, a request is predicted at once on the event
        loop: a hand-off to the worker thread and back costs more than such a call (~0.7 ms on a
        busy 2-core machine, benchmarks/epp_latency.py)."""
        self.predictor = predictor
        self.worker = worker or Worker()
        self.inline_s = inline_s
        self.call_s: float | None = None  # moving average of a call's seconds
        self._pending: list[tuple[Request, asyncio.Future]] = []
        self._draining: asyncio.Task | None = None
        self.calls = 0
        self.predicted = 0
        self._known: tuple[Any, ServedModels | None] = (object(), None)  # (version, models)
        self.unknown_models: collections.Counter[str] = collections.Counter()
        """Requests predicted for a served model the predictor was not fitted on, by model."""
        self.reads_text = reads_text(predictor)

    @property
    def known(self) -> ServedModels | None:
        """The served models the predictor was fitted on, None if it ignores the model; read
        again when its version changes (the online learner's refits add the models it learnt)."""
        version = getattr(self.predictor, "version", None)
        if self._known[0] != version:
            self._known = (version, ServedModels.of(self.predictor))
        return self._known[1]

    def text_refusal(self, prompt: str | None) -> str | None:
        """Why a request whose prompt text is `prompt` (None: sent as token ids) cannot be
        predicted, or None when it can: the message of the 400 (param `prompt`) both fronts send."""
        if not self.reads_text or has_text(prompt):
            return None
        base = getattr(self.predictor, "base", self.predictor)  # the online learner's model
        name = getattr(base, "name", type(base).__name__)
        return (f"prompt: this gateway's length predictor ({name}) reads prompt text, and this request has "
                "none (token ids, no text content, or only whitespace); send the prompt as text")

    async def estimate(self, request: Request):
        """The request's `RequestEstimate` (raises what the predictor raised)."""
        if (self.inline_s > 0 and self.call_s is not None and self.call_s <= self.inline_s
                and self._draining is None and not self._pending):  # fmt: skip
            self.calls += 1
            self.predicted += 1
            return self._predict([request])[0]
        fut = asyncio.get_running_loop().create_future()
        self._pending.append((request, fut))
        if self._draining is None:
            self._draining = asyncio.get_running_loop().create_task(self._drain())
        return await fut

    async def _drain(self) -> None:
        """Predict batches until none is pending (started on the turn after the first ask).
        Every request of a batch gets its estimate or an exception: when the predictor raises on
        the batch, each request is predicted again on its own and gets its own result (so one
        request the predictor cannot read fails alone); a predictor that returns the wrong
        number of estimates fails the whole batch (ValueError); a drain that is cancelled
        (shutdown) cancels the requests it was predicting."""
        batch: list[tuple[Request, asyncio.Future]] = []
        try:
            while self._pending:
                batch, self._pending = self._pending, []
                self.predicted += len(batch)
                try:
                    est = await self.worker.run(self._predict_each, [r for r, _ in batch])
                except Exception as e:  # noqa: BLE001 - handed to every waiting request
                    for _, fut in batch:
                        if not fut.done():
                            fut.set_exception(e)
                    continue
                for (_, fut), e in zip(batch, est):
                    if fut.done():
                        continue
                    if isinstance(e, Exception):
                        fut.set_exception(e)
                    else:
                        fut.set_result(e)
        finally:
            self._draining = None
            for _, fut in batch:
                if not fut.done():
                    fut.cancel()

    def _predict_each(self, requests: list[Request]) -> list:
        """One estimate, or the exception predicting it raised, per request, in order (on the
        worker thread): the batch in one call; if the predictor raises on it, each request
        alone. Raises when the predictor returns the wrong number of estimates."""
        requests = self._resolve(requests)
        try:
            self.calls += 1
            return self._call(requests)
        except Exception as e:  # noqa: BLE001 - decided per request below
            if len(requests) == 1 or isinstance(e, _WrongCount):
                raise
        out: list = []
        for r in requests:
            try:
                self.calls += 1
                out.append(self._call([r])[0])
            except Exception as e:  # noqa: BLE001 - this request's own error
                if isinstance(e, _WrongCount):
                    raise
                out.append(e)
        return out

    def _predict(self, requests: list[Request]) -> list:
        """One estimate per request, in order (inline: see above); raises what the predictor raised."""
        return self._call(self._resolve(requests))

    def _resolve(self, requests: list[Request]) -> list[Request]:
        """The requests with their model names matched to the fitted ones (unseen ones counted)."""
        if self.known is not None:
            requests, unknown = self.known.resolve(requests)
            if unknown:
                self._count_unknown(requests, set(unknown))
        return requests

    def _call(self, requests: list[Request]) -> list:
        """One `predict` call: one estimate per request, in order."""
        t = time.perf_counter()
        est = self.predictor.predict(requests)
        dt = time.perf_counter() - t
        self.call_s = dt if self.call_s is None else 0.8 * self.call_s + 0.2 * dt
        if len(est) != len(requests):
            raise _WrongCount(f"the predictor returned {len(est)} estimates for "
                              f"{len(requests)} requests")  # fmt: skip
        return [est[i] for i in range(len(requests))]

    def _count_unknown(self, requests: list[Request], unknown: set[str]) -> None:
        for r in requests:
            if r.model not in unknown:
                continue
            name = r.model or "(none)"
            label = name if name in self.unknown_models or len(self.unknown_models) < MAX_MODEL_LABELS else "other"
            if label not in self.unknown_models and label != "other":
                logger.warning("%s", fallback_note(self.predictor, name))
            self.unknown_models[label] += 1
