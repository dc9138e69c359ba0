"""`vtc` — Virtual Token Counter fair share across tenants (Sheng et al., "Fairness in Serving
Large Language Models", OSDI'24; artifact `Ying1123/VTC-artifact`).

Each tenant u has a counter of the service it received, weighted and divided by its share:

    c_u += w_in  * prompt_tokens / weight_u     when one of its requests is admitted
    c_u += w_out * n             / weight_u     when its running requests generate n tokens

The next request to start comes from the backlogged tenant (one with requests in the waiting
queue) with the smallest counter; inside a tenant, requests are ordered by the `inner` policy
(default `fcfs`, the paper's order; e.g. `sjf-oracle` or a predictive SJF).

Counter lift (the paper's Algorithm 2): when tenant u becomes backlogged (its waiting queue goes
from empty to non-empty), c_u <- max(c_u, min of the counters of the other backlogged tenants);
if no other tenant is backlogged, c_u <- max(c_u, c_l) where l is the tenant that left the
waiting queue last. A tenant that was idle thus cannot bank credit and then starve the others.
(The artifact implements only the first branch; presched follows the paper.) It applies to every
transition to backlogged, including a preempted request coming back to an empty tenant queue.

When counters move: the charge for generated tokens (and the refund of an advance charge) is
kept aside and added to the counters at the next event on this engine: an arrival, an
admission, a preemption, a completion or a cancellation (and, after a completion, once more at
the next decision, `TenantQueues.update`: the step that completed a request may hand out tokens
after it). Between events the head tenant therefore stays the same, as the other policies'
decisions do (mlfq defers its demotions alike): the engine decides anew only at events, and the
fast-forwarding simulator skips the decode steps between them. The prompt charge at admission
is immediate (an admission is an event). Every driver calls the hooks in that order, so the
simulator, the gateway and the engine plugin charge alike; the fairness bound below is about the
full service (the deferred tokens included) and is unchanged: the tokens kept aside belong to
requests running since the last event, which the bound already counts.

Fairness bound (paper, Theorem 4.4): over any interval in which tenants f and g are both
backlogged, |W_f - W_g| <= 2 * max(w_in * L_in, w_out * M), with L_in the longest prompt and M
the most tokens the running batch holds. See docs/policies/vtc.md for the form this takes under
presched's vLLM-style batching (which does not reserve memory for the whole output).

Length-prediction variant (option `charge_predicted`, from the artifact's
`vtc_pred_len_req_queue.py`): at admission the tenant is also charged w_out * (predicted output
length); tokens are charged only beyond that prediction, and at completion a request that
generated fewer tokens is refunded the difference. The prediction is `moving-average` (the
artifact: per-tenant average of past output lengths, window 5, 0 before the first completion)
or a statistic of `seq.estimate` (`mean`, `median`, `point`, `q10`...`q99`).

Memory under tenant churn (one tenant per user or API key): the waiting queue keeps a queue
only for backlogged tenants (`TenantQueues`, tenant_queues.py), so a decision costs
O(#backlogged tenants). The per-tenant state (counter, service, first appearance, moving
average) is kept while the tenant has a request (arrived, not ended) and, once idle, for at most
`max_idle_tenants` tenants: past that, at the next event, the idle ones with the smallest
counters are forgotten (never the tenant that left the queue last: the lift reads it). A
forgotten tenant that comes back is a new one: its counter starts at 0 and is lifted to the
backlogged minimum (or the last to leave), which is what it would have been anyway while its old
counter was at most that (counters only grow, and so does that minimum, up to refunds of an
advance charge); one forgotten above it gains at most the difference. Its service restarts at
0, its moving average is forgotten, and it ranks after the tenants seen before it on ties.

Config (`VTCParams`): `inner`, `inner_params`, `w_in` (1), `w_out` (2; the paper's defaults),
`weights` ({tenant: weight}, default 1 each), `charge_predicted` (None), `max_idle_tenants`
(10,000). Preemption by recompute is not charged again (the tenant did not cause it): a
request's prompt is charged once.

    POLICIES.create("vtc", inner="sjf-oracle", weights={"gold": 2, "free": 1})
"""

from __future__ import annotations

import heapq
import itertools
from typing import Annotated, Any, Literal

from pydantic import Field

from presched.schedule.lengths import STATS, total
from presched.schedule.params import ParamsError
from presched.schedule.registry import POLICIES
from presched.schedule.tenant_queues import TenantQueues, tenant_of
from presched.schedule.wrapper import Wrapper, WrapperParams, plain_order

__all__ = ["VTC", "VTCParams", "TenantQueues", "tenant_of"]

_PREDICTED = tuple(s for s in STATS if s != "rank") + ("moving-average",)
_MA_WINDOW = 5  # the artifact's predict_window


