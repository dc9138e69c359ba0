"""Preemption for the head of the waiting queue (sim/scheduler.py `_victims_for`): the victims
`preempt_for` names are preempted only if the head then starts (a slot, its blocks, `admit`
against the batch without them), and it starts at once; else nobody is. Hand cases (1 s steps)
and a property."""

from __future__ import annotations

import signal
from statistics import NormalDist

import numpy as np
import pytest
from builders import make_engine, make_estimates, make_requests, run_engine
from hypothesis import given, settings
from hypothesis import strategies as st

from presched.predict.estimate import LEVELS, LengthEstimate
from presched.predict.noisy_oracle import noisy_oracle
from presched.schedule import POLICIES
from presched.workload.prefix import with_hashes
from presched.workload.request import Request


def timeline(seqs):
    return [(s.first_scheduled, s.finish, s.preemptions) for s in seqs]


@pytest.mark.parametrize("name", ["srpt-oracle", "srpt"])
def test_no_request_is_preempted_for_a_head_that_still_could_not_start(name):
    # KV 100 blocks of 1. r0 (prompt 1, 60 tokens) and r1 (prompt 50, 8 tokens) run from t=0;
    # r2 (prompt 50) arrives at 0.5 and needs 50 blocks, 48 are free at t=1. Only r0 may be
    # preempted for it (r1 has 7 tokens left, fewer than r2's 10), and r0's 2 blocks are not
    # enough: r0 was evicted anyway, lost its KV and waited behind r2 (finished at 67, not 60)
    reqs = make_requests([(1, 60), (50, 8), (50, 10)], arrivals=[0.0, 0.0, 0.5])
    est = make_estimates([60.0, 8.0, 10.0])
    for ff in (True, False):
        inst = make_engine(POLICIES.create(name), num_blocks=100, max_num_seqs=4, block_size=1,
                           fast_forward=ff)  # fmt: skip
        seqs = run_engine(inst, reqs, est)
        assert timeline(seqs) == [(0.0, 60.0, 0), (0.0, 8.0, 0), (8.0, 18.0, 0)]


def test_no_request_is_preempted_for_a_head_that_kv_admission_then_refuses():
    # KV 120 blocks of 1. r0 (prompt 1, 70 tokens, q10 of its prediction ~29) and r1 (prompt
    # 40, 40 tokens) run; r2 (prompt 20, predicted 30) arrives at 32.5 and does not fit the
    # free blocks. srpt names r0; r2 would then fit, but kv-admission refuses it against r1
    # alone (F(r1) + F(r2) = 80 + 50 > 120): r0 was preempted for nothing (finished at 77)
    reqs = make_requests([(1, 70), (40, 40), (20, 5)], arrivals=[0.0, 0.0, 32.5])
    z = np.array([NormalDist().inv_cdf(p) for p in LEVELS])
    med, sigma = np.array([200.0, 40.0, 30.0]), np.array([1.5, 0.0, 0.0])
    est = LengthEstimate(med[:, None] * np.exp(sigma[:, None] * z[None, :]), med, med)
    for ff in (True, False):
        pol = POLICIES.create("kv-admission", quantile=0.1, inner="srpt",
                              inner_params={"recompute_weight": 0.0})  # fmt: skip
        inst = make_engine(pol, num_blocks=120, max_num_seqs=4, block_size=1, fast_forward=ff)
        seqs = run_engine(inst, reqs, est)
        assert timeline(seqs) == [(0.0, 70.0, 0), (0.0, 40.0, 0), (40.0, 45.0, 0)]


def test_the_victims_that_let_the_head_start_are_preempted_together():
    # KV 100 blocks of 1. r0, r1, r2 (prompt 30, 5 tokens) hold 93 blocks at t=1; r3 (prompt
    # 60, 2 tokens) arrives at 0.5: one victim frees 31 blocks (38 < 60), two free 69. srpt-oracle
    # names r2, then r1 (most remaining, the latest admitted on ties): both go, r3 starts at 1
    reqs = make_requests([(30, 5)] * 3 + [(60, 2)], arrivals=[0.0] * 3 + [0.5])
    pol = POLICIES.create("srpt-oracle", recompute_weight=0.0)
    seqs = run_engine(make_engine(pol, num_blocks=100, max_num_seqs=4, block_size=1), reqs)
    assert [s.preemptions for s in seqs] == [0, 1, 1, 0]
    assert seqs[3].first_scheduled == 1.0


def test_a_victim_whose_cached_prefix_the_head_would_revive_frees_only_the_rest():
    # Prefix caching, blocks and units of 1 token, KV 100. v (prompt P, 40 tokens; 12 long) and
    # w (prompt 35, 10 long) run from t=0; h (prompt P + 30 more, 10 long) arrives at 0.5. At t=1
    # 23 blocks are free; h hits P (held by v alone) and needs 30 more. Preempting v frees its
    # 41 blocks, but 40 are P, which h would then revive: 64 free for 70. w may not be preempted
    # (9 tokens left, fewer than h's 10). So nobody is; h starts when w ends, at t=10 (v was
    # evicted at t=1 for nothing, and counting P as freed would evict it too)
    P = list(range(1, 41))
    reqs = make_requests([(40, 12), (35, 10), (70, 10)], arrivals=[0.0, 0.0, 0.5])
    toks = [P, list(range(1000, 1035)), P + list(range(41, 71))]
    reqs = [with_hashes(r, t, 1) for r, t in zip(reqs, toks)]
    for ff in (True, False):
        inst = make_engine(POLICIES.create("srpt-oracle", recompute_weight=0.0), num_blocks=100,
                           max_num_seqs=4, block_size=1, enable_prefix_caching=True,
                           fast_forward=ff)  # fmt: skip
        v, w, h = run_engine(inst, reqs)
        assert (v.preemptions, w.preemptions, h.preemptions) == (0, 0, 0)
        assert h.first_scheduled == 10.0 and h.cached_tokens == 40


