from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from scipy.stats import kendalltau

from presched.predict import LEVELS, PREDICTORS, ModelFileError, load_predictor, training_targets
from presched.predict.data import castillo_requests
from presched.predict.text_gbm import TextGBM, model_offsets, prompt_split

FAST = {"folds": 3, "svd": 16, "max_rounds": 300, "scale_folds": 2}  # small and quick for tests
MODELS = ["llama-3.1-8b", "gemma-3-4b", "qwen2.5-14b"]


@pytest.fixture(scope="module")
def small(data_dir):
    return castillo_requests("validate", models=MODELS), castillo_requests("test", models=MODELS)


@pytest.fixture(scope="module")
def fitted(small):
    train, _ = small
    return TextGBM(**FAST).fit(train)  # no validation: holds out 20 % of the prompts itself


def test_registered_and_params_checked():
    assert isinstance(PREDICTORS.create("text-gbm"), TextGBM)
    with pytest.raises(ValueError, match="unknown parameter"):
        TextGBM(learning_rat=0.1)
    # a value of the wrong kind is refused naming it (it used to fail inside LightGBM's train)
    with pytest.raises(ValueError, match="parameter 'max_rounds' must be an integer, got 'abc'"):
        TextGBM(max_rounds="abc")
    with pytest.raises(ValueError, match="parameter 'cues' must be true or false, got 1"):
        TextGBM(cues=1)
    assert TextGBM(learning_rate=1).params["learning_rate"] == 1  # an integer is a number
    with pytest.raises(ValueError, match="fit"):
        TextGBM().predict([])


@pytest.mark.parametrize("key, bad, ok", [
    ("learning_rate", 0.0, 1.0), ("learning_rate", -1.0, 0.01), ("num_leaves", 1, 2), ("folds", 0, 2),
    ("calib_frac", 1.5, 0.9), ("sigma_floor", 0.0, 1e-3), ("svd", -3, 0), ("max_rounds", 0, 1),
    ("feature_fraction", 0.0, 1.0), ("min_data_in_leaf", 0, 1), ("order", 0, 1), ("head", 0, 1),
])  # fmt: skip
def test_a_number_out_of_range_is_refused_naming_it(key, bad, ok):
    # each was accepted and then failed inside LightGBM, or quietly became another value
    # (folds=0 ran 2 folds), or crashed the conformal step (sigma_floor=0)
    with pytest.raises(ValueError, match=f"text-gbm: parameter '{key}' must be in"):
        TextGBM(**{key: bad})
    assert TextGBM(**{key: ok}).params[key] == ok  # the edge of the range is accepted


def test_fit_predict_shapes_monotone_and_round_trip(fitted, small, tmp_path):
    _, test = small
    est = fitted.predict(test)
    assert est.quantiles.shape == (len(test), len(LEVELS))
    assert np.all(np.diff(est.quantiles, axis=1) >= 0) and np.all(est.quantiles >= 1)
    assert np.array_equal(est.point, est.quantiles[:, LEVELS.index(0.5)])
    assert fitted.fit_info["calibration_rows"] > 0 and fitted.fit_info["rounds"] >= 1
    again = load_predictor(fitted.save(tmp_path / "m")).predict(test)
    assert np.array_equal(again.quantiles, est.quantiles)
    assert np.array_equal(again.point, est.point) and np.array_equal(again.rank_score, est.rank_score)
    # batch composition does not change a request's answer
    one = fitted.predict(test[5:6])
    assert np.allclose(one.quantiles[0], est.quantiles[5])


def test_beats_model_median_and_is_roughly_calibrated(fitted, small):
    train, test = small
    y, keep = training_targets(test)
    est = fitted.predict(test)
    base = PREDICTORS.create("model-median").fit(train).predict(test)
    tau = kendalltau(est.point[keep], y[keep]).statistic
    tau_base = kendalltau(base.point[keep], y[keep]).statistic
    assert tau > tau_base + 0.2 and tau > 0.4
    mae = np.abs(est.point[keep] - y[keep]).mean()
    assert mae < np.abs(base.point[keep] - y[keep]).mean()
    cover = (y[keep, None] <= est.quantiles[keep]).mean(axis=0)
    assert np.abs(cover[:9] - np.array(LEVELS[:9])).max() < 0.08  # small calibration slice


