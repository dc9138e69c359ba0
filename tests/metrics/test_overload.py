"""The far-past-capacity warning of `presched simulate`: it fires when requests arrive much faster
than the deployment serves them and a queue forms, and stays quiet when one long answer near the
end only makes the run last longer."""

from __future__ import annotations

import numpy as np
import pytest

from presched.metrics.overload import load_ratio, overload_warning
from presched.metrics.records import RecordTable


def records(arrival, first_token, finish, output_tokens) -> RecordTable:
    """Records with the given timings (the other columns filled in: they play no part)."""
    n = len(arrival)
    f = lambda v: np.asarray(v, dtype=float)  # noqa: E731
    return RecordTable(
        id=np.array([f"r{i}" for i in range(n)], dtype=object), tenant=np.array(["t"] * n, dtype=object),
        arrival=f(arrival), first_scheduled=f(first_token), first_token=f(first_token), finish=f(finish),
        prompt_tokens=np.full(n, 10), output_tokens=np.asarray(output_tokens, dtype=np.int64),
        preemptions=np.zeros(n, dtype=np.int64), recomputed_tokens=np.zeros(n, dtype=np.int64),
        instance=np.zeros(n, dtype=np.int64), max_itl=f(np.zeros(n)),
        slo_ttft=f(np.full(n, np.nan)), slo_tpot=f(np.full(n, np.nan)), slo_e2e=f(np.full(n, np.nan)),
    )  # fmt: skip


def test_a_long_last_answer_without_a_queue_is_not_overload():
    # one request a second, each served at once in 1 s; the last is 10,000 tokens (100 s):
    # counted until the last finish this offered 12x what was served; no request ever waited
    arrival = np.arange(10.0)
    tokens = [100] * 9 + [10_000]
    finish = arrival + np.array([1.0] * 9 + [100.0])
    assert overload_warning(records(arrival, arrival + 0.01, finish, tokens)) is None


def test_a_backlog_that_grows_for_the_whole_run_warns_with_the_ratio():
    # ten arrivals a second, one served a second (100 tokens each): the queue only grows
    arrival = np.arange(100) * 0.1
    start = np.arange(100) * 1.0
    rec = records(arrival, start + 0.01, start + 1.0, [100] * 100)
    offered, served = load_ratio(rec)
    assert offered == pytest.approx(10_000 / 9.9)
    assert 9 < offered / served < 11
    line = overload_warning(rec)
    assert line is not None and line.startswith(f"offered load is {offered / served:.1f}x")
    assert "mean TTFT 45 s" in line


def test_a_busy_but_stable_run_is_quiet():
    arrival = np.arange(50.0)
    assert overload_warning(records(arrival, arrival + 0.01, arrival + 0.5, [50] * 50)) is None
    assert load_ratio(records([0.0], [0.1], [1.0], [5])) is None  # one arrival: no window
