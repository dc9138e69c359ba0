"""text-gbm-static on a real CASTILLO slice: its extra columns are the semantic ridge score and
the first embedding components, the saved file predicts alone (the table is inside), and
ngram_score=False really drops the n-gram score. The distilled MiniLM table is replaced by a
TEST DOUBLE (seeded random vectors over the same o200k ids): distilling takes minutes of CPU
and needs model2vec, which the test environment does not have; the benchmark runs the real one."""

from __future__ import annotations

import numpy as np
import pytest

from presched.predict import load_predictor
from presched.predict.data import castillo_requests
from presched.predict.static_embed import StaticTable
from presched.predict.text_gbm_static import TextGBMStatic

FAST = {"folds": 3, "svd": 8, "max_rounds": 60, "scale_folds": 2, "static_dims": 12, "static_features": 4}
MODELS = ["llama-3.1-8b"]


@pytest.fixture(autouse=True)
def fake_distill(monkeypatch):
    def distill(dims, vocab_ids, head=256, tail=64):
        ids = np.unique(np.asarray(vocab_ids, dtype=np.int64))
        return StaticTable(ids, np.random.default_rng(0).normal(size=(ids.size, dims)), head, tail)

    monkeypatch.setattr(StaticTable, "distill", staticmethod(distill))


@pytest.fixture(scope="module")
def small(data_dir):
    return castillo_requests("validate", models=MODELS), castillo_requests("test", models=MODELS)[:300]


def test_fit_save_load_and_extra_columns(small, tmp_path, fake_distill):
    train, test = small
    p = TextGBMStatic(**FAST).fit(train)
    names = p.feature_names()
    assert names[-5:] == ["sem_score", "static0", "static1", "static2", "static3"]
    D = p._features(test)
    assert D.shape[1] == len(names) == p.booster.num_feature()
    assert p.table.vectors.shape[1] == 1 + 4  # only the columns predict reads are kept
    back = load_predictor(p.save(tmp_path / "s.npz"))
    assert isinstance(back, TextGBMStatic)
    assert np.allclose(back.predict(test).quantiles, p.predict(test).quantiles)


def test_ngram_score_off_is_a_constant_column(small, fake_distill):
    train, test = small
    p = TextGBMStatic(**FAST, ngram_score=False).fit(train)
    D = p._features(test)
    assert np.all(D[:, p.feature_names().index("text_score")] == 0)


def test_parameters_are_checked():
    with pytest.raises(ValueError, match="unknown parameter"):
        TextGBMStatic(static_dim=3)
    with pytest.raises(ValueError, match="static_features"):
        TextGBMStatic(static_dims=8, static_features=9)


def test_a_saved_model_loads_in_a_fresh_process(small, tmp_path):
    # load_predictor (and a stack member) finds text-gbm-static without anything importing it
    # first (base.LAZY_MODULES); a fresh interpreter had only presched.predict's own predictors
    import subprocess
    import sys

    train, test = small
    path = TextGBMStatic(**FAST).fit(train).save(tmp_path / "s.npz")
    code = ("from presched.predict import load_predictor, PREDICTORS; import sys\n"
            f"p = load_predictor({str(path)!r}); print(type(p).__name__)\n"
            "PREDICTORS.create('stack', members=['text-gbm', 'text-gbm-static'], member_params={})")  # fmt: skip
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip() == "TextGBMStatic"


def test_the_default_eval_list_has_it_only_where_it_can_fit(monkeypatch):
    """Without model2vec (the `static` extra) it was listed and failed at fit in every run."""
    import importlib.util

    from presched.predict.evaluate import available_predictors, discover_predictors

    discover_predictors()
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda m, *a: None if m == "model2vec" else real(m, *a))
    assert "text-gbm-static" not in available_predictors() and "text-gbm" in available_predictors()
    monkeypatch.setattr(importlib.util, "find_spec", lambda m, *a: object() if m == "model2vec" else real(m, *a))
    assert "text-gbm-static" in available_predictors()