def test_validation_is_used_when_given(small):
    train, test = small
    pred = TextGBM(**FAST).fit(train[:3000], validation=train[3000:])
    assert pred.fit_info["calibration_rows"] == len(train) - 3000
    assert pred.predict(test[:10]).quantiles.shape == (10, len(LEVELS))


def test_unseen_model_falls_back_gracefully(fitted, small):
    _, test = small
    r = test[0]
    new_family = dataclasses.replace(r, model="acme--Brand-New-3B")
    same_family = dataclasses.replace(r, model="meta-llama--Llama-9.9-70B-Instruct")
    est = fitted.predict([r, new_family, same_family])
    assert np.isfinite(est.quantiles).all()
    rows = fitted._model_rows([new_family.model, same_family.model])
    assert np.allclose(rows[0, :2], fitted.model_stats.mean(axis=0))
    llama = fitted.model_stats[[i for m, i in fitted.model_index.items() if "llama" in m.lower()]].mean(axis=0)
    assert np.allclose(rows[1, :2], llama)
    # a fitted model whose family no name rule knows ('other') is no kin of another such name:
    # an unseen 'zeta/Terse-7B' got exactly the numbers of a fitted 'acme--Chatty-7B'
    import copy

    fake = copy.copy(fitted)
    fake.model_index = {("acme--Chatty-7B" if "gemma" in m else m): i for m, i in fitted.model_index.items()}
    fake.models = list(fake.model_index)
    rows = fake._model_rows(["zeta/Terse-7B"])
    assert np.allclose(rows[0, :2], fitted.model_stats.mean(axis=0))
    assert "of all 3 models" in fake.unknown_model_fallback("zeta/Terse-7B")


def test_bad_input_errors_name_the_field(fitted, small):
    _, test = small
    with pytest.raises(ValueError, match="'prompt'"):
        fitted.predict([dataclasses.replace(test[0], prompt=None)])
    with pytest.raises(ValueError, match="'prompt'"):
        fitted.predict([dataclasses.replace(test[0], prompt="   ")])
    with pytest.raises(ValueError, match="empty"):
        fitted.predict([])
    with pytest.raises(ValueError, match="'prompt'"):
        TextGBM(**FAST).fit([dataclasses.replace(test[0], prompt="")])


def test_model_file_of_another_format_version_is_refused(fitted, tmp_path):
    path = fitted.save(tmp_path / "m.npz")
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    header = json.loads(str(arrays.pop("__header__")))
    header["format"] = 999
    bad = tmp_path / "bad.npz"
    np.savez_compressed(bad, __header__=np.array(json.dumps(header)), **arrays)
    with pytest.raises(ModelFileError, match="format 999"):
        load_predictor(bad)


def test_helpers():
    # ly = t_p + b_m exactly: offsets recovered up to centring
    t = np.array([1.0, 2.0, 3.0])
    b = np.array([0.5, -0.5])
    p, m = np.repeat([0, 1, 2], 2), np.tile([0, 1], 3)
    u, tp, bm = model_offsets(p, m, t[p] + b[m], 2)
    assert u.tolist() == [0, 1, 2] and np.allclose(tp, t) and np.allclose(bm, b)
    reqs = castillo_requests("test", models=["llama-3.1-8b"])[:200]
    fit_m, held = prompt_split(reqs, 0.2, 0)
    assert held.sum() > 0 and not {r.prompt for r, h in zip(reqs, held) if h} & {r.prompt for r, f in zip(reqs, fit_m) if f}


def test_without_cues_the_lexical_stage_is_skipped_and_the_model_still_round_trips(small, fitted, tmp_path, monkeypatch):
    import presched.predict.features as features

    train, test = small
    pred = TextGBM(**FAST, cues=False).fit(train)
    # without cues: no cue columns and no task offsets (their task rule reads the cues)
    assert len(pred.feature_names()) == len(fitted.feature_names()) - len(features.CUE_NAMES) - 3
    assert pred.task_offsets is None
    assert pred.booster.num_feature() == len(pred.feature_names())

    def boom(texts):
        raise AssertionError("lexical_cues called with cues=False")

    monkeypatch.setattr(features, "lexical_cues", boom)  # predict must not pay for the cues
    est = pred.predict(test[:200])
    assert (np.diff(est.quantiles, axis=1) >= 0).all()
    again = load_predictor(pred.save(tmp_path / "fast.npz")).predict(test[:200])
    assert np.array_equal(again.quantiles, est.quantiles)
    with pytest.raises(ValueError, match="'cues'"):
        TextGBM(cues="maybe")
