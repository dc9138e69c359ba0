"""Arrival processes: when requests arrive, as sorted arrays of seconds starting at 0.

Pure numpy functions; randomness only through an explicit `np.random.Generator` (or an int
seed, turned into `np.random.default_rng(seed)`), so the same seed gives the same times.

- `poisson(n, rate, rng)`: interarrival gaps ~ Exponential(mean 1/rate); CV of the gaps = 1.
- `gamma(n, rate, cv, rng)`: gaps ~ Gamma(shape k = 1/cv^2, scale theta = cv^2/rate), so the
  mean gap is k*theta = 1/rate and the gap CV is 1/sqrt(k) = cv. cv > 1 is burstier than
  Poisson, cv < 1 smoother; cv = 1 is Poisson (and draws the very same numbers as `poisson`
  for the same generator state, because numpy's gamma sampler with shape 1 is its exponential
  sampler).
- `rescale(times, rate)`: shift so the first is 0 and scale so the mean rate is `rate`.
- `trace(requests)`: the requests' own arrival times.
- `apply_arrivals(requests, times)`: new requests carrying `times`, sorted by arrival.

The first arrival is always at 0 and `n` times have `n - 1` gaps, so the "mean rate" of a
sequence is `(n - 1) / (t_last - t_first)` = 1 / mean gap, the same convention everywhere here.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Sequence

import numpy as np

from presched.workload.request import Request

RngLike = np.random.Generator | int


def poisson(n: int, rate: float, rng: RngLike) -> np.ndarray:
    """`n` Poisson arrival times at `rate` requests/s, the first at 0."""
    n = _check_n(n)
    rate = _check_positive("rate", rate)
    gaps = _rng(rng).exponential(1.0 / rate, size=max(n - 1, 0))
    return _times(gaps, n)


def gamma(n: int, rate: float, cv: float, rng: RngLike) -> np.ndarray:
    """`n` arrival times whose gaps are Gamma with mean 1/`rate` and coefficient of variation
    `cv` (shape 1/cv^2), the first at 0."""
    n = _check_n(n)
    rate = _check_positive("rate", rate)
    cv = _check_positive("cv", cv)
    shape = 1.0 / (cv * cv)
    gaps = _rng(rng).gamma(shape, 1.0 / (rate * shape), size=max(n - 1, 0))
    return _times(gaps, n)


def rescale(times: Sequence[float] | np.ndarray, rate: float) -> np.ndarray:
    """Times shifted so the earliest is 0 and scaled so `(n - 1) / span == rate`.

    Order and relative spacing are kept (a bursty trace stays bursty). Needs at least two
    times and a span > 0.
    """
    rate = _check_positive("rate", rate)
    t = _check_times(times, nonnegative=False)
    if t.size < 2:
        raise ValueError(f"times: rescaling needs at least 2 times, got {t.size}")
    t0 = t.min()
    span = t.max() - t0
    if not span > 0:
        raise ValueError("times: all times are equal, so there is no rate to rescale")
    return (t - t0) * ((t.size - 1) / (rate * span))


def trace(requests: Sequence[Request]) -> np.ndarray:
    """The requests' arrival times, in list order."""
    return np.fromiter((r.arrival for r in requests), dtype=float, count=len(requests))


def apply_arrivals(
    requests: Sequence[Request], times: Sequence[float] | np.ndarray
) -> list[Request]:
    """New requests with `requests[i].arrival = times[i]`, sorted by arrival (stable: ties keep
    list order)."""
    t = _check_times(times)
    if t.size != len(requests):
        raise ValueError(f"times: got {t.size} times for {len(requests)} requests")
    order = np.argsort(t, kind="stable")
    return [dataclasses.replace(requests[i], arrival=float(t[i])) for i in order]


def mean_rate(times: Sequence[float] | np.ndarray) -> float:
    """`(n - 1) / (t_max - t_min)`: the rate convention used by `rescale` (nan if undefined)."""
    t = np.asarray(times, dtype=float)
    if t.size < 2 or not t.max() > t.min():
        return math.nan
    return (t.size - 1) / float(t.max() - t.min())


def _times(gaps: np.ndarray, n: int) -> np.ndarray:
    out = np.zeros(n)
    if n > 1:
        np.cumsum(gaps, out=out[1:])
    return out


def _rng(rng: RngLike) -> np.random.Generator:
    if isinstance(rng, np.random.Generator):
        return rng
    if isinstance(rng, numbers.Integral) and not isinstance(rng, bool):
        return np.random.default_rng(int(rng))
    raise TypeError(f"rng: expected a numpy Generator or an int seed, got {rng!r}")


def _check_n(n: object) -> int:
    if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 0:
        raise ValueError(f"n: expected an integer >= 0, got {n!r}")
    return int(n)


def _check_positive(name: str, value: object) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, numbers.Real)
        or not (math.isfinite(value) and value > 0)
    ):
        raise ValueError(f"{name}: expected a finite number > 0, got {value!r}")
    return float(value)


def _check_times(times: object, nonnegative: bool = True) -> np.ndarray:
    try:
        t = np.asarray(times, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"times: expected a sequence of numbers, got {times!r:.80}") from None
    if t.ndim != 1:
        raise ValueError(f"times: expected a 1-D sequence, got shape {t.shape}")
    if t.size and not np.all(np.isfinite(t)):
        raise ValueError("times: every time must be a finite number")
    if nonnegative and t.size and t.min() < 0:
        raise ValueError(f"times: every time must be >= 0, got {t.min()!r}")
    return t
