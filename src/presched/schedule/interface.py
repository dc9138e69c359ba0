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

Call order for one request: `on_arrival` -> `priority` (when it enters the waiting queue) ->
`on_schedule` (each time it is admitted to the running batch) -> `on_tokens` (as it generates)
-> [`on_preempt` -> `priority` -> `on_schedule` ...] -> `on_finish`.
"""

from __future__ import annotations

from abc import ABC
from typing import Any, ClassVar, Protocol, Sequence


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


class Policy(ABC):
    """Base class of scheduling policies. Subclass, override what you need, register by name.

    The defaults are FCFS: order by arrival, preempt the latest arrival under KV pressure,
    never preempt to admit.
    """

    name: ClassVar[str] = "base"
    oracle: ClassVar[bool] = False
    """True when the policy reads true lengths (`seq.target`): a bound, not deployable."""
    dynamic: ClassVar[bool] = False
    """True when `priority` changes with `now` (aging). The driver then re-evaluates the
    priorities of all waiting requests each time it picks from the queue (O(n log n))."""

    def priority(self, seq: SeqView, now: float) -> float:
        """Sort key of a waiting request: lower runs first; ties go to the earlier arrival.

        Called by the driver when the request enters the waiting queue (on arrival and after a
        preemption) and, for `dynamic` policies, again at every decision point. Must be cheap:
        it is called once per request per queue entry on the simulator's hot path.
        """
        return seq.arrival

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
        the candidate still does not fit. Non-preemptive policies return None (the default).
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

    def describe(self) -> str:
        return self.name + (" (oracle)" if self.oracle else "")


def _arrival(seq: SeqView) -> float:
    return seq.arrival
