"""The gateway's start-up check of its policy: run the whole lifecycle the gateway drives on
probe requests, so that a policy that cannot work with this configuration is refused at start
with an error naming the field, instead of failing every request later.

    check_policy(make, engine, mode, predicts, tenant, model)   # raises ValueError
    attach_error(i, e)     # the message when `attach` refused backend i's engine (Gateway)

`make()` builds a fresh policy (the backends' own objects stay untouched). The probe runs, on a
fresh policy attached to `engine`, exactly the hooks and queue calls the gateway makes:

    queue mode:   attach, new_queue; two requests: on_arrival, push (priority, rekey_at),
                  priority; update, peek, admit, pop, on_schedule, on_tokens, wakeup;
                  the second: admit (with the first running), remove, on_cancel;
                  the first: on_finish; a third: on_arrival, push, pop, on_schedule,
                  on_tokens, on_cancel (a running request whose client left)
    passthrough:  attach; on_arrival, on_schedule, on_tokens, on_finish; on_arrival, on_cancel

Probe requests carry a forced length (`target`, as oracle policies need) and, when the gateway
has a predictor (`predicts`), a length estimate; no SLOs (the HTTP API sends none).

Errors: a policy that needs predictions without a predictor -> `predictor: ...`; a ValueError
naming an option (`field 'X'`) -> `policy_params.X: ...`; anything else -> `policy: ...`.
"""

from __future__ import annotations

import re
from typing import Callable

import numpy as np

from presched.predict.estimate import LEVELS, LengthEstimate
from presched.schedule.interface import EngineInfo, Policy
from presched.serve.seq import GatewaySeq
from presched.workload.request import Request

_FIELD = re.compile(r"field '([A-Za-z_][A-Za-z0-9_]*)'")


def probe_estimate(median: float = 64.0):
    """A plausible length estimate (quantiles spread around `median`) for probe requests."""
    q = np.array([[median * (0.25 + 1.5 * p) for p in LEVELS]])
    return LengthEstimate.from_quantiles(q)[0]


def probe_seq(i: int, tenant: str, model: str, predicts: bool) -> GatewaySeq:
    req = Request(id=f"presched-probe-{i}", prompt_tokens=16, tenant=tenant, model=model,
                  max_tokens=32)
    return GatewaySeq(req, 0.0, 0.0, target=32, estimate=probe_estimate() if predicts else None)


def check_policy(make: Callable[[], Policy], engine: EngineInfo, mode: str, predicts: bool,
                 tenant: str = "default", model: str = "") -> None:  # fmt: skip
    """Run the gateway's lifecycle on probe requests; raise ValueError naming the field."""
    policy = make()
    step = ["attach"]
    try:
        seqs = [probe_seq(i, tenant, model, predicts) for i in range(3)]
        _lifecycle(policy, engine, mode, seqs, step)
    except Exception as e:  # noqa: BLE001 - every failure is reported, naming the field
        raise ValueError(explain(policy.name, step[0], e, predicts)) from None


def explain(name: str, hook: str, e: Exception, predicts: bool) -> str:
    """The start-up error for policy `name` failing in `hook` with `e`."""
    msg = str(e)
    if "no length prediction" in msg and not predicts:
        return (f"predictor: policy {name!r} reads length predictions ({hook} failed without "
                "one); set predictor (a file from `presched train`) or choose another policy")  # fmt: skip
    m = _FIELD.search(msg) if isinstance(e, ValueError) else None
    if m is not None:
        return f"policy_params.{m.group(1)}: policy {name!r} cannot run here ({hook}): {msg}"
    why = f"{type(e).__name__}: {msg}"
    return f"policy: {name!r} failed the gateway's start-up check in {hook}: {why}"


def attach_error(i: int, e: ValueError) -> str:
    """The start-up error of a policy whose `attach` refused backend `i`'s engine, naming the
    option its message names (`field 'X'`; kv_tokens can also be set on the backend)."""
    m = _FIELD.search(str(e))
    if m is None:
        return f"backends[{i}] (or policy_params): {e}"
    name = m.group(1)
    also = f" (or backends[{i}].kv_tokens)" if name == "kv_tokens" else ""
    return f"policy_params.{name}{also}: {e}"


def _lifecycle(policy: Policy, engine: EngineInfo, mode: str, seqs: list[GatewaySeq],
               step: list) -> None:  # fmt: skip
    a, b, c = seqs
    now = 0.0

    def call(hook: str, *args):
        step[0] = hook
        return getattr(policy, hook)(*args)

    call("attach", engine)
    if mode == "passthrough":
        for s, end in ((a, "on_finish"), (b, "on_cancel")):
            call("on_arrival", s, now)
            if end == "on_finish":
                s.first_scheduled = now
                call("on_schedule", s, now)
                s.generated += 1
                call("on_tokens", s, 1, now)
            call(end, s, now)
        return
    step[0] = "new_queue"
    q = policy.new_queue()
    for s in (a, b):
        call("on_arrival", s, now)
        step[0] = "priority"  # the queue's push calls priority and rekey_at
        q.push(s, now)
        call("priority", s, now)
    step[0] = "priority"  # update re-keys due requests
    q.update(now)
    head = q.peek()
    other = b if head is a else a
    call("admit", head, [], now)
    q.pop()
    head.first_scheduled = now
    call("on_schedule", head, now)
    head.generated += 1
    call("on_tokens", head, 1, now)
    call("wakeup", now)
    q.update(now)
    call("admit", q.peek(), [head], now)
    q.remove(other)
    call("on_cancel", other, now)
    call("on_finish", head, now)
    call("on_arrival", c, now)
    step[0] = "priority"
    q.push(c, now)
    q.pop()
    call("on_schedule", c, now)
    c.generated += 1
    call("on_tokens", c, 1, now)
    call("on_cancel", c, now)
