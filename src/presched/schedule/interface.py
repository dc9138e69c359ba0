"""The scheduling-policy interface: the one place that decides order.

A `Policy` is pure logic. It keeps no clock of its own (every hook gets `now`) and does no I/O, so
the same object runs under the simulator (`sim/`, virtual clock) and under the gateway (`serve/`,
wall clock). The driver owns the requests' state and calls the hooks below; the policy answers.

What a policy sees: per-request state objects ("seqs") with at least these attributes, which both
drivers provide (the simulator's `presched.sim.seq.Seq` is the reference):

    seq.request          the immutable `Request` (arrival, prompt_tokens, tenant, SLOs, ...)
    seq.arrival          arrival time, seconds
    seq.prompt_tokens    prompt length in tokens
    seq.generated        output tokens produced so far
    seq.estimate         the current length estimate from `predict/` (None if no predictor);
                         drivers may replace it at any step (progressive refinement)
    seq.first_scheduled  time the request first ran (None while it never has)
    seq.first_token      time of its first output token (None before)
    seq.preemptions      how many times it was preempted
    seq.target           ORACLE ONLY: the true number of tokens it will generate. Only policies
                         with `oracle = True` may read it; the gateway does not know it.

Call order: `attach` once, before any request (what the engine offers). Then for one request:
`on_arrival` -> `priority` (+ `rekey_at`) when it enters the waiting queue -> `admit` when it is at
the head and fits -> `on_schedule` (each time it is admitted to the running batch) -> `on_tokens`
(as it generates) -> [`on_preempt` -> `priority` -> `on_schedule` ...] -> `on_finish`.
A request may instead leave at any point after `on_arrival` (waiting or running) with
`on_cancel`: its client went away, or the gateway moved it to another backend (whose policy
then hears `on_arrival` afresh). After `on_finish` or `on_cancel` the policy hears nothing more
of that request and must hold no state for it. The simulator never cancels.

Keeping decisions cheap (the gateway and the simulator call these on their hot path): a key that
changes with time in a way known in advance (starvation promotion at a wait threshold, an SLO
becoming unreachable) is expressed with `rekey_at`, which costs O(log n) per change; linear aging
is a static key (score - a*(now - arrival) orders like score + a*arrival). `dynamic = True`
(re-key every waiting request at every decision, O(n log n)) is the last resort. A policy whose
whole order changes at once (a mode switch) bumps `epoch`; the queue re-keys once.
"""

from __future__ import annotations

from abc import ABC
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Protocol, Sequence

from presched.schedule.params import NoParams, PolicyParams, parse

if TYPE_CHECKING:
    from presched.schedule.request_queue import RequestQueue


class SeqView(Protocol):
    """The read-only view of a request's progress that policies rely on (see module doc)."""

    request: Any
    arrival: float
    prompt_tokens: int
    generated: int
    estimate: Any
    first_scheduled: float | None
    first_token: float | None
    preemptions: int


@dataclass(frozen=True)
class EngineInfo:
    """What one engine offers, given to `Policy.attach` by the driver before any request.

    kv_tokens            KV-cache capacity in tokens (num_blocks * block_size); None if unknown
                         (a gateway in front of an engine that does not report it)
    block_size           tokens per KV block (1 if unknown)
    max_num_seqs         the most requests that run at once (the gateway: max in-flight)
    max_num_batched_tokens  token budget of one step (None if unknown)
    step_model           a `sim.steptime.StepTimeModel` of this engine (seconds per step), or None
    drift_alarm          a zero-argument callable: True while the online learner's drift alarm is
                         raised (`predict.online`; the gateway with `--learn`), read at decisions
                         (`fallback` falls back while it is); None where no learner runs (the
                         simulator, the engine plugin)
    """

    kv_tokens: int | None = None
    block_size: int = 1
    max_num_seqs: int = 256
    max_num_batched_tokens: int | None = None
    step_model: Any = None
    drift_alarm: Callable[[], bool] | None = None


