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

The drift alarm: where the driver runs an online learner (the gateway with `--learn`), its
`EngineInfo.drift_alarm` says whether the learner's drift alarm is raised (`predict.online`:
recent completions not distributed as predicted). While it is, the conservative policy runs
whatever the tracker says; when it clears, the tracker's mode holds again. It is read each time
the waiting queue checks `epoch`, i.e. before every decision, so the queue re-keys once at the
first decision after the alarm changed (in the gateway: the first arrival or completion after
the completion that raised or cleared it), and at each arrival and completion (so `mode` and
`switches` follow it between decisions too). Without a learner (the simulator, the engine plugin)
there is no alarm and only the tracker decides. `drift_alarm=False` ignores it.

Config (`FallbackParams`): `inner` (predictive, default "fcfs"), `inner_params`, `conservative`
("fcfs"), `conservative_params`, `metric` ("discordance"), `threshold` (0.3), `hysteresis`
(0.05, < threshold), `min_samples` (100), `window` (500, >= min_samples), `level` (0.9, for
coverage_error), `drift_alarm` (True). Delegation is `Wrapper`'s, with `active` switched and both policies members.

Caveat (measured, docs/policies/fallback.md): the window holds the requests that completed last,
and a predictive policy chooses them by their predictions, so under saturation their predicted
lengths span a narrow range and the window's discordance rises even for a good predictor (range
restriction: 0.15 under FCFS, up to 0.5 under SJF for the same predictor). A long window (500)
averages over it; with 200 a good predictor was switched off 5 times in a 3000-request run.
`switches` lists (completion count, time, new mode) for inspection and tests (an alarm's switch
carries the time of the policy's last notification: `epoch` has no clock).
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from presched.predict.tracker import ErrorTracker
from presched.schedule.interface import Policy
from presched.schedule.params import ParamsError
from presched.schedule.registry import POLICIES
from presched.schedule.wrapper import Wrapper, WrapperParams, create_policy, known_policy, nested_params, plain_order

METRICS = ("discordance", "rel_mae", "coverage_error")
PREDICTIVE, CONSERVATIVE = "predictive", "conservative"


class FallbackParams(WrapperParams):
    inner: str = Field("fcfs", description="The predictive policy, active while the tracked error is low.")
    conservative: str = Field("fcfs", description="The policy active while the tracked error is high.")
    conservative_params: dict[str, Any] | None = Field(None, description="Parameters of `conservative`, checked by its own model (None: its defaults).")
    metric: Literal[METRICS] = Field("discordance", description="Tracked error: discordant-pair share of predicted vs true lengths, relative MAE, or |coverage - level| of the `level` quantile.")  # type: ignore[valid-type]
    threshold: float = Field(0.3, gt=0, allow_inf_nan=False, description="Switch to `conservative` when the error exceeds it.")
    hysteresis: float = Field(0.05, ge=0, allow_inf_nan=False, description="Switch back when the error is below threshold - hysteresis; must be < threshold.")
    min_samples: int = Field(100, ge=2, le=1_000_000, description="Completions tracked before the first decision.")
    window: int = Field(500, ge=2, le=1_000_000, description="Completions the error is computed over (the latest); must be >= min_samples.")
    level: float = Field(0.9, gt=0, lt=1, description="Quantile level checked by `coverage_error`.")
    drift_alarm: bool = Field(True, description="Also run `conservative` while the online learner's drift alarm is raised (the gateway with --learn; no effect where no learner runs).")

    @field_validator("conservative")
    @classmethod
    def _conservative_known(cls, v: str) -> str:
        return known_policy(v)

    @field_validator("conservative_params")
    @classmethod
    def _conservative_params_ok(cls, v, info: ValidationInfo):
        return nested_params(v, info, "conservative")

    @field_validator("hysteresis")
    @classmethod
    def _below_threshold(cls, v: float, info: ValidationInfo) -> float:
        t = info.data.get("threshold")
        if t is not None and not v < t:
            raise ValueError(f"must be < threshold ({t:g})")
        return v

    @field_validator("window")
    @classmethod
    def _covers_min_samples(cls, v: int, info: ValidationInfo) -> int:
        m = info.data.get("min_samples")
        if m is not None and v < m:
            raise ValueError(f"must be >= min_samples ({m})")
        return v


@POLICIES.register("fallback")
class Fallback(Wrapper):
    name = "fallback"
    Params = FallbackParams
    params: FallbackParams

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        p = self.params
        self.conservative: Policy = create_policy("conservative", p.conservative, p.conservative_params)
        for field, pol in (("inner", self.inner), ("conservative", self.conservative)):
            if not plain_order(pol):
                raise ParamsError([(field, f"{pol.name!r} has its own queue and cannot be switched; "
                                           "wrap the other way round (e.g. vtc with inner='fallback')")])  # fmt: skip
        self.metric, self.threshold, self.hysteresis = p.metric, p.threshold, p.hysteresis
        self.min_samples, self.level = p.min_samples, p.level
        self.tracker = ErrorTracker(p.window, levels=(p.level,))
        self.delegate(self.inner, (self.inner, self.conservative))
        self.mode = PREDICTIVE  # in force: CONSERVATIVE if the tracker or the alarm says so
        self.tracked = PREDICTIVE  # what the tracker's hysteresis rule says
        self.alarm = False  # the drift alarm, as last read
        self._alarm_of = None  # EngineInfo.drift_alarm (attach)
        self._now = 0.0  # time of the last notification
        self.switches: list[tuple[int, float, str]] = []

    def attach(self, engine):
        super().attach(engine)
        self._alarm_of = engine.drift_alarm if self.params.drift_alarm else None

    def new_queue(self):
        return Policy.new_queue(self)

    @property
    def epoch(self):  # type: ignore[override]
        self._read_alarm()  # the queue reads epoch before each decision
        return (len(self.switches), self.inner.epoch, self.conservative.epoch)

    def _read_alarm(self) -> None:
        if self._alarm_of is None:
            return
        raised = bool(self._alarm_of())
        if raised != self.alarm:
            self.alarm = raised
            self._apply(self._now)

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
        if self.tracked == PREDICTIVE and err > self.threshold:
            self.tracked = CONSERVATIVE
        elif self.tracked == CONSERVATIVE and err < self.threshold - self.hysteresis:
            self.tracked = PREDICTIVE
        self._apply(now)

    def _apply(self, now: float) -> None:
        want = CONSERVATIVE if self.alarm or self.tracked == CONSERVATIVE else PREDICTIVE
        if want != self.mode:
            self._switch(want, now)

    def _switch(self, mode: str, now: float) -> None:
        self.mode = mode
        self.active = self.inner if mode == PREDICTIVE else self.conservative
        self.switches.append((self.tracker.total, now, mode))

    def on_arrival(self, seq, now):
        self._now = now
        self._read_alarm()
        super().on_arrival(seq, now)

    def on_finish(self, seq, now):
        self._now = now
        self._read_alarm()
        if seq.estimate is not None:
            self.tracker.add(seq.estimate, seq.generated)
            self._update_mode(now)
        super().on_finish(seq, now)  # both policies

    def describe(self) -> str:
        return f"fallback({self.inner.describe()} -> {self.conservative.describe()})"
