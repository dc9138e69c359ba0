"""`Wrapper`: a policy that adds one concern (fair share, KV admission, fallback) on top of an
inner policy chosen by name, delegating every hook it does not change.

    POLICIES.create("kv-admission", inner="sjf", inner_params={"stat": "mean"})

Subclasses override the hooks they change and call `self.inner` for the rest. `oracle` and
`dynamic` are the inner policy's.
"""

from __future__ import annotations

from typing import Any

from presched.registry import UnknownNameError
from presched.schedule.interface import EngineInfo, Policy
from presched.schedule.registry import POLICIES


class Wrapper(Policy):
    name = "wrapper"

    def __init__(self, inner: str = "fcfs", inner_params: dict[str, Any] | None = None) -> None:
        self.inner: Policy = create_policy("inner", inner, inner_params)
        self.oracle = self.inner.oracle
        self.dynamic = self.inner.dynamic

    @property
    def epoch(self) -> int:  # type: ignore[override]
        return self.inner.epoch

    def new_queue(self):
        """The inner policy's own queue if it has one (e.g. per-tenant fair share, ordered by
        the inner policy), else a `WaitingQueue` keyed by this wrapper's `priority`."""
        if type(self.inner).new_queue is not Policy.new_queue:
            return self.inner.new_queue()
        return super().new_queue()

    def attach(self, engine: EngineInfo) -> None:
        self.inner.attach(engine)

    def priority(self, seq, now):
        return self.inner.priority(seq, now)

    def rekey_at(self, seq, now):
        return self.inner.rekey_at(seq, now)

    def admit(self, seq, running, now):
        return self.inner.admit(seq, running, now)

    def victim(self, candidates, now):
        return self.inner.victim(candidates, now)

    def preempt_for(self, candidate, running, now):
        return self.inner.preempt_for(candidate, running, now)

    def wakeup(self, now):
        return self.inner.wakeup(now)

    def on_arrival(self, seq, now):
        self.inner.on_arrival(seq, now)

    def on_schedule(self, seq, now):
        self.inner.on_schedule(seq, now)

    def on_tokens(self, seq, num_tokens, now):
        self.inner.on_tokens(seq, num_tokens, now)

    def on_preempt(self, seq, now):
        self.inner.on_preempt(seq, now)

    def on_finish(self, seq, now):
        self.inner.on_finish(seq, now)

    def on_cancel(self, seq, now):
        self.inner.on_cancel(seq, now)

    def describe(self) -> str:
        return f"{self.name}({self.inner.describe()})"


def create_policy(field: str, name: str, params: dict[str, Any] | None) -> Policy:
    """The policy `name` built with `params`, for the option `field` (and `field`_params) of a
    wrapper; errors name the field."""
    try:
        return POLICIES.create(name, **(params or {}))
    except UnknownNameError as e:
        raise ValueError(f"field '{field}': {e}") from None
    except TypeError as e:
        raise ValueError(f"field '{field}_params' for {name!r}: {e}") from None


def plain_order(policy: Policy) -> bool:
    """True if the policy's queue is a `WaitingQueue` keyed by its own `priority` (so another
    policy can order by that priority, e.g. inside a tenant or after a mode switch)."""
    from presched.schedule.queue import WaitingQueue

    q = policy.new_queue()
    return isinstance(q, WaitingQueue) and q.policy is policy
