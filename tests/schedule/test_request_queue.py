"""The waiting-queue protocol (`schedule/request_queue.py`) and the abstract hooks of
`LimitedPreemption`: every queue a policy hands out keeps the `RequestQueue` contract."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from presched.schedule import POLICIES, WaitingQueue
from presched.schedule.limited_preemption import LimitedPreemption
from presched.schedule.request_queue import RequestQueue
from presched.schedule.vtc import TenantQueues

PARAMS = {"slo": {"e2e_slo_s": 10.0}}


def test_the_protocol_is_abstract_and_complete():
    with pytest.raises(TypeError, match="abstract"):
        RequestQueue()  # type: ignore[abstract]
    for cls in (WaitingQueue, TenantQueues):
        assert issubclass(cls, RequestQueue) and not cls.__abstractmethods__


@pytest.mark.parametrize("name", POLICIES.names())
def test_every_policy_hands_out_a_request_queue(name):
    policy = POLICIES.create(name, **PARAMS.get(name, {}))
    q = policy.new_queue()
    assert isinstance(q, RequestQueue)
    assert isinstance(q, TenantQueues) == (name == "vtc")


def seq(i: int, tenant: str) -> SimpleNamespace:
    return SimpleNamespace(request=SimpleNamespace(id=f"r{i}", tenant=tenant), arrival=float(i),
                           prompt_tokens=8, generated=0, estimate=None, preemptions=0)  # fmt: skip


ops = st.lists(st.tuples(st.sampled_from(["push", "pop", "remove"]), st.integers(0, 11),
                         st.sampled_from(["a", "b", "c"])), max_size=40)  # fmt: skip


@settings(max_examples=60, deadline=None)
@given(ops=ops, policy=st.sampled_from(["fcfs", "vtc"]))
def test_a_queue_holds_exactly_what_was_pushed_and_not_taken_out(ops, policy):
    pol = POLICIES.create(policy)
    q = pol.new_queue()
    seqs = {i: seq(i, t) for i, (_, _, t) in enumerate(ops)}
    waiting: dict[int, SimpleNamespace] = {}
    for k, (op, j, _) in enumerate(ops):
        q.update(float(k))
        if op == "push":
            waiting[id(seqs[k])] = seqs[k]
            q.push(seqs[k], float(k))
        elif op == "pop":
            if not waiting:
                with pytest.raises(IndexError):
                    q.pop()
                continue
            head = q.peek()
            assert q.pop() is head and id(head) in waiting
            if policy == "fcfs":  # the earliest arrival of those waiting
                assert head.arrival == min(s.arrival for s in waiting.values())
            del waiting[id(head)]
        else:
            victim = list(waiting.values())[j % len(waiting)] if waiting else seq(99, "a")
            if id(victim) in waiting:
                q.remove(victim)
                del waiting[id(victim)]
            else:
                with pytest.raises(KeyError):
                    q.remove(victim)
        assert len(q) == len(waiting) and bool(q) == bool(waiting)
        assert {id(s) for s in q} == set(waiting)
        assert all(s in q for s in waiting.values())
        assert (q.peek() is None) == (not waiting)


def test_limited_preemption_requires_its_hooks():
    class NoInitial(LimitedPreemption):
        def size(self, seq):
            return 1.0

    with pytest.raises(TypeError, match="abstract.*initial"):
        NoInitial()

    class Both(NoInitial):
        def initial(self, seq):
            return 1.0

    assert Both(c_frac=0.5).c_frac == 0.5
