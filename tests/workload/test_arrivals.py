"""Arrival processes: statistics over seeded samples, rescale, apply, argument checks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from presched.workload import Request
from presched.workload.arrivals import apply_arrivals, gamma, mean_rate, poisson, rescale, trace

N = 20_000


def _cv(x: np.ndarray) -> float:
    return float(np.std(x) / np.mean(x))


def test_poisson_interarrival_mean_and_cv():
    t = poisson(N, 4.0, np.random.default_rng(1))
    assert t.shape == (N,) and t[0] == 0.0 and np.all(np.diff(t) >= 0)
    gaps = np.diff(t)
    assert np.mean(gaps) == pytest.approx(0.25, rel=0.03)
    assert _cv(gaps) == pytest.approx(1.0, abs=0.03)
    assert mean_rate(t) == pytest.approx(4.0, rel=0.03)


@pytest.mark.parametrize("cv, tol", [(0.5, 0.02), (2.0, 0.12), (3.0, 0.25)])
def test_gamma_cv(cv, tol):
    t = gamma(N, 2.0, cv, np.random.default_rng(2))
    gaps = np.diff(t)
    assert np.mean(gaps) == pytest.approx(0.5, rel=0.05)
    assert _cv(gaps) == pytest.approx(cv, abs=tol)


def test_gamma_cv1_equals_poisson():
    a = poisson(1000, 3.0, np.random.default_rng(7))
    b = gamma(1000, 3.0, 1.0, np.random.default_rng(7))
    np.testing.assert_allclose(a, b, rtol=1e-12)


def test_seed_reproducible_and_int_seed_accepted():
    np.testing.assert_array_equal(poisson(50, 1.0, 5), poisson(50, 1.0, 5))
    assert not np.array_equal(poisson(50, 1.0, 5), poisson(50, 1.0, 6))


def test_small_n():
    assert poisson(0, 1.0, 0).shape == (0,)
    np.testing.assert_array_equal(gamma(1, 1.0, 2.0, 0), [0.0])


@pytest.mark.parametrize(
    "call, arg",
    [
        (lambda: poisson(-1, 1.0, 0), "n"),
        (lambda: poisson(1.5, 1.0, 0), "n"),
        (lambda: poisson(10, 0.0, 0), "rate"),
        (lambda: poisson(10, float("nan"), 0), "rate"),
        (lambda: gamma(10, 1.0, -1.0, 0), "cv"),
        (lambda: rescale([0.0, 1.0], -2.0), "rate"),
        (lambda: rescale([1.0], 2.0), "times"),
        (lambda: rescale([3.0, 3.0], 2.0), "times"),
        (lambda: apply_arrivals([Request(id="a", prompt_tokens=1)], [1.0, 2.0]), "times"),
        (lambda: apply_arrivals([Request(id="a", prompt_tokens=1)], [-1.0]), "times"),
    ],
)
def test_bad_arguments_name_the_argument(call, arg):
    with pytest.raises(ValueError, match=f"^{arg}:"):
        call()


def test_bad_rng_type():
    with pytest.raises(TypeError, match="rng"):
        poisson(3, 1.0, "seed")


def test_rescale_hits_rate_keeps_first_at_zero():
    t = np.array([5.0, 6.0, 6.5, 10.0, 25.0])
    r = rescale(t, 2.0)
    assert r[0] == 0.0
    assert mean_rate(r) == pytest.approx(2.0)
    assert (len(t) - 1) / r[-1] == pytest.approx(2.0)
    np.testing.assert_allclose(
        np.diff(r) / np.diff(t), (np.diff(r) / np.diff(t))[0]
    )  # spacing kept


@settings(max_examples=60, deadline=None)
@given(
    times=st.lists(
        st.floats(min_value=0, max_value=1e6, allow_nan=False), min_size=2, max_size=200
    ),
    rate=st.floats(min_value=1e-3, max_value=1e3),
)
def test_property_rescale_preserves_order_and_hits_rate(times, rate):
    t = np.array(times)
    assume(t.max() - t.min() > 1e-6 * max(1.0, t.max()))  # a usable span
    r = rescale(t, rate)
    assert r.min() == 0.0 and r[np.argmin(t)] == 0.0
    assert np.all(np.diff(r[np.argsort(t, kind="stable")]) >= 0)  # order preserved
    assert mean_rate(r) == pytest.approx(rate, rel=1e-9)


def test_trace_and_apply_arrivals_sort():
    reqs = [Request(id=str(i), prompt_tokens=1, arrival=float(i)) for i in range(4)]
    np.testing.assert_array_equal(trace(reqs), [0, 1, 2, 3])
    out = apply_arrivals(reqs, [3.0, 1.0, 1.0, 0.0])
    assert [r.id for r in out] == ["3", "1", "2", "0"]  # stable for the tie
    assert [r.arrival for r in out] == [0.0, 1.0, 1.0, 3.0]
    assert reqs[0].arrival == 0.0  # originals untouched