class VTCParams(WrapperParams):
    inner: str = Field("fcfs", description="Orders requests within a tenant (a policy with a plain order, e.g. sjf).")
    w_in: float = Field(1.0, ge=0, allow_inf_nan=False, description="Service charged per prompt token (the paper's default 1).")
    w_out: float = Field(2.0, ge=0, allow_inf_nan=False, description="Service charged per output token (the paper's default 2).")
    weights: dict[str, Annotated[float, Field(gt=0, allow_inf_nan=False)]] = Field(
        default_factory=dict, max_length=100_000, description="Share of each tenant, {tenant: weight > 0}: its service is divided by it; tenants not listed weigh 1.",
    )  # fmt: skip
    charge_predicted: Literal[_PREDICTED] | None = Field(  # type: ignore[valid-type]
        None, description="Charge the predicted output at admission: moving-average (the artifact's per-tenant average of past lengths, window 5) or a statistic of seq.estimate; tokens are then charged only beyond the prediction and an over-charge is refunded at completion. None: charge tokens as generated.",
    )  # fmt: skip
    max_idle_tenants: int = Field(
        10_000, ge=0, le=10_000_000, description="Idle tenants (no request waiting or running) whose counters are kept; past it, those with the smallest counters are forgotten and come back as new tenants (lifted to the backlogged minimum, which is exact while their counter is below it). Bounds memory under tenant churn.",
    )  # fmt: skip


