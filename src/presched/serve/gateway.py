"""`Gateway`: the gateway's decisions, free of any HTTP framework (the ASGI app in `app.py` is
one front; an Envoy ext_proc front can call the same object).

Life of a request (who calls what):

    seq = gw.accept(request, target)      # app: after parsing; predicts; GatewayError 429 / 503
    backend = await gw.wait(seq)          # queue mode: until the policy releases it to a slot
    ... app sends it to backend.url; per stream event seq.on_token(gw.now()), gw.tokens(seq, k)
    gw.finish(seq, output_tokens)         # or gw.failed(seq) before the first byte (retried on
                                          # another backend), or gw.cancel(seq) (client left)

Queue mode: each backend has its own policy object and waiting queue (as each simulated
instance does); the router picks the backend at arrival; `dispatch` releases the head of the
queue while the backend has fewer than `max_in_flight` requests and the policy's `admit` agrees.
Decisions happen at arrivals and completions, plus at `Policy.wakeup` times. The gateway never
preempts a request the engine is running (it cannot take it back without losing its work). A
request that leaves before finishing (client gone, moved off a backend that went down or failed
it) is told to its old backend's policy with `on_cancel`; one that completes with `on_finish`.

Queue shares (`tenants.QueueShares`): a tenant may have at most its share of `max_queue`
waiting (proportional to its weight); over it, it gets 429 while the others are still accepted.

Policy errors: the start-up check (`probe.py`) runs the policy's lifecycle on probe requests
and refuses a policy that cannot run here. A hook that still raises is counted (`policy_errors`)
and logged; a request not yet released leaves its queue and slot and its `wait` raises
`PolicyError` (500); see docs/gateway.md.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from typing import Any, Callable

from presched.predict.tracker import ErrorTracker
from presched.schedule.lengths import total
from presched.schedule.params import ParamsError
from presched.schedule.registry import POLICIES
from presched.schedule.routers import ROUTERS
from presched.serve.backend import Backend
from presched.serve.config import ServeConfig
from presched.serve.errors import GatewayError
from presched.serve.faults import PolicyFaults
from presched.serve.probe import attach_error, check_policy
from presched.serve.seq import GatewaySeq
from presched.serve.tenants import QueueShares
from presched.workload.request import Request

_log = logging.getLogger("presched.serve")


class Gateway(PolicyFaults):
    def __init__(self, cfg: ServeConfig, predicts: bool = False,
                 clock: Callable[[], float] = time.monotonic,
                 drift_alarm: Callable[[], bool] | None = None) -> None:  # fmt: skip
        """`predicts`: whether requests come with length estimates (a predictor is loaded);
        `drift_alarm`: reads the online learner's drift alarm (`--learn`), given to each
        backend's policy in its `EngineInfo` (the `fallback` policy reads it)."""
        self.cfg = cfg
        self.clock = clock
        self._t0 = clock()
        params = dict(cfg.policy_params)
        if cfg.policy == "vtc" and cfg.tenants and "weights" not in params:
            params["weights"] = {t.name: t.weight for t in cfg.tenants}
        self._params = params
        self._drift_alarm = drift_alarm
        self.backends = []
        for i, b in enumerate(cfg.backends):
            policy = self._new_policy()
            try:
                self.backends.append(Backend(i, b, policy, drift_alarm))
            except ValueError as e:  # what the policy needs of the engine (e.g. kv_tokens)
                raise ValueError(attach_error(i, e)) from None
        try:
            self.router = ROUTERS.create(cfg.router, **cfg.router_params)
        except ParamsError as e:
            raise ValueError(str(e.under("router_params"))) from None
        except (TypeError, ValueError) as e:
            raise ValueError(f"router_params: {e}") from None
        self.oracle = self.backends[0].policy.oracle or self.router.oracle
        b0 = self.backends[0]
        check_policy(self._new_policy, b0.engine, cfg.mode, predicts,
                     cfg.tenants[0].name if cfg.tenants else "default", b0.model or "")  # fmt: skip
        self.shares = QueueShares(cfg.tenants, cfg.max_queue)  # tenant -> waiting, and its cap
        self.policy_errors = 0  # hooks that raised at run time
        self.tracker = ErrorTracker()
        self._priority_of = total(cfg.priority_stat)
        self._wakeups: dict[int, asyncio.TimerHandle] = {}
        self.accepted = 0  # requests admitted by `accept`
        self.finished = 0  # ... that completed on a backend (200)
        self.ended = 0  # ... whose outcome is fully recorded (metrics, log row): the driver counts

    def _new_policy(self):
        try:
            return POLICIES.create(self.cfg.policy, **self._params)
        except ParamsError as e:  # names the dotted path: policy_params.inner_params.x
            raise ValueError(str(e.under("policy_params"))) from None
        except (TypeError, ValueError) as e:
            raise ValueError(f"policy_params: {e}") from None

    def now(self) -> float:
        """Seconds since the gateway started: the clock policies see."""
        return self.clock() - self._t0

    @property
    def num_waiting(self) -> int:
        return sum(len(b.queue) for b in self.backends)

    # --- arrival ----------------------------------------------------------------------------
    def accept(self, request: Request, target: int | None = None, estimate: Any = None) -> GatewaySeq:
        """Admit a parsed request: route it and, in queue mode, queue it (then `wait`).
        Raises GatewayError: 429 when the queue or the tenant's share of it is full, 503 when
        no backend is healthy, 400 when an oracle policy gets a request without a forced
        length. A policy hook that fails for the request surfaces in `wait` (PolicyError)."""
        if self.oracle and target is None:
            raise GatewayError(400, f"policy {self.cfg.policy!r} / router {self.cfg.router!r} "
                               "reads true lengths: send ignore_eos=true with max_tokens",
                               kind="invalid_request_error", param="ignore_eos")  # fmt: skip
        if self.cfg.mode == "queue":
            if self.num_waiting >= self.cfg.max_queue:
                raise GatewayError(429, f"the gateway queue is full ({self.cfg.max_queue} waiting)",
                                   kind="rate_limit_error", retry_after=self._retry_after())  # fmt: skip
            share = self.shares.share(request.tenant)
            if self.shares.waiting(request.tenant) >= share:
                raise GatewayError(429, f"tenant {request.tenant!r} has its share of the gateway "
                                   f"queue waiting ({share} of max_queue {self.cfg.max_queue})",
                                   kind="rate_limit_error", retry_after=self._retry_after())  # fmt: skip
        now = self.now()
        seq = GatewaySeq(request, now, time.time(), target, estimate)
        self._place(seq, now)
        self.accepted += 1
        return seq

    def _candidates(self, seq: GatewaySeq) -> list[Backend]:
        model = seq.request.model
        return [b for b in self.backends
                if b.healthy and b.index not in seq.tried and (not model or not b.model or b.model == model)]  # fmt: skip

    def _place(self, seq: GatewaySeq, now: float) -> None:
        """Route `seq` to a healthy backend and queue (or start) it there."""
        ok = self._candidates(seq)
        if not ok:
            raise GatewayError(503, "no healthy backend serves model "
                               f"{seq.request.model!r}" + (" (others failed this request)" if seq.tried else ""))  # fmt: skip
        if seq.routed >= 0 and self.backends[seq.routed] not in ok:
            self._route_done(seq, finished=False)  # the router's record leaves a backend it cannot use
        if seq.routed < 0:
            # the router chooses among the candidates only, so its records (prefixes sent, work)
            # are of the backend the request actually goes to
            seq.routed = self.router.route(seq, self.backends, now, [b.index for b in ok])
        b = self.backends[seq.routed]
        if b not in ok:
            raise RuntimeError(f"router {self.cfg.router!r} chose backend {seq.routed}, not one of "
                               f"the candidates {[x.index for x in ok]}")  # fmt: skip
        seq.instance = b.index
        if seq.released is None or seq.released.done():  # a moved request keeps its waiter
            seq.released = asyncio.get_running_loop().create_future()
        hook = "on_arrival"
        try:
            b.policy.on_arrival(seq, now)
            if self.cfg.mode == "passthrough":
                hook = "priority_stat"
                seq.key = float(round(self._priority_of(seq))) if seq.estimate is not None else 0.0
                self._start(b, seq, now)
                return
            hook = "priority"
            self._push(b, seq, now)
            seq.key = b.policy.priority(seq, now)
        except Exception as e:  # noqa: BLE001 - the request is failed, the gateway goes on
            self._fault(b, seq, hook, e)
            return
        self.dispatch(b)

    async def wait(self, seq: GatewaySeq) -> Backend:
        """Until `seq` may go to its backend (at once in passthrough mode)."""
        return await seq.released  # type: ignore[misc]

    # --- decisions --------------------------------------------------------------------------
    def dispatch(self, b: Backend) -> None:
        """Release waiting requests of `b` in policy order while it has free slots."""
        if self.cfg.mode != "queue" or not b.healthy:
            return
        now = self.now()
        q, policy = b.queue, b.policy
        try:
            q.update(now)
            while q and len(b.running) < b.max_in_flight:
                head = q.peek()
                if head.released.done():  # its client left (task cancelled): it leaves now
                    self._pop(b)
                    self._cancelled(b, head, now)
                    continue
                try:
                    ok = policy.admit(head, b.running, now)
                except Exception as e:  # noqa: BLE001
                    self._fault(b, head, "admit", e)
                    continue
                if not ok:
                    break
                self._start(b, self._pop(b), now)
        except Exception as e:  # noqa: BLE001 - the queue itself failed (a re-key, a peek)
            self._fault_queue(b, e)
        self._arm_wakeup(b, now)

    def _start(self, b: Backend, seq: GatewaySeq, now: float) -> None:
        if seq.first_scheduled is None:
            seq.first_scheduled = now
        b.running.append(seq)
        try:
            b.policy.on_schedule(seq, now)
        except Exception as e:  # noqa: BLE001
            self._fault(b, seq, "on_schedule", e)
            return
        seq.released.set_result(b)  # type: ignore[union-attr]

    def _arm_wakeup(self, b: Backend, now: float) -> None:
        """Decide again at the policy's next `wakeup` or the queue's next re-key, whichever
        comes first (a head that `admit` refused may be admitted then)."""
        try:
            w = b.policy.wakeup(now)
        except Exception as e:  # noqa: BLE001 - no wakeup; the next event decides
            self._policy_error(b, None, "wakeup", e)
            w = None
        t = min(math.inf if w is None else w, b.queue.next_rekey())
        old = self._wakeups.pop(b.index, None)
        if old is not None:
            old.cancel()
        if math.isfinite(t) and b.queue and len(b.running) < b.max_in_flight:
            loop = asyncio.get_running_loop()
            self._wakeups[b.index] = loop.call_later(max(t - now, 0.0), self.dispatch, b)

    # --- outcomes ---------------------------------------------------------------------------
    def finish(self, seq: GatewaySeq, output_tokens: int | None) -> None:
        """The request completed on its backend; `output_tokens` from the engine's usage (None
        if it sent none: `seq.generated` keeps the count of streamed events, and the prediction
        error tracker skips the request)."""
        now = self.now()
        seq.finish = now
        b = self.backends[seq.instance]
        if output_tokens is not None and output_tokens > seq.generated:
            # tokens the stream did not show one by one (a whole response; merged events):
            # counted first, as the simulator does, then told (`on_tokens` reads the new count)
            n, seq.generated = output_tokens - seq.generated, output_tokens
            self.tokens(seq, n)
        if output_tokens is not None:
            seq.generated = output_tokens
        self._leave(b, seq, finished=True)
        b.served += 1
        if seq.estimate is not None and output_tokens:
            self.tracker.add(seq.estimate, output_tokens)
        self.finished += 1
        self.dispatch(b)

    def tokens(self, seq: GatewaySeq, n: int) -> None:
        """`seq` produced `n` more output tokens (the driver counts stream events; `finish`
        adds what usage says the events did not show): policies that charge or demote by
        tokens served (vtc, mlfq) hear it as in the simulator."""
        b = self.backends[seq.instance]
        try:
            b.policy.on_tokens(seq, n, self.now())
        except Exception as e:  # noqa: BLE001 - the request is streaming: it goes on
            self._policy_error(b, seq, "on_tokens", e)

    def failed(self, seq: GatewaySeq, mark_down: bool = True) -> None:
        """The backend refused or timed out before the first byte: free the slot, mark the
        backend down (health checks bring it back) and place the request on another healthy
        backend (then `wait` again). Raises GatewayError(502/503) when none is left."""
        b = self.backends[seq.instance]
        self._leave(b, seq, finished=False)
        seq.tried.add(b.index)
        if mark_down:
            self.set_health(b, False)
        if len(seq.tried) > self.cfg.retries:
            raise GatewayError(502, f"backend {b.name} failed before responding and "
                               f"{len(seq.tried)} backends were tried")  # fmt: skip
        self._place(seq, self.now())

    def cancel(self, seq: GatewaySeq) -> None:
        """The client went away: drop `seq` from its queue or free its slot."""
        if seq.instance < 0:
            return
        b = self.backends[seq.instance]
        if seq in b.queue:
            self._remove(b, seq)
            self._cancelled(b, seq, self.now())
        else:
            self._leave(b, seq, finished=False)
            self.dispatch(b)
        if seq.released is not None and not seq.released.done():
            seq.released.cancel()

    def _leave(self, b: Backend, seq: GatewaySeq, finished: bool) -> None:
        """`seq` stops running on `b`: the policy hears `on_finish` if it completed, else
        `on_cancel` (failed, or its client left); the router retires it."""
        if seq not in b.running:
            return
        b.running.remove(seq)
        if not finished:
            self._cancelled(b, seq, self.now())
            return
        try:
            b.policy.on_finish(seq, self.now())
        except Exception as e:  # noqa: BLE001 - its slot is free already
            self._policy_error(b, seq, "on_finish", e)
        self._route_done(seq, finished=True)

    def _cancelled(self, b: Backend, seq: GatewaySeq, now: float) -> None:
        """`seq` left `b` before finishing (no longer queued or running there)."""
        try:
            b.policy.on_cancel(seq, now)
        except Exception as e:  # noqa: BLE001
            self._policy_error(b, seq, "on_cancel", e)
        self._route_done(seq, finished=False)

    # --- the queues, with the per-tenant count of waiting requests ----------------------------
    def _push(self, b: Backend, seq: GatewaySeq, now: float) -> None:
        b.queue.push(seq, now)
        self.shares.add(seq.tenant)

    def _pop(self, b: Backend) -> GatewaySeq:
        seq = b.queue.pop()
        self.shares.sub(seq.tenant)
        return seq

    def _remove(self, b: Backend, seq: GatewaySeq) -> None:
        b.queue.remove(seq)
        self.shares.sub(seq.tenant)

    def _route_done(self, seq: GatewaySeq, finished: bool) -> None:
        """The router hears `on_finish` (completed) or `on_cancel` (left unfinished)."""
        if seq.routed >= 0:
            hook = self.router.on_finish if finished else self.router.on_cancel
            hook(seq, seq.routed, self.now())
            seq.routed = -1

    # --- health -----------------------------------------------------------------------------
    def set_health(self, b: Backend, healthy: bool) -> None:
        """Health checks and request failures call this. A backend that goes down hands its
        waiting requests to the others (or keeps them, if none is up, until one comes back)."""
        if healthy == b.healthy:
            return
        b.healthy = healthy
        if healthy:
            self._unhold(b)
            self.dispatch(b)
            return
        moved = [s for s in b.queue]
        moved.sort(key=lambda s: s.arrival)
        for s in moved:
            if not self._candidates(s):
                continue
            self._remove(b, s)
            self._cancelled(b, s, self.now())
            self._place(s, self.now())

    def _unhold(self, b: Backend) -> None:
        """`b` is back: requests held in the queues of down backends (no healthy backend could
        take them) are placed again; `b` may now take even those it failed while it was down."""
        for o in self.backends:
            if o is b or o.healthy:
                continue
            for s in sorted(o.queue, key=lambda s: s.arrival):
                if s.released is not None and s.released.done():
                    continue  # its client left: its `cancel` is on the way
                s.tried.discard(b.index)
                if not self._candidates(s):
                    continue
                self._remove(o, s)
                self._cancelled(o, s, self.now())
                self._place(s, self.now())

    def _retry_after(self) -> float:
        """Seconds a client refused for a full queue should wait: a fixed 1 s hint (the
        gateway does not predict when the queue will have room)."""
        return 1.0

    def snapshot(self) -> dict[str, Any]:
        """State for /health and /metrics."""
        return {
            "accepted": self.accepted, "finished": self.finished, "waiting": self.num_waiting,
            "policy_errors": self.policy_errors,
            "backends": [{"name": b.name, "url": b.url, "healthy": b.healthy,
                          "running": b.num_running, "waiting": b.num_waiting, "served": b.served}
                         for b in self.backends],
            "predictor": self.tracker.snapshot() if self.tracker.n else {},
        }  # fmt: skip
