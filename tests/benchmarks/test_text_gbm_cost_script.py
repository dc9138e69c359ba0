"""benchmarks/text_gbm_cost.py's measuring parts on a small text-gbm fitted on a real CASTILLO
slice (the full run is the script itself)."""

from __future__ import annotations

import numpy as np
import pytest
from builders import load_benchmark

from presched.predict.data import castillo_requests
from presched.predict.text_gbm import TextGBM

MODELS = ["llama-3.1-8b", "gemma-3-4b"]


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("text_gbm_cost.py")


@pytest.fixture(scope="module")
def small(data_dir):
    train = castillo_requests("validate", models=MODELS)
    test = castillo_requests("test", models=MODELS)[:400]
    return TextGBM(folds=2, svd=8, max_rounds=120, scale_folds=2).fit(train), test


def test_the_staged_pipeline_is_predict_itself(bench, small):
    # the stage timings are only honest if the staged calls compute what predict computes
    pred, test = small
    spent: dict[str, float] = {}
    q = bench.staged_predict(pred, test[:50], spent)
    assert np.array_equal(q, pred.predict(test[:50]).quantiles)
    assert set(spent) == set(bench.STAGES) and all(v >= 0 for v in spent.values())


def test_every_stage_is_timed_inside_whole_calls(bench, small):
    pred, test = small
    costs = bench.stage_costs(pred, test, n_batches=3, batch=16, seed=0)
    assert set(costs) == set(bench.STAGES) | {"staged", "whole"}
    assert all(costs[k] > 0 for k in ("encode", "hashing", "cues", "point_booster", "spread_booster", "whole"))
    # medians of per-call sums: at least the largest stage, at most the sum of the stages' medians x 2
    assert max(costs[s] for s in bench.STAGES) <= costs["staged"] <= 2 * sum(costs[s] for s in bench.STAGES)


def test_tree_tradeoff_ends_at_the_full_booster(bench, small):
    pred, test = small
    rows = bench.tree_tradeoff(pred, test, n_batches=3, batch=32)
    trees = [r["trees"] for r in rows]
    assert trees == sorted(trees) and trees[-1] == pred.booster.num_trees()
    assert all(-1 <= r["kendall_tau_b"] <= 1 and r["mae_exp_mu"] > 0 and r["booster_us"] > 0 for r in rows)


def test_the_fast_configuration_is_fitted_without_cues_and_scored_like_the_default(bench, small, data_dir):
    from presched.predict.evaluate import Split

    pred, test = small
    train = castillo_requests("validate", models=MODELS)
    half = len(train) // 2
    split = Split("tiny", train[:half], train[half:], test, "test split")
    out = bench.compare_fast(pred, split)
    assert set(out) == {"default", "cues=False"}
    assert all(set(bench.COMPARED) <= set(row) for row in out.values())
    assert out["cues=False"]["latency_batch_p50_ms"] > 0 and -1 <= out["cues=False"]["kendall_tau_b"] <= 1