class Policy(ABC):
    """Base class of scheduling policies. Subclass, override what you need, register by name.

    The defaults are FCFS: order by arrival, preempt the latest arrival under KV pressure,
    never preempt to admit.

    Parameters: a policy with options declares them as a frozen pydantic model, `Params`
    (`schedule/params.py`); `__init__` validates its keyword arguments with it and keeps the
    result as `self.params` (a `ParamsError` naming each bad field otherwise). A subclass's
    `__init__(**params)` calls `super().__init__(**params)` first and reads `self.params`.
    """

    name: ClassVar[str] = "base"
    Params: ClassVar[type[PolicyParams]] = NoParams
    """The parameter model (fields with defaults, bounds and `description` help text)."""
    oracle: bool = False
    """True when the policy reads true lengths (`seq.target`): a bound, not deployable."""
    dynamic: bool = False
    """True when `priority` changes with `now` in ways `rekey_at` cannot express. The queue then
    re-evaluates the priorities of all waiting requests at each decision (O(n log n))."""
    epoch: int = 0
    """Bump (on the instance) when the order of requests already queued changes at once, e.g. a
    switch of mode; the queue re-keys every waiting request once, at its next decision."""

    def __init__(self, **params: Any) -> None:
        self.params: PolicyParams = parse(type(self).Params, params)

    def attach(self, engine: EngineInfo) -> None:
        """Called once by the driver, before any request, with what the engine offers (KV
        capacity, batch size, a step-time model). Policies that reason about memory or time
        keep what they need. Default: ignore."""

    def priority(self, seq: SeqView, now: float) -> float:
        """Sort key of a waiting request: lower runs first; ties go to the earlier arrival.

        Called by the driver when the request enters the waiting queue (on arrival and after a
        preemption) and, for `dynamic` policies, again at every decision point. Must be cheap:
        it is called once per request per queue entry on the simulator's hot path.
        """
        return seq.arrival

    def rekey_at(self, seq: SeqView, now: float) -> float | None:
        """The time at which the waiting request's `priority` will change by itself (e.g. it
        reaches a starvation threshold), or None. Called right after `priority` each time the
        request enters the queue; at that time the queue calls `priority` and `rekey_at` again.
        The simulator ends fast-forwarded runs there, so the decision is taken on time."""
        return None

    def admit(self, seq: SeqView, running: Sequence[SeqView], now: float) -> bool:
        """May `seq`, the head of the waiting queue, start now? Called by the engine after it
        checked that a batch slot and its KV blocks for this step are free (vLLM's plugin: the
        slot; vLLM checks the blocks after, so count admissions in `on_schedule`). Return False to
        keep it (and, as the order is strict, everyone behind it) waiting, e.g. because its
        predicted footprint would over-commit memory later. `running` may be the batch without
        the victims the simulator means to preempt for `seq` (it asks before preempting them).
        Default: True. A refusal must not
        turn into a yes while the running requests only decode (no arrival, completion,
        `wakeup` or re-key in between): the simulator fast-forwards such stretches."""
        return True

    def new_queue(self) -> RequestQueue:
        """The waiting queue this policy orders (called once by each driver). Default: a
        `WaitingQueue` keyed by `priority`. Policies that pick across sub-queues (per-tenant
        fair share) return their own `RequestQueue` (`request_queue.py`)."""
        from presched.schedule.queue import WaitingQueue

        return WaitingQueue(self)

    def victim(self, candidates: Sequence[SeqView], now: float) -> SeqView:
        """Which running request gives up its KV blocks when memory runs out.

        Called by the engine (simulated or real) during a step when a running request needs a
        new KV block and none is free. `candidates` are the running requests not yet served in
        this step, in admission order, including the one that needs the block. The victim is
        preempted by recompute: its blocks are freed and it re-enters the waiting queue.
        Default: the latest arrival, ties to the most recently admitted. (vLLM v1's FCFS pops
        the most recently admitted, which is the same request except when an older request was
        re-admitted after a preemption: vLLM would evict it again, this default protects it, as
        vLLM's priority policy does with its (priority, arrival) order.)
        """
        return max(reversed(candidates), key=_arrival)

    def preempt_for(
        self, candidate: SeqView, running: Sequence[SeqView], now: float
    ) -> SeqView | None:
        """Return a running request to preempt so that `candidate` (the head of the waiting
        queue, by `priority`) can start now, or None to let it wait.

        Called when the candidate cannot be admitted because the batch is full (`max_num_seqs`)
        or KV blocks are short. The driver repeats the call while it keeps returning victims and
        the candidate still does not fit. The simulator asks with `running` less the requests
        named so far (nothing is preempted yet) and preempts them only if the candidate then
        fits and `admit` accepts it against that batch: answer from the `running` given, not
        from state kept about the whole batch. Non-preemptive policies return None (the default).
        Decisions are re-evaluated only at events (arrivals, completions, `wakeup` times), not
        at every decode step.
        """
        return None

    def wakeup(self, now: float) -> float | None:
        """The next time at which this policy may decide differently without any arrival or
        completion (e.g. an aging threshold), or None. The simulator ends a fast-forward there."""
        return None

    # --- notifications (default: ignore) -------------------------------------------------
    def on_arrival(self, seq: SeqView, now: float) -> None:
        """A request arrived at this engine (before it is queued)."""

    def on_schedule(self, seq: SeqView, now: float) -> None:
        """The request was admitted to the running batch (first time or after a preemption)."""

    def on_tokens(self, seq: SeqView, num_tokens: int, now: float) -> None:
        """The request produced `num_tokens` more output tokens by `now`. The simulator calls it
        once per step or once per fast-forwarded run of decode steps, so `num_tokens` may be > 1."""

    def on_preempt(self, seq: SeqView, now: float) -> None:
        """The request was preempted (recompute): it lost its KV and goes back to waiting."""

    def on_finish(self, seq: SeqView, now: float) -> None:
        """The request generated its last token."""

    def on_cancel(self, seq: SeqView, now: float) -> None:
        """The request left before finishing, waiting or running (its client went away, or it
        was moved to another backend): drop what is kept for it. It did not complete, so its
        `generated` is no true length (do not learn from it). Default: ignore (policies without
        per-request state)."""

    def describe(self) -> str:
        return self.name + (" (oracle)" if self.oracle else "")


def _arrival(seq: SeqView) -> float:
    return seq.arrival