def test_the_head_starts_even_if_its_victim_ranks_before_it_once_back_in_the_queue():
    # vtc over mlfq (preempting), one slot. x (tenant A) runs from t=0; y (B) arrives at t=10, a
    # step start: B is lifted to c_A, and y (level 0) is the head; mlfq preempts x (level 1)
    # for it. Back in the queue x's tenant is lifted to c_B = c_A: a tie, and x arrived first,
    # so x ranked first again, was admitted, and y named it again: the step never ended
    reqs = [Request(id="x", prompt_tokens=1, output_tokens=50, arrival=0.0, tenant="A"),
            Request(id="y", prompt_tokens=4, output_tokens=5, arrival=10.0, tenant="B")]  # fmt: skip

    def stuck(*_):
        raise TimeoutError("the step never ended")

    old = signal.signal(signal.SIGALRM, stuck)
    signal.alarm(10)
    try:
        for ff in (True, False):
            pol = POLICIES.create("vtc", inner="mlfq", inner_params={
                "preempt": True, "recompute_weight": 0.0, "base_quantum": 4.0})  # fmt: skip
            inst = make_engine(pol, num_blocks=100, block_size=1, max_num_seqs=1, fast_forward=ff)
            x, y = run_engine(inst, reqs)
            # x: 10 tokens by t=10; back at 15, its recompute samples the 11th; done at 55
            assert timeline([x, y]) == [(0.0, 55.0, 1), (10.0, 15.0, 0)]
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


class Spy:
    """Records the victims `preempt_for` names at each time, the preemptions among them, and
    the admissions: every request preempted for a head must let that head start at once."""

    def __init__(self, pol):
        self.named, self.preempted, self.started = {}, [], set()
        pf, op, osch = pol.preempt_for, pol.on_preempt, pol.on_schedule

        def preempt_for(c, running, now):
            v = pf(c, running, now)
            if v is not None:
                self.named[(now, id(v))] = c
            return v

        def on_preempt(seq, now):
            if (now, id(seq)) in self.named:
                self.preempted.append((now, self.named[(now, id(seq))]))
            op(seq, now)

        def on_schedule(seq, now):
            self.started.add((now, id(seq)))
            osch(seq, now)

        pol.preempt_for, pol.on_preempt, pol.on_schedule = preempt_for, on_preempt, on_schedule

    def check(self):
        for now, head in self.preempted:
            assert (now, id(head)) in self.started, f"preempted for {head.id} at {now}"


POLICIES_THAT_PREEMPT = [
    ("srpt-oracle", {"recompute_weight": 0.0}),
    ("srpt", {"recompute_weight": 0.0, "max_preemptions": None}),
    ("mlfq", {"preempt": True, "recompute_weight": 0.0, "base_quantum": 4.0}),
    ("kv-admission", {"inner": "srpt", "inner_params": {"recompute_weight": 0.0}}),
    ("vtc", {"inner": "mlfq", "inner_params": {"preempt": True, "recompute_weight": 0.0,
                                               "base_quantum": 4.0}}),
]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(
    st.lists(st.tuples(st.integers(1, 40), st.integers(1, 40), st.sampled_from([0.0, 0.5, 2.0]),
                       st.integers(0, 2)), min_size=2, max_size=14),  # fmt: skip
    st.sampled_from(POLICIES_THAT_PREEMPT),
    st.sampled_from([1, 2, 4]),
    st.integers(1, 4),
    st.booleans(),
)
def test_property_a_preemption_for_the_head_lets_it_start(data, policy, bs, slots, caching):
    """Tight KV, shared prefixes when caching: every request preempted for a head is preempted
    in a step where that head starts; fast-forward on and off agree."""
    t, arrivals, toks = 0.0, [], []
    for i, (p, _, gap, pre) in enumerate(data):
        t += gap
        arrivals.append(t)
        shared = list(range(100 * pre, 100 * pre + p // 2))
        toks.append(shared + list(range(1000 * (i + 1), 1000 * (i + 1) + p - len(shared))))
    reqs = make_requests([(p, o) for p, o, _, _ in data], arrivals, tenants=("a", "b"))
    if caching:
        reqs = [with_hashes(r, tk, bs) for r, tk in zip(reqs, toks)]
    est = noisy_oracle(reqs, 0.5, seed=len(data))
    num_blocks = max(-(-(p + o) // bs) for p, o, _, _ in data) + 2
    runs = []
    for ff in (True, False):
        pol = POLICIES.create(policy[0], **policy[1])
        spy = Spy(pol)
        inst = make_engine(pol, num_blocks=num_blocks, block_size=bs, max_num_seqs=slots,
                           max_num_batched_tokens=32, enable_prefix_caching=caching,
                           fast_forward=ff)  # fmt: skip
        seqs = run_engine(inst, reqs, est)
        assert all(s.generated == s.target for s in seqs)
        spy.check()
        runs.append([v for s in seqs for v in (s.first_scheduled, s.finish, s.preemptions)])
    assert runs[0] == pytest.approx(runs[1])
