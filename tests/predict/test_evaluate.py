"""The harness: views are prompt-disjoint (and model / dataset-disjoint where they say so),
splits of a user's file are prompt-disjoint, a failing predictor is reported, not fatal."""

from __future__ import annotations

import math

import numpy as np
import pytest
from builders import prompt_keys

from presched.predict import PREDICTORS, Predictor
from presched.predict.data import prompt_key
from presched.predict.evaluate import (
    HELD_OUT_DATASET,
    HELD_OUT_MODELS,
    Evaluation,
    castillo_view,
    evaluate,
    generic_split,
    group_split,
    subsample,
)
from presched.predict.figures import cross_model_tau_drop, headline_figures
from presched.workload.request import Request


@pytest.fixture(scope="module")
def views(data_dir):
    return {v: castillo_view(v) for v in ("in-dist", "cross-model", "cross-dataset")}


def test_views_are_prompt_disjoint(views):
    for split in views.values():
        tr, ca, te = prompt_keys(split.train), prompt_keys(split.calibration), prompt_keys(split.test)
        assert tr and ca and te
        assert not (tr & ca) and not (tr & te) and not (ca & te), split.view


def test_in_dist_view_uses_castillo_splits(views):
    s = views["in-dist"]
    assert {r.metadata["split"] for r in s.test} == {"test"}
    assert {r.metadata["split"] for r in s.calibration} == {"validate"}
    assert {r.metadata["split"] for r in s.train} == {"train", "validate"}
    assert len({r.model for r in s.test}) == 13
    val = len(prompt_keys([r for r in s.train + s.calibration if r.metadata["split"] == "validate"]))
    assert len(prompt_keys(s.calibration)) / val == pytest.approx(0.25, abs=0.01)


def test_cross_model_view_is_model_disjoint(views):
    s = views["cross-model"]
    train_models = {r.model for r in s.train + s.calibration}
    assert {r.model for r in s.test} == set(HELD_OUT_MODELS)
    assert len(train_models) == 9 and not train_models & set(HELD_OUT_MODELS)
    # the test rows are exactly the in-dist test rows of the held-out models
    ind = [r.id for r in views["in-dist"].test if r.model in HELD_OUT_MODELS]
    assert sorted(r.id for r in s.test) == sorted(ind)


def test_cross_dataset_view_holds_out_sharegpt(views):
    s = views["cross-dataset"]
    assert {r.metadata["dataset"] for r in s.test} == {HELD_OUT_DATASET}
    assert HELD_OUT_DATASET not in {r.metadata["dataset"] for r in s.train + s.calibration}
    assert len({r.model for r in s.test}) == 13


def test_quick_view_is_small_and_still_disjoint(data_dir):
    s = castillo_view("in-dist", quick=500, seed=3)
    assert all(400 <= len(x) <= 560 for x in (s.train, s.calibration, s.test))
    assert not prompt_keys(s.train) & prompt_keys(s.test)


def _log(n_prompts=60, models=("a", "b")):
    rng = np.random.default_rng(0)
    out = []
    for i in range(n_prompts):
        for m in models:
            k = int(rng.integers(1, 50))
            out.append(Request(id=f"{m}-{i}", prompt_tokens=k, model=m, prompt=f"p{i}",
                               output_tokens=10 * k, output_samples=(10 * k, 10 * k + 4)))  # fmt: skip
    return out


def test_generic_split_fractions_and_disjoint():
    reqs = _log(100)
    s = generic_split(reqs, test_fraction=0.2, calibration_fraction=0.1, seed=4)
    assert (len(prompt_keys(s.train)), len(prompt_keys(s.calibration)), len(prompt_keys(s.test))) == (70, 10, 20)
    assert not prompt_keys(s.train) & prompt_keys(s.test) and not prompt_keys(s.calibration) & prompt_keys(s.test)
    assert len(s.train) + len(s.calibration) + len(s.test) == len(reqs)
    again = generic_split(reqs, 0.2, 0.1, seed=4)
    assert [r.id for r in again.test] == [r.id for r in s.test]  # seeded
    rest, part = group_split(reqs, 0.0)
    assert not part and len(rest) == len(reqs)
    with pytest.raises(ValueError, match="too few"):
        generic_split(reqs[:1])


