from __future__ import annotations

import gc
import weakref
from types import SimpleNamespace

import pytest

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


class Promote(Policy):
    """Score order; a request that waited 10 s is promoted ahead of all unpromoted ones."""

    def priority(self, s, now):
        return (0, s.arrival) if now - s.arrival >= 10 else (1, s.target)

    def rekey_at(self, s, now):
        return s.arrival + 10 if now - s.arrival < 10 else None


def test_rekey_at_promotes_exactly_at_its_time():
    q = WaitingQueue(Promote())
    old, short = seq(0, 0.0, target=500), seq(1, 5.0, target=1)
    q.push(old, 0.0)
    q.push(short, 5.0)
    assert q.next_rekey() == 10.0
    q.update(9.99)
    assert q.peek() is short
    q.update(10.0)
    assert q.peek() is old and len(q) == 2
    assert q.next_rekey() == 15.0  # short's own promotion time


def test_rekey_timer_of_a_removed_request_is_ignored():
    q = WaitingQueue(Promote())
    a = seq(0, 0.0, target=500)
    q.push(a, 0.0)
    q.remove(a)
    assert q.next_rekey() == float("inf") and not q
    q.update(20.0)
    assert not q and q.peek() is None


def test_epoch_bump_rekeys_once():
    class Switch(Policy):
        flip = False

        def priority(self, s, now):
            return -s.target if self.flip else s.target

    p = Switch()
    q = WaitingQueue(p)
    a, b = seq(0, 0.0, target=1), seq(1, 0.0, target=9)
    q.push(a, 0.0)
    q.push(b, 0.0)
    assert q.peek() is a
    p.flip = True
    q.update(1.0)
    assert q.peek() is a  # same epoch: keys kept
    p.epoch += 1
    q.update(1.0)
    assert q.peek() is b and len(q) == 2



@pytest.mark.parametrize("keep_every", [1000, 7, 3, 2])
def test_removed_requests_are_not_kept_while_the_head_stays(keep_every):
    """A head that never leaves (a held slot) and 1,000 arrivals behind it, most removed again
    (their clients left): the queue drops its stale entries (the removed requests are freed)
    and still pops in exactly the order of a queue that never had them. Fails if `remove`
    leaves its entry in the heap until it reaches the head."""

    class Tracked(SimpleNamespace):
        pass

    q, ref = WaitingQueue(POLICIES.create("sjf-oracle")), WaitingQueue(POLICIES.create("sjf-oracle"))
    head = Tracked(id="head", arrival=-1.0, target=0, generated=0)
    q.push(head, 0.0)
    ref.push(head, 0.0)
    gone = []
    for i in range(1000):
        s = Tracked(id=f"r{i}", arrival=float(i), target=(i * 7) % 13, generated=0)
        q.push(s, 0.0)
        if i % keep_every:
            q.remove(s)
            gone.append(weakref.ref(s))
        else:
            ref.push(s, 0.0)
        del s
    gc.collect()
    assert sum(r() is not None for r in gone) <= 64 + len(q)  # at most the slack is kept
    assert len(q._heap) <= 2 * len(q) + 64
    assert [q.pop() for _ in range(len(q))] == [ref.pop() for _ in range(len(ref))]


class _NoneFor(Policy):
    """FCFS, but a request with target 0 gets the key None (a policy bug)."""

    name = "none-for"

    def priority(self, seq, now):
        return None if seq.target == 0 else seq.arrival


def test_a_key_that_cannot_be_ordered_is_refused_before_the_heap_is_touched():
    """heapq appended the bad entry before comparing: the push raised, but the next pop
    compared against None and raised too (an engine plugin's pop is not guarded)."""
    q = WaitingQueue(_NoneFor())
    q.push(seq(0, 1.0), 0.0)
    with pytest.raises(TypeError):
        q.push(seq(1, 0.5, target=0), 0.0)
    q.push(seq(2, 2.0), 0.0)
    assert [q.pop().id for _ in range(2)] == ["r0", "r2"] and not q


def test_a_tenant_whose_first_request_fails_its_key_leaves_no_empty_queue():
    """vtc(inner=...): the tenant's queue was registered before the push raised; its head (None)
    then broke every decision (the engine plugin fell back to FCFS for good)."""
    vtc = POLICIES.create("vtc")
    q = vtc.new_queue()
    vtc.priority = lambda s, now: None if s.target == 0 else s.arrival  # the inner policy's key
    bad = SimpleNamespace(id="x", arrival=0.0, target=0, generated=0, request=SimpleNamespace(tenant="c"))
    with pytest.raises(TypeError):
        q.push(bad, 0.0)
    assert "c" not in q.queues and len(q) == 0
    good = SimpleNamespace(id="y", arrival=1.0, target=5, generated=0, request=SimpleNamespace(tenant="a"))
    q.push(good, 0.0)
    q.update(0.0)
    assert q.peek() is good
