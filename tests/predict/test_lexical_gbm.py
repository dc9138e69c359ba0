from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from scipy.stats import kendalltau

from presched.predict import LEVELS, PREDICTORS, load_predictor, training_targets
from presched.predict.data import castillo_requests
from presched.predict.lexical_gbm import FEATURE_NAMES, LexicalGBM, clairvoyant_features

MODELS = ["llama-3.1-8b", "gemma-3-4b", "qwen2.5-14b"]


@pytest.fixture(scope="module")
def small(data_dir):
    return castillo_requests("validate", models=MODELS), castillo_requests("test", models=MODELS)


def test_nineteen_clairvoyant_features():
    assert len(FEATURE_NAMES) == 19
    f = clairvoyant_features(["Explain how a for loop works, briefly?", "Translate this", "abcd" * 10])
    col = {n: i for i, n in enumerate(FEATURE_NAMES)}
    assert f.shape == (3, 19)
    assert f[0, col["verb_explain"]] == 1 and f[0, 6:].sum() == 1  # explain outranks how
    assert f[0, col["has_code_keyword"]] == 1 and f[0, col["has_length_constraint"]] == 1
    assert f[0, col["ends_with_question"]] == 1 and f[0, col["clause_count"]] == 1
    assert f[1, 6:].sum() == 0  # translate matches first but has no column (as in Clairvoyant)
    assert f[2, col["prompt_token_len"]] == 10 and f[2, col["verb_other"]] == 1


def test_fit_predict_round_trip_and_beats_model_median(small, tmp_path):
    train, test = small
    pred = PREDICTORS.create("lexical-gbm").fit(train)
    est = pred.predict(test)
    assert est.quantiles.shape == (len(test), len(LEVELS)) and np.all(np.diff(est.quantiles, axis=1) >= 0)
    again = load_predictor(pred.save(tmp_path / "lex")).predict(test)
    assert np.array_equal(again.quantiles, est.quantiles) and np.array_equal(again.rank_score, est.rank_score)
    y, keep = training_targets(test)
    base = PREDICTORS.create("model-median").fit(train).predict(test)
    assert kendalltau(est.point[keep], y[keep]).statistic > kendalltau(base.point[keep], y[keep]).statistic + 0.1
    unseen = pred.predict([dataclasses.replace(test[0], model="acme--Other-1B")])
    assert np.isfinite(unseen.quantiles).all()


def test_errors(small):
    _, test = small
    with pytest.raises(ValueError, match="unknown parameter"):
        LexicalGBM(depth=3)
    for key, bad in (("learning_rate", 0.0), ("num_leaves", 1), ("calib_frac", 1.0), ("max_rounds", 0)):
        with pytest.raises(ValueError, match=f"lexical-gbm: parameter '{key}' must be in"):
            LexicalGBM(**{key: bad})
    pred = LexicalGBM()
    with pytest.raises(ValueError, match="fit"):
        pred.predict(test[:1])
    with pytest.raises(ValueError, match="'prompt'"):
        pred.fit([dataclasses.replace(test[0], prompt=None)])
