"""The embedded default workload: no files, fitted to Azure code arrivals and CASTILLO lengths,
reproducible."""

from __future__ import annotations

import numpy as np
import pytest

from presched.workload import default_workload, mean_rate, trace
from presched.workload.default import default_table
from presched.workload.loaders import load_azure_code
from presched.workload.loaders.castillo import load_castillo

BIG = 100_000


@pytest.fixture(scope="module")
def big():
    reqs = default_workload(BIG, seed=0)
    return (
        np.array([r.prompt_tokens for r in reqs]),
        np.array([r.output_tokens for r in reqs]),
        trace(reqs),
    )


def test_shape_ids_and_reproducibility():
    a = default_workload()
    assert len(a) == 2000 and a[0].id == "default-000000" and a[0].arrival == 0.0
    assert all(r.output_tokens >= 1 and r.prompt_tokens >= 1 for r in a)
    assert np.all(np.diff(trace(a)) >= 0)
    assert default_workload(seed=0) == a
    assert default_workload(seed=1) != a
    assert default_workload(0) == []


def test_table_is_the_fitted_quantiles(data_dir):
    """The packaged table equals what benchmarks/fit_default_workload.py computes today."""
    table = default_table()
    cas = load_castillo(model="llama-3.1-8b")
    assert table.levels[0] == 0.0 and table.levels[-1] == 1.0 and len(table.levels) == 103
    np.testing.assert_allclose(
        table.prompt_tokens, np.quantile([r.prompt_tokens for r in cas], table.levels), atol=0.01
    )
    np.testing.assert_allclose(
        table.output_tokens, np.quantile([r.output_tokens for r in cas], table.levels), atol=0.01
    )
    times = np.sort(trace(load_azure_code()))
    gaps = np.diff(times) / np.diff(times).mean()
    np.testing.assert_allclose(table.gaps[:-1], np.quantile(gaps, table.levels[:-1]), atol=1e-5)
    assert table.rate == pytest.approx(mean_rate(times), rel=1e-6)
    assert table.rate == pytest.approx(2.57, abs=0.005)  # docs/workloads.md: 2.57 req/s
    assert 0.5 < table.text_gbm_sigma < 1.2


def test_gaps_are_bursty_and_keep_the_mean_rate():
    """Gaps drawn from the table have mean 1 / rate exactly in expectation (the table's own mean
    is divided out) and are far burstier than Poisson (CV 1)."""
    table = default_table()
    t = table.arrival_times(200_001, 4.0, np.random.default_rng(5))
    g = np.diff(t)
    assert t[0] == 0.0 and np.all(g >= 0)
    assert g.mean() == pytest.approx(0.25, rel=0.05)
    assert g.std() / g.mean() > 5


@pytest.mark.parametrize("which", [0, 1])
def test_sample_quantiles_match_the_table(big, which):
    """For every level p in [1 %, 99 %], p lies between the share of draws below the table's
    quantile q(p) and the share at or below it (compared in probability space: robust to the
    data's steep steps, and to ties since the draws are integers), within sampling tolerance."""
    table = default_table()
    values = np.sort(big[which])
    q = np.asarray(table.prompt_tokens if which == 0 else table.output_tokens)
    levels = np.asarray(table.levels)
    inner = (levels >= 0.01) & (levels <= 0.99)
    target = np.rint(q[inner])
    below = np.searchsorted(values, target, side="left") / len(values)
    at_or_below = np.searchsorted(values, target, side="right") / len(values)
    p = levels[inner]
    assert np.all(below <= p + 0.006), np.max(below - p)
    assert np.all(at_or_below >= p - 0.006), np.max(p - at_or_below)


def test_means_and_rate_match_the_trace(big):
    prompt, output, times = big
    assert prompt.mean() == pytest.approx(235.4, rel=0.02)  # CASTILLO means (docs/workloads.md)
    assert output.mean() == pytest.approx(473.5, rel=0.03)
    assert np.median(prompt) == pytest.approx(144, abs=3) and np.median(output) == pytest.approx(
        391, abs=3
    )
    assert mean_rate(times) == pytest.approx(2.57, rel=0.05)
    assert prompt.max() <= 2534 and output.max() <= 15001 and prompt.min() >= 1


def test_rate_and_independence():
    reqs = default_workload(200_000, rate=20.0, seed=3)
    assert mean_rate(trace(reqs)) == pytest.approx(20.0, rel=0.1)  # gap CV ~12: sd of the mean ~3 %
    p = np.array([r.prompt_tokens for r in reqs], dtype=float)
    o = np.array([r.output_tokens for r in reqs], dtype=float)
    assert abs(np.corrcoef(p, o)[0, 1]) < 0.05  # drawn independently, as documented
    with pytest.raises(ValueError, match="^rate:"):
        default_workload(10, rate=0)
    with pytest.raises(ValueError, match="^n:"):
        default_workload(-1)
