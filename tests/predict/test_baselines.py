from __future__ import annotations

import json

import numpy as np
import pytest
from scipy.stats import kendalltau

from presched.predict import PREDICTORS, LEVELS, ModelFileError, load_predictor, training_targets
from presched.predict.data import castillo_requests, prompt_key
from presched.workload.request import Request

BASELINES = ["global-median", "model-median", "linear-prompt"]


@pytest.fixture(scope="module")
def small(data_dir):
    models = ["llama-3.1-8b", "gemma-3-4b", "qwen2.5-14b"]
    train = castillo_requests("validate", models=models)
    test = castillo_requests("test", models=models)
    return train, test


def test_training_targets_use_uncapped_sample_means():
    r = Request(id="a", prompt_tokens=5, output_tokens=10, output_samples=(10, 20, 15000))
    only_capped = Request(id="b", prompt_tokens=5, output_tokens=15001, output_samples=(15001, 15000))
    t, keep = training_targets([r, only_capped])
    assert t[0] == 15.0 and keep.tolist() == [True, False]
    # a row cut at its own max_tokens is a lower bound, not a label (it trained as one)
    cut = Request(id="c", prompt_tokens=5, output_tokens=256, max_tokens=256)
    some = Request(id="d", prompt_tokens=5, output_tokens=90, output_samples=(90, 256, 110), max_tokens=256)
    t, keep = training_targets([cut, some])
    assert keep.tolist() == [False, True] and t[1] == 100.0
    # a log reader that knew the finish reason has judged the row: a natural stop at exactly
    # max_tokens, or a cut row kept on purpose (--keep-censored), is a label
    judged = Request(id="e", prompt_tokens=5, output_tokens=256, max_tokens=256, metadata={"censored": False})
    assert training_targets([judged])[1].tolist() == [True]


@pytest.mark.parametrize("name", BASELINES)
def test_fit_predict_save_load_round_trip(name, small, tmp_path):
    train, test = small
    pred = PREDICTORS.create(name).fit(train)
    est = pred.predict(test)
    assert len(est) == len(test) and est.quantiles.shape == (len(test), len(LEVELS))
    assert np.all(np.diff(est.quantiles, axis=1) >= 0)
    path = pred.save(tmp_path / name)
    again = load_predictor(path).predict(test)
    assert np.array_equal(again.quantiles, est.quantiles)
    assert np.array_equal(again.point, est.point) and np.array_equal(again.rank_score, est.rank_score)


def test_model_median_is_right_per_model_and_calibrated(small):
    train, test = small
    est = PREDICTORS.create("model-median").fit(train).predict(test)
    y, keep = training_targets(test)
    cover = (y[keep, None] <= est.quantiles[keep]).mean(axis=0)
    # same prompt sets, other prompts: coverage of a per-model empirical distribution is close
    assert np.abs(cover[:9] - np.array(LEVELS[:9])).max() < 0.08


def test_linear_prompt_ranks_better_than_a_constant(small):
    train, test = small
    y, keep = training_targets(test)
    lin = PREDICTORS.create("linear-prompt").fit(train).predict(test)
    assert kendalltau(lin.rank_score[keep], y[keep]).statistic > 0.1


def test_splits_are_prompt_disjoint(small):
    train, test = small
    assert not {prompt_key(r) for r in train} & {prompt_key(r) for r in test}


def test_unfitted_and_bad_input_errors():
    p = PREDICTORS.create("model-median")
    with pytest.raises(ValueError, match="call fit"):
        p.predict([Request(id="x", prompt_tokens=3)])
    with pytest.raises(ValueError, match="requests: empty"):
        p.fit([])
    with pytest.raises(ValueError, match="no.*usable output length"):
        p.fit([Request(id="x", prompt_tokens=3)])


def test_model_file_from_another_version_is_refused(small, tmp_path):
    train, _ = small
    path = PREDICTORS.create("global-median").fit(train).save(tmp_path / "m.npz")
    with np.load(path) as z:
        arrays = {k: z[k] for k in z.files}
    header = json.loads(str(arrays.pop("__header__")))
    header["format"], header["presched"] = 99, "9.9.9"
    np.savez(path, __header__=np.array(json.dumps(header)), **arrays)
    with pytest.raises(ModelFileError, match="format 99 .*presched 9.9.9.*retrain"):
        load_predictor(path)
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(ModelFileError, match="not a presched model file"):
        load_predictor(tmp_path / "junk.npz")
    with pytest.raises(ModelFileError, match="not found"):
        load_predictor(tmp_path / "missing.npz")


@pytest.mark.parametrize("name", [*BASELINES, "lexical-gbm", "text-gbm"])
def test_predict_never_reads_the_labels(name, small):
    import dataclasses

    train, test = small
    pred = PREDICTORS.create(name).fit(train)
    unlabelled = [dataclasses.replace(r, output_tokens=None, output_samples=()) for r in test[:300]]
    a, b = pred.predict(test[:300]), pred.predict(unlabelled)
    assert np.array_equal(a.quantiles, b.quantiles) and np.array_equal(a.point, b.point)


def test_checked_params_takes_each_defaults_kind_and_names_what_it_refuses():
    from presched.predict.base import checked_params

    defaults = {"n": 3, "lr": 0.1, "on": True, "how": "a", "cap": 2.0, "dir": None, "qs": [1, 2]}
    got = checked_params("p", defaults, {"n": 5, "lr": 1, "cap": None, "dir": "x", "qs": [3]}, nullable=("cap",))
    assert got == {**defaults, "n": 5, "lr": 1, "cap": None, "dir": "x", "qs": [3]}
    for given, needle in [({"n": "abc"}, "'n' must be an integer, got 'abc'"), ({"n": 2.5}, "'n' must be an integer"),
                          ({"n": True}, "'n' must be an integer"), ({"lr": "fast"}, "'lr' must be a number"),
                          ({"on": 1}, "'on' must be true or false"), ({"how": 3}, "'how' must be a string"),
                          ({"lr": None}, "'lr' must be a number, got None"), ({"qs": 3}, "'qs' must be a list"),
                          ({"zz": 1}, "p: unknown parameter(s) ['zz']; known:")]:  # fmt: skip
        with pytest.raises(ValueError) as e:
            checked_params("p", defaults, given)
        assert needle in str(e.value), (given, str(e.value))