def test_generic_split_honours_a_split_column():
    reqs = [Request(id=str(i), prompt_tokens=3, output_tokens=5, metadata={"split": s})
            for i, s in enumerate(["train", "train", "validate", "test"])]  # fmt: skip
    s = generic_split(reqs)
    assert [len(s.train), len(s.calibration), len(s.test)] == [2, 1, 1]


def test_subsample_keeps_whole_prompts():
    reqs = _log(50)
    sub = subsample(reqs, 21, seed=1)
    assert 21 <= len(sub) <= 22
    counts = {k: sum(prompt_key(r) == k for r in sub) for k in prompt_keys(sub)}
    assert set(counts.values()) == {2}


class _Broken(Predictor):
    name = "test-broken"

    def fit(self, requests, validation=None):
        raise RuntimeError("cannot learn")

    def predict(self, requests):  # pragma: no cover
        raise AssertionError


def test_evaluate_rows_and_failures_are_reported():
    if "test-broken" not in PREDICTORS:
        PREDICTORS.register("test-broken")(_Broken)
    split = generic_split(_log(80), seed=0)
    res = evaluate(["model-median", "test-broken", "linear-prompt"], [split], single_calls=10)
    rows = {r["predictor"]: r for r in res.rows}
    assert rows["test-broken"]["status"] == "error" and "cannot learn" in rows["test-broken"]["error"]
    lp = rows["linear-prompt"]
    assert lp["status"] == "ok" and lp["kendall_tau_b"] > 0.9 and lp["single_calls"] == 10
    for key in ("mae", "rmse", "acc50", "acc100", "class5_acc", "spearman", "pairwise_acc", "pinball",
                "under_q90", "latency_single_p50_ms", "latency_single_p99_ms", "latency_batch_p50_ms",
                "size_bytes", "fit_s", "mae_single", "kendall_tau_b_single"):  # fmt: skip
        assert lp[key] is not None and math.isfinite(lp[key]), key
    assert len(res.splits["in-dist"]["class_edges"]) == 4
    assert res.arrays[("in-dist", "linear-prompt")]["y"].shape == (lp["n"],)


def test_headline_figures_and_tau_drop():
    res = Evaluation()
    y = np.arange(8.0)
    models = np.array([HELD_OUT_MODELS[0]] * 4 + ["other"] * 4)
    rank = np.array([0, 1, 2, 3, 3, 2, 1, 0.0])
    res.arrays[("in-dist", "text-gbm")] = {"y": y, "rank": rank, "models": models}
    res.arrays[("cross-model", "text-gbm")] = {"y": y[:4], "rank": np.array([1.0, 0, 2, 3]),
                                               "models": models[:4]}  # fmt: skip
    # in-dist on the held-out rows: τ = 1; cross-model: one discordant pair of 6 -> τ = 4/6
    assert cross_model_tau_drop(res, "text-gbm") == pytest.approx(1 - 4 / 6)
    res.rows = [{"view": "in-dist", "predictor": "text-gbm", "status": "ok", "kendall_tau_b": 0.5, "mae": 90.0},
                {"view": "in-dist", "predictor": "s3", "status": "ok", "kendall_tau_b": 0.4, "mae": 80.0},
                {"view": "in-dist", "predictor": "ssjf", "status": "ok", "kendall_tau_b": 0.45, "mae": 95.0},
                {"view": "in-dist", "predictor": "listmle", "status": "error"}]  # fmt: skip
    fig = headline_figures(res)
    assert fig["default_kendall_tau"] == 0.5 and fig["best_anchor_kendall_tau"] == 0.45
    assert fig["default_mae"] == 90 and fig["best_anchor_mae"] == 80
    assert math.isnan(fig["default_single_latency_ms"])
    assert list(fig) == ["default_kendall_tau", "best_anchor_kendall_tau", "default_mae", "best_anchor_mae",
                         "max_coverage_error_pts", "cross_model_tau_drop", "default_single_latency_ms"]  # fmt: skip
