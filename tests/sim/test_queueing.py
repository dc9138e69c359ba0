"""Closed forms of queueing theory, on long seeded runs.

With one slot (max_num_seqs = 1) and every step lasting the same time, the engine is an M/D/1
queue: a request of L output tokens occupies the server for exactly L steps (one prefill step
that yields the first token, then L - 1 decode steps)."""

from __future__ import annotations

import numpy as np
import pytest
from builders import constant_steps, make_engine, make_requests
from hypothesis import given, settings
from hypothesis import strategies as st

from presched.sim.seq import Seq

STEP = 0.01  # seconds per step
TOKENS = 20  # output tokens per request -> service time D = 0.2 s


def run_md1(rho: float, n: int, seed: int):
    D = TOKENS * STEP
    lam = rho / D
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / lam, n))
    reqs = make_requests([(8, TOKENS)] * n, arrivals=arrivals.tolist())
    inst = make_engine(max_num_seqs=1, step_model=constant_steps(STEP), num_blocks=100)
    seqs, seen_waiting = [], []
    for i, r in enumerate(reqs):
        inst.advance(r.arrival)
        seen_waiting.append(inst.num_waiting)  # what this arrival finds in the queue
        seq = Seq(r, i)
        inst.add(seq, r.arrival)
        seqs.append(seq)
    inst.advance(float("inf"))
    wait = np.array([s.first_scheduled - s.arrival for s in seqs])
    return lam, D, wait, np.array(seen_waiting), seqs


@pytest.mark.parametrize("rho", [0.5, 0.8])
def test_md1_mean_wait_matches_pollaczek_khinchine(rho):
    lam, D, wait, _, _ = run_md1(rho, n=60_000, seed=1)
    expected = rho * D / (2 * (1 - rho))  # M/D/1: Wq = rho D / (2 (1 - rho))
    assert wait[1000:].mean() == pytest.approx(expected, rel=0.05)


def test_littles_law_for_the_queue():
    # PASTA: Poisson arrivals see the time-average queue length L_q; Little: L_q = lambda W_q.
    # L_q is read from the engine's waiting queue, W_q from the request records: two
    # independent measurements of the same system.
    lam, D, wait, seen, _ = run_md1(0.7, n=60_000, seed=2)
    assert seen[1000:].mean() == pytest.approx(lam * wait[1000:].mean(), rel=0.05)


def test_service_time_is_exactly_L_steps():
    _, D, _, _, seqs = run_md1(0.3, n=200, seed=3)
    for s in seqs:
        assert s.finish - s.first_scheduled == pytest.approx(D)
        assert s.first_token - s.first_scheduled == pytest.approx(STEP)


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 40), seed=st.integers(0, 999))
def test_idle_engine_starts_request_on_arrival(n, seed):
    # Arrivals far apart: no queueing, so every request starts exactly when it arrives and
    # takes (L steps) of service.
    rng = np.random.default_rng(seed)
    outs = rng.integers(1, 30, n).tolist()
    arrivals = (np.arange(n) * 100.0).tolist()
    reqs = make_requests([(4, o) for o in outs], arrivals=arrivals)
    inst = make_engine(step_model=constant_steps(STEP))
    from builders import run_engine

    for s, o in zip(run_engine(inst, reqs), outs):
        assert s.first_scheduled == s.arrival
        assert s.finish - s.arrival == pytest.approx(o * STEP)
