"""`fallback` — run a predictive policy while its predictions are good; fall back to a
conservative one (default `fcfs`) while they are bad.

Each completed request feeds an `ErrorTracker` (its `seq.estimate` and its true length, which is
`seq.generated` at completion). Once the tracker holds `min_samples` completions, the mode is
re-evaluated after every completion:

    predictive  -> conservative   when  error >  threshold
    conservative -> predictive    when  error <  threshold - hysteresis

`metric` is one of
- `discordance` (default): share of discordant pairs between predicted rank and true length over
  the window (0 perfect, 0.5 random, 1 reversed). Predictive orderings (SJF, SRPT, LTR) depend on
  the order of predictions only, so this is the error that hurts them; it is scale-free (a
  predictor that is uniformly 2x too long still orders perfectly) and the 0.3 default means
  "clearly better than random" (tau ~ 0.4; published rankers reach tau ~ 0.5-0.6).
- `rel_mae`: mean |point - true| / mean true. Note: 0.3 is strict for heavy-tailed lengths;
  realistic predictors sit around 0.5-1, so raise the threshold with this metric.
- `coverage_error`: |coverage(level) - level| of the predicted `level` quantile (default 0.9):
  the error that matters to memory-aware admission (kv-admission).

The tracker keeps observing while the conservative policy runs (requests still carry
predictions), which is how the wrapper recovers. A switch bumps `epoch` (a tuple of the switch
count and both policies' epochs), so the waiting queue is re-keyed once by the new policy.
Both policies receive every notification, so either can take over with its state up to date;
the decisions (priority, rekey_at, admit, victim, preempt_for, wakeup) are the active one's.

Config: `inner` (predictive, default "fcfs"), `inner_params`, `conservative` ("fcfs"),
`conservative_params`, `metric` ("discordance"), `threshold` (0.3), `hysteresis` (0.05),
`min_samples` (100), `window` (500), `level` (0.9, for coverage_error).

Caveat (measured, docs/policies/fallback.md): the window holds the requests that completed last,
and a predictive policy chooses them by their predictions, so under saturation their predicted
lengths span a narrow range and the window's discordance rises even for a good predictor (range
restriction: 0.15 under FCFS, up to 0.5 under SJF for the same predictor). A long window (500)
averages over it; with 200 a good predictor was switched off 5 times in a 3000-request run.
`switches` lists (completion count, time, new mode) for inspection and tests.
"""

from __future__ import annotations

import math
from typing import Any

from presched.predict.tracker import ErrorTracker
from presched.schedule.interface import EngineInfo, Policy
from presched.schedule.registry import POLICIES
from presched.schedule.wrapper import Wrapper, create_policy, plain_order

METRICS = ("discordance", "rel_mae", "coverage_error")
PREDICTIVE, CONSERVATIVE = "predictive", "conservative"


