from __future__ import annotations

from types import SimpleNamespace

from hypothesis import given
from hypothesis import strategies as st

from presched.schedule import POLICIES, Policy, WaitingQueue


def seq(i, arrival, target=10):
    return SimpleNamespace(id=f"r{i}", arrival=arrival, target=target, generated=0)


@given(st.lists(st.tuples(st.floats(0, 100), st.integers(1, 1000)), min_size=1, max_size=50))
def test_pops_in_priority_then_arrival_order(items):
    q = WaitingQueue(POLICIES.create("sjf-oracle"))
    seqs = [seq(i, a, t) for i, (a, t) in enumerate(items)]
    for s in seqs:
        q.push(s, 0.0)
    out = [q.pop() for _ in range(len(q))]
    assert [(s.target, s.arrival, int(s.id[1:])) for s in out] == sorted(
        (s.target, s.arrival, int(s.id[1:])) for s in seqs
    )
    assert not q and q.peek() is None


def test_remove_is_lazy_but_exact():
    q = WaitingQueue(POLICIES.create("fcfs"))
    a, b, c = seq(0, 0.0), seq(1, 1.0), seq(2, 2.0)
    for s in (a, b, c):
        q.push(s, 0.0)
    q.remove(a)
    q.remove(c)
    assert len(q) == 1 and q.peek() is b and list(q) == [b]
    assert q.pop() is b and len(q) == 0


def test_refresh_reorders_dynamic_priorities():
    class Deadline(Policy):
        dynamic = True

        def priority(self, s, now):
            return -(now - s.arrival) * s.target  # weight waiting time by size

    q = WaitingQueue(Deadline())
    a, b = seq(0, 0.0, target=1), seq(1, 5.0, target=100)
    q.push(a, 5.0)
    q.push(b, 5.0)
    assert q.peek() is a
    q.refresh(10.0)  # now b: -(5)*100 = -500 < a: -(10)*1
    assert q.peek() is b