@POLICIES.register("vtc")
class VTC(Wrapper):
    name = "vtc"
    Params = VTCParams
    params: VTCParams

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        p = self.params
        if not plain_order(self.inner):
            raise ParamsError([("inner", f"{p.inner!r} has its own queue; vtc needs a plain order")])
        self.w_in, self.w_out, self.weights = p.w_in, p.w_out, dict(p.weights)
        self.charge_predicted = charge_predicted = p.charge_predicted
        self._predict = None
        if charge_predicted not in (None, "moving-average"):
            self._predict = total(charge_predicted)
        self.counters: dict[str, float] = {}  # tenant -> weighted service / weight
        self.service: dict[str, float] = {}  # tenant -> weighted service (not divided)
        self._charged: dict[int, float] = {}  # id(seq) -> output tokens charged in advance
        self._avg: dict[str, float] = {}  # tenant -> moving average of output lengths
        self._owed: dict[str, float] = {}  # tenant -> service of tokens not in its counter yet
        self._done = False  # a request completed since the counters were last settled
        self._queue: TenantQueues | None = None  # the waiting queue (`new_queue`)
        # per tenant, kept while it has requests, then among at most max_idle_tenants idle ones
        self.max_idle_tenants = p.max_idle_tenants
        self._first: dict[str, int] = {}  # tenant -> order of first appearance (ties)
        self._seen = itertools.count()
        self._live: dict[str, int] = {}  # tenant -> its requests arrived and not ended
        self._gone: list[str] = []  # tenants that may have gone idle since the last settle
        self._idle: dict[str, float] = {}  # idle tenant -> its counter
        self._idle_heap: list[tuple[float, int, str]] = []  # (counter, first, tenant), lazy

    def new_queue(self) -> TenantQueues:
        self._queue = TenantQueues(self)
        return self._queue

    def wakeup(self, now):
        """The inner policy's, asked about each tenant's waiting requests when it can be
        (`wakeup_among`, e.g. hrrn): its own wakeup sees every waiting request as one queue and
        misses a request overtaking the head of its tenant but not the overall first."""
        among, queue = getattr(self.inner, "wakeup_among", None), self._queue
        if among is None or queue is None:
            return self.inner.wakeup(now)
        times = [among(q, now) for q in queue.queues.values() if len(q) > 1]
        times = [t for t in times if t is not None]
        return min(times) if times else None

    def _charge(self, tenant: str, amount: float) -> None:
        share = self.weights.get(tenant, 1.0)
        self.service[tenant] = self.service.get(tenant, 0.0) + amount
        self.counters[tenant] = self.counters.get(tenant, 0.0) + amount / share

    def _settle(self) -> None:
        """At an event (module doc): add what was kept aside (tokens, refunds) to the
        counters; tenants whose last request ended become idle."""
        self._add_owed()
        self._done = False
        if self._gone:
            self._retire()

    def _add_owed(self) -> None:
        owed = self._owed
        if owed:
            for tenant, amount in owed.items():
                self._charge(tenant, amount)
            owed.clear()

    # --- tenants: kept while they have requests, a bounded number while idle -------------
    def _wake(self, tenant: str) -> None:
        """`tenant` has a request again (arrival, or back in the queue)."""
        self._idle.pop(tenant, None)
        if tenant not in self._first:
            self._first[tenant] = next(self._seen)

    def _ended(self, tenant: str) -> None:
        n = self._live.get(tenant, 0) - 1
        if n > 0:
            self._live[tenant] = n
        else:
            self._live.pop(tenant, None)
            self._gone.append(tenant)

    def _retire(self) -> None:
        """At a settle (an event): tenants with no request left become idle; past
        `max_idle_tenants` idle ones, forget those with the smallest counters (module doc)."""
        backlogged = self._queue.queues if self._queue is not None else {}
        for t in self._gone:
            if t not in self._live and t not in backlogged and t not in self._idle:
                c = self._idle[t] = self.counters.get(t, 0.0)
                heapq.heappush(self._idle_heap, (c, self._first.get(t, -1), t))
        self._gone.clear()
        excess = len(self._idle) - self.max_idle_tenants
        if excess > 0:
            self._forget(excess)

    def _forget(self, n: int) -> None:
        heap, idle = self._idle_heap, self._idle
        last = self._queue._last_left if self._queue is not None else None
        kept = None
        while n > 0 and heap:
            entry = heapq.heappop(heap)
            c, _, t = entry
            if idle.get(t) != c:
                continue  # stale: the tenant came back (and may be idle again with another c)
            if t == last:  # the lift reads its counter: keep it
                kept = entry
                continue
            del idle[t]
            for d in (self.counters, self.service, self._avg, self._first):
                d.pop(t, None)
            n -= 1
        if kept is not None:
            heapq.heappush(heap, kept)
        if len(heap) > 2 * len(idle) + 64:
            first = self._first
            self._idle_heap = [(c, first.get(t, -1), t) for t, c in idle.items()]
            heapq.heapify(self._idle_heap)

    # --- charging ----------------------------------------------------------------------
    def on_arrival(self, seq, now):
        tenant = tenant_of(seq)
        self._live[tenant] = self._live.get(tenant, 0) + 1
        self._wake(tenant)
        self._settle()
        self.inner.on_arrival(seq, now)

    def on_schedule(self, seq, now):
        self._settle()
        key = id(seq)
        if key not in self._charged:  # first admission (re-admissions after preemption are free)
            tenant = tenant_of(seq)
            pred = 0.0
            if self._predict is not None:
                pred = float(self._predict(seq))
            elif self.charge_predicted == "moving-average":
                pred = self._avg.get(tenant, 0.0)
            self._charged[key] = pred
            self._charge(tenant, self.w_in * seq.prompt_tokens + self.w_out * pred)
        self.inner.on_schedule(seq, now)

    def on_tokens(self, seq, num_tokens, now):
        pred = self._charged.get(id(seq), 0.0)
        g = seq.generated
        # tokens beyond the advance charge: max(0, g - pred) - max(0, g - n - pred)
        extra = max(0.0, g - pred) - max(0.0, g - num_tokens - pred)
        if extra:  # kept aside until the next event (module doc)
            tenant = tenant_of(seq)
            self._owed[tenant] = self._owed.get(tenant, 0.0) + self.w_out * extra
        self.inner.on_tokens(seq, num_tokens, now)

    def on_preempt(self, seq, now):
        self._settle()
        self.inner.on_preempt(seq, now)

    def on_finish(self, seq, now):
        pred = self._charged.pop(id(seq), 0.0)
        tenant, g = tenant_of(seq), seq.generated
        if pred > g:  # refund the over-charge
            self._owed[tenant] = self._owed.get(tenant, 0.0) - self.w_out * (pred - g)
        # the counters are complete after this completion; the step may still hand out tokens
        # to requests after it in its batch: the next decision settles again (`update`)
        self._add_owed()
        self._done = True
        if self.charge_predicted == "moving-average":
            old = self._avg.get(tenant, 0.0)
            self._avg[tenant] = g if old == 0 else (old * (_MA_WINDOW - 1) + g) / _MA_WINDOW
        self._ended(tenant)  # (idle from the next settle on, if it was its last request)
        self.inner.on_finish(seq, now)

    def on_cancel(self, seq, now):
        # the tenant keeps the charge for what it was served (prompt, generated tokens); the
        # advance charge for tokens it will not get is refunded; no moving-average sample
        pred = self._charged.pop(id(seq), 0.0)
        if pred > seq.generated:
            tenant = tenant_of(seq)
            self._owed[tenant] = self._owed.get(tenant, 0.0) - self.w_out * (pred - seq.generated)
        self._ended(tenant_of(seq))
        self._settle()
        self.inner.on_cancel(seq, now)

    def describe(self) -> str:
        return f"vtc({self.inner.describe()})"
