"""`Wrapper`: a policy that adds one concern (fair share, KV admission, fallback) on top of an
inner policy chosen by name, delegating every hook it does not change.

    POLICIES.create("kv-admission", inner="sjf", inner_params={"stat": "mean"})

Subclasses override the hooks they change and call `self.inner` for the rest. Delegation: the
decisions (priority, rekey_at, admit, victim, preempt_for, wakeup) go to `self.active`, the
notifications (attach, on_arrival, ...) to every policy in `self.members`; both are `(inner,)`
unless a subclass calls `delegate` (`fallback` switches `active` between two members). `oracle`
and `dynamic` are true if they are for any member; `epoch` is the inner policy's.

`inner_params` are checked by the inner policy's own model, so errors name the dotted path
(`inner_params.base_quantum: Input should be greater than 0`).
"""

from __future__ import annotations

from typing import Any, Sequence

from pydantic import Field, ValidationInfo, field_validator

from presched.registry import UnknownNameError
from presched.schedule.interface import EngineInfo, Policy
from presched.schedule.params import ParamsError, PolicyParams, validate_params
from presched.schedule.registry import POLICIES


def known_policy(name: str) -> str:
    """`name` if it is a registered policy, else a ValueError listing the known ones."""
    POLICIES.get(name)
    return name


def nested_params(value: dict[str, Any] | None, info: ValidationInfo, of: str) -> dict[str, Any] | None:
    """A validator body: `value` (the params of the policy in field `of`) checked by that
    policy's model; pydantic nests the paths (`inner_params.base_quantum`)."""
    if value is not None and info.data.get(of) is not None:
        validate_params(info.data[of], value)
    return value


class WrapperParams(PolicyParams):
    inner: str = Field("fcfs", description="The policy wrapped (any registered name): it orders the requests.")
    inner_params: dict[str, Any] | None = Field(None, description="Parameters of `inner`, checked by its own model (None: its defaults).")

    @field_validator("inner")
    @classmethod
    def _inner_known(cls, v: str) -> str:
        return known_policy(v)

    @field_validator("inner_params")
    @classmethod
    def _inner_params_ok(cls, v, info: ValidationInfo):
        return nested_params(v, info, "inner")


class Wrapper(Policy):
    name = "wrapper"
    Params = WrapperParams
    params: WrapperParams

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        p = self.params
        self.inner: Policy = create_policy("inner", p.inner, p.inner_params)
        self.delegate(self.inner, (self.inner,))

    def delegate(self, active: Policy, members: Sequence[Policy]) -> None:
        """Decisions go to `active`, notifications to every one of `members` (in order)."""
        self.active = active
        self.members = tuple(members)
        self.oracle = any(m.oracle for m in self.members)
        self.dynamic = any(m.dynamic for m in self.members)

    @property
    def epoch(self) -> int:  # type: ignore[override]
        return self.inner.epoch

    def new_queue(self):
        """The inner policy's own queue if it has one (e.g. per-tenant fair share, ordered by
        the inner policy), else a `WaitingQueue` keyed by this wrapper's `priority`."""
        if type(self.inner).new_queue is not Policy.new_queue:
            return self.inner.new_queue()
        return super().new_queue()

    # --- decisions: the active policy's ----------------------------------------------------
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

    # --- notifications: every member's ---------------------------------------------------
    def attach(self, engine: EngineInfo) -> None:
        for m in self.members:
            m.attach(engine)

    def on_arrival(self, seq, now):
        for m in self.members:
            m.on_arrival(seq, now)

    def on_schedule(self, seq, now):
        for m in self.members:
            m.on_schedule(seq, now)

    def on_tokens(self, seq, num_tokens, now):
        for m in self.members:
            m.on_tokens(seq, num_tokens, now)

    def on_preempt(self, seq, now):
        for m in self.members:
            m.on_preempt(seq, now)

    def on_finish(self, seq, now):
        for m in self.members:
            m.on_finish(seq, now)

    def on_cancel(self, seq, now):
        for m in self.members:
            m.on_cancel(seq, now)

    def describe(self) -> str:
        return f"{self.name}({self.inner.describe()})"


def create_policy(field: str, name: str, params: dict[str, Any] | None) -> Policy:
    """The policy `name` built with `params`, for the option `field` (and `field`_params) of a
    wrapper; a `ParamsError` whose paths start with the field."""
    try:
        return POLICIES.create(name, **(params or {}))
    except UnknownNameError as e:
        raise ParamsError([(field, str(e))]) from None
    except ParamsError as e:
        raise e.under(f"{field}_params") from None
    except TypeError as e:  # a policy class with its own keyword arguments
        raise ParamsError([(f"{field}_params", f"for {name!r}: {e}")]) from None


def plain_order(policy: Policy) -> bool:
    """True if the policy's queue is a `WaitingQueue` keyed by its own `priority` (so another
    policy can order by that priority, e.g. inside a tenant or after a mode switch)."""
    from presched.schedule.queue import WaitingQueue

    q = policy.new_queue()
    return isinstance(q, WaitingQueue) and q.policy is policy
