"""The core of benchmarks/steptime_vs_mlenergy.py on one small configuration (fast)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from presched.sim.steptime import load_mlenergy

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "steptime_vs_mlenergy.py"


def _load_script():
    name = "steptime_vs_mlenergy_script"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def bench():
    return _load_script()


@pytest.fixture(scope="module")
def config_8b_n8(data_dir):
    configs = load_mlenergy(
        data_dir / "mlenergy-leaderboard-llm",
        model="meta-llama/Llama-3.1-8B-Instruct", gpu="H100", task="lm-arena-chat",
    )
    (c,) = [c for c in configs if c.max_num_seqs == 8]
    return c


@pytest.fixture(scope="module")
def row(bench, config_8b_n8):
    return bench.compare(config_8b_n8, num_requests=300, seed=0)


def test_median_itl_within_band(row):
    meas, sim = row["measured"]["median_itl_ms"], row["simulated"]["median_itl_ms"]
    assert abs(sim - meas) <= 0.35 * meas, (sim, meas)
    assert row["itl_err_pct"] == pytest.approx(100 * (sim - meas) / meas)
    # a saturated engine at N = 8 keeps 8 requests running in the steady state
    assert row["simulated"]["avg_batch_size"] == pytest.approx(8, abs=0.5)


def test_steady_window_excludes_the_ramp_down(row):
    w = row["window"]
    assert 0 < w["start_s"] < w["end_s"] < w["duration_s"]
    # the window closes when num_requests - N - 1 requests are done: no later than the last
    # admission (up to the polling granularity), i.e. before fewer than N requests remain
    assert w["end_s"] <= w["last_admission_s"] + 0.1 + 0.05
    # the drain after it produced gaps that the steady-state figures do not count
    assert w["gaps_after_window"] > 0
    assert w["gaps_in_window"] + w["gaps_after_window"] <= w["gaps_total"]
    assert w["tokens"] < row["num_requests"] * row["mean_output_tokens"]


def test_requests_follow_the_configuration(bench, config_8b_n8):
    reqs = bench.make_requests(config_8b_n8, 2000, bench.PROMPTS["short"], seed=1)
    assert all(r.arrival == 0.0 for r in reqs)
    out = [r.output_tokens for r in reqs]
    lo, hi = config_8b_n8.output_length_bins[0], config_8b_n8.output_length_bins[-1]
    assert lo - 1 <= min(out) and max(out) <= hi
    mean_out = sum(out) / len(out)
    assert mean_out == pytest.approx(config_8b_n8.avg_output_len, rel=0.1)
    prompts = sorted(r.prompt_tokens for r in reqs)
    assert prompts[len(prompts) // 2] == pytest.approx(bench.PROMPTS["short"].median, rel=0.1)
    # same seed, same requests
    assert reqs == bench.make_requests(config_8b_n8, 2000, bench.PROMPTS["short"], seed=1)
