"""`OnlineLearner`: any presched predictor, learning from the requests it served.

    learner = OnlineLearner(load_predictor("model.npz"), OnlineConfig(enabled=True), anchor=train_reqs)
    est = learner.predict(requests)                     # recalibrated quantiles (a LengthEstimate)
    learner.observe(request, length, status="ok")       # at completion; "length" = cut by max_tokens

What one completion does (`observe`, on the caller's thread, O(levels) plus an amortised sort):
- `failed` / `cancelled` requests teach nothing (no label; a client that left says nothing about
  the answer's length) and are only counted;
- a request cut by `max_tokens` (`status="length"`) is **censored**: a lower bound for the
  conformal recalibration (Kaplan-Meier, `calibrate.py`), never a training label;
- a tenant over its label rate (`caps.py`) is counted and dropped;
- otherwise the score goes to the recalibration of its group, the drift alarm (`drift.py`) sees
  the PIT of the recalibrated prediction (a censored one, what its lower bound tells), and a
  labelled request joins the bounded refit buffer.

Refits: after `min_refit` labelled completions, then after twice as many each time up to one
every `refit_every` (a doubling schedule: early models while little is known, O(log n) refits),
and the schedule starts over from the change point after a drift alarm (the next refit
`min_refit` rows after the change, training then on what followed it). A fresh instance of the
base predictor's class, with its parameters, is fitted on the buffer minus its last `holdout`
rows (at most a quarter) plus up to `anchor_rows` rows sampled from the original training data
(never more than the recent rows it trains on: traffic is at least half), on a background thread
(never the caller's: the gateway's event loop only pays `observe`). The held-out recent rows,
and the censored completions of their span, then seed a new recalibration for the new model, and
the model, its recalibration and the `version` are swapped in at once under a lock; predictions
made by an older version are not scored against the new one (counted `stale`). A refit during
which the drift alarm fired is discarded (`refit_discarded`): it learned from before the change.
`save` / `resume` (`state.py`) keep all of it, the refit schedule included (not the censored
rows kept for the next refit's recalibration).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import Counter, OrderedDict, deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, NamedTuple, Sequence

import numpy as np

from presched.predict.base import Predictor
from presched.predict.estimate import LEVELS, LengthEstimate
from presched.predict.online.calibrate import OnlineConformal
from presched.predict.online.caps import TenantCaps
from presched.predict.online.config import OnlineConfig
from presched.predict.online.drift import DriftAlarm
from presched.predict.served_models import ServedModels
from presched.workload.request import Request

log = logging.getLogger("presched.learn")
STATUSES = ("ok", "length", "failed", "cancelled")
MAX_LENGTH = 10**8
"""Longest answer taken as a label (tokens): beyond any context window; a larger one is ignored
(and an integer past float range cannot overflow a comparison)."""
_I50, _I90 = LEVELS.index(0.5), LEVELS.index(0.9)


class _Pending(NamedTuple):
    version: int
    group: str
    log_q: np.ndarray  # log of the base predictor's quantiles (the conformal scores' reference)
    cal_q: list[float]  # the recalibrated quantiles it was given (the drift alarm's PIT)
    lower: float  # where that estimate's CDF starts (`LengthEstimate.lower`)
    model: str  # the served model as predicted (the fitted spelling where the gateway matched one)


class OnlineLearner:
    name = "online"

    def __init__(self, base: Predictor, cfg: OnlineConfig | None = None, anchor: Sequence[Request] = (),
                 background: bool = True) -> None:  # fmt: skip
        self.cfg = cfg or OnlineConfig(enabled=True)
        c = self.cfg
        self.base = base
        self.version = 1
        self.anchor = list(anchor)
        self.conformal = self._new_conformal()
        self.alarm = DriftAlarm(c.alarm_k, c.alarm_h, c.alarm_window, c.alarm_level, c.alarm_band)
        self.caps = TenantCaps(c.tenant_rate, c.tenant_burst, c.max_tenants)
        self.buffer: deque[tuple[Request, int]] = deque(maxlen=c.buffer)  # (request, its length)
        # censored completions with prompt text: (request, its cut, labelled rows buffered before
        # it); a refit seeds its recalibration with those of the held-out rows' span (not saved)
        self.censored: deque[tuple[Request, int, int]] = deque(maxlen=max(1, c.holdout))
        self._labelled = 0  # labelled rows ever buffered
        self.counts: Counter[str] = Counter()
        self.refit_seconds: list[float] = []
        self._pending: OrderedDict[str, _Pending] = OrderedDict()
        self._since_refit = 0  # labelled completions buffered since the last refit (or change)
        self._interval = c.min_refit  # refit when _since_refit reaches it; doubles up to refit_every
        self._since_change: int | None = None  # rows buffered since the last drift alarm's change
        self.position: Any = None  # the caller's mark of the last completion observed (saved with the state)
        self._lock = threading.RLock()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="presched-learn") if background else None
        self._job: Future | None = None
        self._rng = np.random.default_rng(c.seed)
        self._known: tuple[int, ServedModels | None] | None = None  # (version, its fitted models)
        if c.state_dir:  # this process's folder from now on (state.py): another process is refused
            from presched.predict.online.state import claim

            claim(c.state_dir)

    def _new_conformal(self) -> OnlineConformal:
        c = self.cfg
        return OnlineConformal(LEVELS, c.window, c.min_group, c.recalibrate_every, c.max_groups)

    # --- served models: what the base was fitted on (the gateway matches names to them) ---
    def known_models(self) -> list[str] | None:
        return self.base.known_models()

    def unknown_model_fallback(self, model: str) -> str:
        return self.base.unknown_model_fallback(model)

    def _spelling(self, model: str) -> str:
        """`model` as the current base was fitted on it (`org/name` -> `org--name`), else as given."""
        if self._known is None or self._known[0] != self.version:
            self._known = (self.version, ServedModels.of(self.base))
        known = self._known[1]
        return (known.match(model) if known is not None else None) or model

    def group(self, r: Request) -> str:
        """The calibration group: the model, or `model|tenant` per tenant, with any `|` or `\\`
        in the model escaped (model 'a|b' + tenant 'c' and model 'a' + tenant 'b|c' were one)."""
        if not self.cfg.per_tenant:
            return str(r.model)
        model = str(r.model).replace("\\", "\\\\").replace("|", "\\|")
        return f"{model}|{r.tenant}"

    # --- predictions --------------------------------------------------------------------------
    def predict(self, requests: Sequence[Request]) -> LengthEstimate:
        with self._lock:
            base, version = self.base, self.version
        # served-model names as the base was fitted on them (the gateway has matched them
        # already; `presched learn` and direct callers have not)
        spelled = [self._spelling(r.model) for r in requests]
        requests = [r if m == r.model else dataclasses.replace(r, model=m) for r, m in zip(requests, spelled)]
        est = base.predict(requests)
        groups = [self.group(r) for r in requests]
        with self._lock:
            if version != self.version:  # swapped while predicting: the old model's calibration is gone
                return est
            q = self.conformal.apply(est.quantiles, groups)
            log_q, cal, low = np.log(np.maximum(est.quantiles, 1.0)), q.tolist(), est.lower.tolist()
            for i, r in enumerate(requests):
                self._pending[r.id] = _Pending(version, groups[i], log_q[i], cal[i], low[i], r.model)
                self._pending.move_to_end(r.id)
            while len(self._pending) > self.cfg.max_pending:
                self._pending.popitem(last=False)
                self.counts["forgotten"] += 1
        ratio = q[:, _I50] / np.maximum(est.quantiles[:, _I50], 1.0)
        point = est.point * ratio
        rank = point if np.array_equal(est.rank_score, est.point) else est.rank_score
        return LengthEstimate(q, point, rank, est.lower)

    def version_of(self, request_id: str) -> int | None:
        """The version that predicted a request not yet observed (None if unknown)."""
        rec = self._pending.get(request_id)
        return None if rec is None else rec.version

    # --- learning -----------------------------------------------------------------------------
    def observe(self, request: Request, length: float | None, status: str = "ok", now: float | None = None,
                position: Any = None) -> bool:  # fmt: skip
        """One completed request: `length` its output tokens (from usage), `status` one of
        ok / length (cut by max_tokens: censored) / failed / cancelled. True if learned from.
        `position` (JSON-able: where the caller read this completion; `presched learn`: the log
        and the row) becomes `self.position` together with what the completion teaches (under the
        lock a save takes), so a saved state names the last completion it holds."""
        if status not in STATUSES:
            raise ValueError(f"field 'status': expected one of {STATUSES}, got {status!r}")
        with self._lock:
            rec = self._pending.pop(request.id, None)
        if status in ("failed", "cancelled") or length is None or not 1 <= length <= MAX_LENGTH:
            return self._taught_nothing("ignored", position)  # (no label; NaN; past any context)
        if not self.caps.take(request.tenant, time.monotonic() if now is None else now):
            return self._taught_nothing("capped", position)
        censored = status == "length"
        with self._lock:
            # a refit trains on the fitted spelling, as its anchor rows have it: one model, not two
            model = rec.model if rec is not None else self._spelling(request.model)
            if model != request.model:
                request = dataclasses.replace(request, model=model)
            if position is not None:
                self.position = position
            if rec is None:
                self.counts["unpredicted"] += 1
            elif rec.version != self.version:
                self.counts["stale"] += 1
            else:
                self.conformal.add(rec.group, None, length, censored, log_q=rec.log_q, stamp=self.alarm.count)
                raised = self.alarm.active
                if self.alarm.add(rec.cal_q, length, rec.cal_q[_I90], rec.lower, censored):
                    self._on_alarm(first=not raised)
            self.counts["censored" if censored else "learned"] += 1
            save = bool(self.cfg.state_dir) and not censored and self.counts["learned"] % self.cfg.save_every == 0
            due = False
            if censored and request.prompt:
                self.censored.append((request, int(length), self._labelled))
            if not censored and request.prompt:  # a label a text predictor can read
                self.buffer.append((request, int(length)))  # made a labelled Request at refit (off this thread)
                self._labelled += 1
                self._since_refit += 1
                if self._since_change is not None:
                    self._since_change += 1
                due = self._refit_due()
        if due:
            self.refit()
        if save:
            self._submit(self.save, self.cfg.state_dir)
        return True

    def _taught_nothing(self, kind: str, position: Any) -> bool:
        with self._lock:
            self.counts[kind] += 1
            if position is not None:
                self.position = position
        return False

    def _on_alarm(self, first: bool) -> None:
        """Forget the recalibration rows before the change; on the first alarm of a drift (not
        one raised again while it is still on), start the refit schedule over from it: the rows
        since the change count as the rows since the last refit, and the interval is min_refit,
        so the next refit comes min_refit rows after the change (at once if it is that far back)
        and trains on what followed it."""
        a = self.alarm
        change = a.change_at if a.change_at is not None else a.count
        after = a.count - change
        self.conformal.forget_before(change, self.cfg.min_group)  # rows are stamped with alarm.count
        if self.cfg.refit_on_alarm and first:
            self._since_change = min(max(0, after - 1), len(self.buffer))  # this row joins it next
            self._since_refit = self._since_change
            self._interval = self.cfg.min_refit

    def _refit_due(self) -> bool:
        c = self.cfg
        if not c.refit_every or len(self.buffer) < c.min_refit or (self._job is not None and not self._job.done()):
            return False
        return self._since_refit >= self._interval

    def refit(self) -> Future | None:
        """Start a refit (background thread, or inline without one); None if one is running."""
        with self._lock:
            if self._job is not None and not self._job.done():
                return None
            recent = list(self.buffer)
            if self._since_change is not None:  # after an alarm: train on what followed the change
                recent = recent[-max(self._since_change, self.cfg.min_refit):]
            self._since_refit = 0
            self._interval = min(2 * self._interval, self.cfg.refit_every or self._interval)
            k = min(self.cfg.holdout, len(recent) // 4)  # the newest k rows are held out
            take = min(self.cfg.anchor_rows, len(self.anchor), len(recent) - k)  # recent traffic >= half
            anchor = [self.anchor[i] for i in self._rng.choice(len(self.anchor), take, replace=False)] if take else []
            cut = [(r, n) for r, n, before in self.censored if before >= self._labelled - k]  # the held-out span's
            start = (self.alarm.num_alarms, self.alarm.count)
            self._job = self._submit(self._refit_job, recent, k, anchor, cut, start)
            self._job.add_done_callback(self._refit_done)
            return self._job

    def _refit_done(self, job: Future) -> None:
        """A refit that raised: logged and counted (`refit_failed`), the model in use kept."""
        e = None if job.cancelled() else job.exception()
        if e is not None:
            with self._lock:
                self.counts["refit_failed"] += 1
            log.error("online learner: refit failed, keeping predictor version %d: %s: %s",
                      self.version, type(e).__name__, e)  # fmt: skip

    def _refit_job(self, recent_pairs: list[tuple[Request, int]], k: int, anchor: list[Request],
                   cut: list[tuple[Request, int]], start: tuple[int, int]) -> None:  # fmt: skip
        """Fit a new model on `recent_pairs` but the newest `k` (held out) plus `anchor`, seed its
        recalibration with the held-out rows and the censored ones of their span (`cut`), and
        swap it in, unless a drift alarm was raised since the refit started (`start`: alarms
        then, alarm.count then): its data predate the change, and the alarm's own forgetting
        and refit schedule stand (counted `refit_discarded`)."""
        t0 = time.process_time()
        recent = [dataclasses.replace(r, output_tokens=n, output_samples=()) for r, n in recent_pairs]
        hold, train = recent[len(recent) - k:], recent[: len(recent) - k] + anchor
        new = type(self.base)(**self.base.params)
        new.fit(train, validation=hold or None)
        conf = self._new_conformal()
        now = start[1]  # the held-out rows came before the refit started: one completion each
        if hold:
            est = new.predict(hold)
            for i, r in enumerate(hold):
                conf.add(self.group(r), est.quantiles[i], float(r.output_tokens), stamp=max(0, now - (len(hold) - i)))
        if cut:
            est = new.predict([r for r, _ in cut])
            for i, (r, n) in enumerate(cut):
                conf.add(self.group(r), est.quantiles[i], float(n), censored=True, stamp=max(0, now - len(hold)))
        with self._lock:
            if self.alarm.num_alarms != start[0]:
                self.counts["refit_discarded"] += 1
                return
            self.base, self.conformal = new, conf
            self.version += 1
            self.counts["refits"] += 1
        self.refit_seconds.append(time.process_time() - t0)
        if self.cfg.state_dir:
            self.save(self.cfg.state_dir)

    def _submit(self, fn: Any, *args: Any) -> Future:
        if self._pool is not None:
            return self._pool.submit(fn, *args)
        fut: Future = Future()
        try:
            fut.set_result(fn(*args))
        except Exception as e:  # noqa: BLE001 - kept on the future, as the pool would
            fut.set_exception(e)
        return fut

    def wait(self, timeout: float | None = None) -> None:
        """Wait for a running refit or save (tests, shutdown)."""
        job = self._job
        if job is not None:
            job.result(timeout)
        if self._pool is not None:
            self._pool.submit(lambda: None).result(timeout)

    def close(self) -> None:
        """Let a refit under way finish, stop the thread, save the state (if `state_dir`)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self.cfg.state_dir:
            self.save(self.cfg.state_dir)

    # --- what the gateway exports -------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        a = self.alarm
        return {"predictor_version": self.version, "drift_alarm": a.active, "drift_statistic": round(a.statistic, 3),
                "drift_alarms": a.num_alarms, "coverage_q90": a.coverage, **dict(self.counts)}  # fmt: skip

    # --- persistence (state.py) ---------------------------------------------------------------
    def save(self, folder: str) -> None:
        from presched.predict.online.state import save_state

        save_state(self, folder)

    @classmethod
    def resume(cls, folder: str, cfg: OnlineConfig, anchor: Sequence[Request] = (), background: bool = True) -> "OnlineLearner | None":
        from presched.predict.online.state import load_state

        return load_state(cls, folder, cfg, anchor, background)