@POLICIES.register("fallback")
class Fallback(Wrapper):
    name = "fallback"

    def __init__(
        self,
        inner: str = "fcfs",
        inner_params: dict[str, Any] | None = None,
        conservative: str = "fcfs",
        conservative_params: dict[str, Any] | None = None,
        metric: str = "discordance",
        threshold: float = 0.3,
        hysteresis: float = 0.05,
        min_samples: int = 100,
        window: int = 500,
        level: float = 0.9,
    ) -> None:
        super().__init__(inner, inner_params)
        self.conservative: Policy = create_policy("conservative", conservative, conservative_params)
        for field, pol in (("inner", self.inner), ("conservative", self.conservative)):
            if not plain_order(pol):
                raise ValueError(
                    f"field '{field}': {pol.name!r} has its own queue and cannot be switched; "
                    "wrap the other way round (e.g. vtc with inner='fallback')"
                )
        if metric not in METRICS:
            raise ValueError(f"field 'metric': must be one of {', '.join(METRICS)}, got {metric!r}")
        if not isinstance(threshold, (int, float)) or not threshold > 0:
            raise ValueError(f"field 'threshold': must be > 0, got {threshold!r}")
        if not isinstance(hysteresis, (int, float)) or not 0 <= hysteresis < threshold:
            raise ValueError(f"field 'hysteresis': must be in [0, threshold), got {hysteresis!r}")
        if isinstance(min_samples, bool) or not isinstance(min_samples, int) or min_samples < 2:
            raise ValueError(f"field 'min_samples': must be an integer >= 2, got {min_samples!r}")
        if isinstance(window, bool) or not isinstance(window, int) or window < min_samples:
            raise ValueError(f"field 'window': must be an integer >= min_samples, got {window!r}")
        if not isinstance(level, (int, float)) or not 0 < level < 1:
            raise ValueError(f"field 'level': must be in (0, 1), got {level!r}")
        self.metric, self.threshold, self.hysteresis = metric, float(threshold), float(hysteresis)
        self.min_samples, self.level = min_samples, float(level)
        self.tracker = ErrorTracker(window, levels=(level,))
        self.oracle = self.inner.oracle or self.conservative.oracle
        self.dynamic = self.inner.dynamic or self.conservative.dynamic
        self.mode = PREDICTIVE
        self.active: Policy = self.inner
        self.switches: list[tuple[int, float, str]] = []

    def new_queue(self):
        return Policy.new_queue(self)

    @property
    def epoch(self):  # type: ignore[override]
        return (len(self.switches), self.inner.epoch, self.conservative.epoch)

    def error(self) -> float:
        t = self.tracker
        if self.metric == "discordance":
            return t.discordance
        if self.metric == "rel_mae":
            return t.rel_mae
        return t.coverage_error(self.level)

    def _update_mode(self, now: float) -> None:
        if self.tracker.n < self.min_samples:
            return
        err = self.error()
        if math.isnan(err):
            return
        if self.mode == PREDICTIVE and err > self.threshold:
            self._switch(CONSERVATIVE, now)
        elif self.mode == CONSERVATIVE and err < self.threshold - self.hysteresis:
            self._switch(PREDICTIVE, now)

    def _switch(self, mode: str, now: float) -> None:
        self.mode = mode
        self.active = self.inner if mode == PREDICTIVE else self.conservative
        self.switches.append((self.tracker.total, now, mode))

    # --- decisions: the active policy's --------------------------------------------------
    def priority(self, seq, now):
        return self.active.priority(seq, now)

    def rekey_at(self, seq, now):
        return self.active.rekey_at(seq, now)

    def admit(self, seq, running, now):
        return self.active.admit(seq, running, now)

    def victim(self, candidates, now):
        return self.active.victim(candidates, now)

    def preempt_for(self, candidate, running, now):
        return self.active.preempt_for(candidate, running, now)

    def wakeup(self, now):
        return self.active.wakeup(now)

    # --- notifications: both ---------------------------------------------------------------
    def attach(self, engine: EngineInfo) -> None:
        self.inner.attach(engine)
        self.conservative.attach(engine)

    def on_arrival(self, seq, now):
        self.inner.on_arrival(seq, now)
        self.conservative.on_arrival(seq, now)

    def on_schedule(self, seq, now):
        self.inner.on_schedule(seq, now)
        self.conservative.on_schedule(seq, now)

    def on_tokens(self, seq, num_tokens, now):
        self.inner.on_tokens(seq, num_tokens, now)
        self.conservative.on_tokens(seq, num_tokens, now)

    def on_preempt(self, seq, now):
        self.inner.on_preempt(seq, now)
        self.conservative.on_preempt(seq, now)

    def on_finish(self, seq, now):
        if seq.estimate is not None:
            self.tracker.add(seq.estimate, seq.generated)
            self._update_mode(now)
        self.inner.on_finish(seq, now)
        self.conservative.on_finish(seq, now)

    def on_cancel(self, seq, now):  # no true length: the tracker does not learn from it
        self.inner.on_cancel(seq, now)
        self.conservative.on_cancel(seq, now)

    def describe(self) -> str:
        return f"fallback({self.inner.describe()} -> {self.conservative.describe()})"
