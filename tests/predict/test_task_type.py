"""task_type.py: the code/text rule on the lexical cues (each clause at its threshold), per-type
model offsets recovered exactly from planted lengths with their fallbacks, and text-gbm's
`task_offsets` parameter (its columns, a round trip, the refusal without cues)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from presched.predict import load_predictor
from presched.predict import features as F
from presched.predict.data import castillo_requests
from presched.predict.task_type import TaskOffsets, code_task
from presched.predict.text_gbm import TextGBM, model_offsets

FAST = {"folds": 3, "svd": 8, "max_rounds": 60, "scale_folds": 2}


def _cues(**cols) -> np.ndarray:
    c = np.zeros((1, len(F.CUE_NAMES)))
    for k, v in cols.items():
        c[0, F.CUE_NAMES.index(k)] = v
    return c


@pytest.mark.parametrize("cols, code", [
    ({}, 0),
    ({"frac_code_chars": 0.03}, 0), ({"frac_code_chars": 0.031}, 1),
    ({"code_fences": 1}, 1),
    ({"log_code_lines": np.log1p(2)}, 0), ({"log_code_lines": np.log1p(3)}, 1),
    ({"kw_code": 1}, 1), ({"kw_test": 1}, 1),
    ({"kw_list": 1, "log_chars": 9.0, "kw_explain": 1}, 0),  # other cues do not make it code
])  # fmt: skip
def test_code_rule_clause_by_clause(cols, code):
    assert code_task(_cues(**cols)).tolist() == [code]


def test_code_rule_on_real_prompts():
    texts = ["Write a Python function that returns the n-th prime number.",
             "Tell me a short story about a lighthouse keeper and his dog.",
             "What is the capital of France?",
             "Given an array of integers, find two numbers that add up to a target.\n-----Input-----\n"
             "The first line contains n.\n-----Output-----\nPrint the indices."]  # fmt: skip
    assert code_task(F.lexical_cues(texts)).tolist() == [1, 0, 0, 1]


def test_offsets_per_task_are_recovered_and_fall_back_within_the_type():
    # two models, three prompts per type; model 0 is long on code and short on text, model 1 the reverse
    b = np.array([[-0.5, 0.5], [0.7, -0.7]])  # [task, model]
    t = np.array([1.0, 2.0, 3.0, 1.5, 2.5, 3.5])
    task_p = np.array([0, 0, 0, 1, 1, 1])
    p, m = np.repeat(np.arange(6), 2), np.tile([0, 1], 6)
    ly = t[p] + b[task_p[p], m]
    off = TaskOffsets.fit(["llama-3.1-8b", "qwen2.5-14b"], p, m, ly, task_p[p], model_offsets)
    assert np.allclose(off.stats[:, :, 0], b) and np.allclose(off.stats[:, :, 1], 0)
    rows = off.rows(["qwen2.5-14b", "qwen2.5-14b", "llama-3.1-8b"], np.array([0, 1, 1]))
    assert np.allclose(rows[:, 0], [0.5, -0.7, 0.7])
    # an unseen model of a known family takes that family's offset for the prompt's type;
    # one of an unknown family the type's mean over models
    assert np.allclose(off.rows(["Qwen2.5-72B-Instruct"], np.array([1]))[0], [-0.7, 0.0])
    assert np.allclose(off.rows(["zz-unknown-model"], np.array([1]))[0], [0.0, 0.0])
    # a model with no rows of a type: nan stats, the type's pool instead
    off2 = TaskOffsets.fit(["llama-3.1-8b", "qwen2.5-14b"], p[m == 0], m[m == 0], ly[m == 0],
                           task_p[p][m == 0], model_offsets)  # fmt: skip
    assert np.isnan(off2.stats[0, 1]).all()
    assert np.allclose(off2.rows(["qwen2.5-14b"], np.array([0]))[0], off2.stats[0, 0])


@pytest.fixture(scope="module")
def data(data_dir):
    models = ["llama-3.1-8b", "qwen2.5-14b"]

    def first_prompts(reqs, n):  # both models' rows of the first n prompts
        keep = set(list(dict.fromkeys(r.prompt for r in reqs))[:n])
        return [r for r in reqs if r.prompt in keep]

    return (first_prompts(castillo_requests("validate", models=models), 800),
            first_prompts(castillo_requests("test", models=models), 150))


def test_text_gbm_task_offsets_columns_and_round_trip(data, tmp_path):
    train, test = data
    pred = TextGBM(**FAST, task_offsets=True).fit(train)
    names = pred.feature_names()
    assert names[-3:] == ["task_offset", "task_spread", "code_task"]
    off = TextGBM(**FAST, task_offsets=False).fit(train)
    assert off.task_offsets is None and "task_stats" not in off.state()[0]
    assert pred.booster.num_feature() == len(names) == len(off.feature_names()) + 3
    assert TextGBM(**FAST).fit(train).feature_names() == names  # on by default
    D = pred._features(test)
    task = code_task(F.lexical_cues([r.prompt for r in test]))
    assert D[:, -1].tolist() == task.tolist()
    expect = pred.task_offsets.rows([r.model for r in test], task)[:, 0]
    assert np.allclose(D[:, -3], expect)
    assert len(set(np.round(D[:, -3], 9))) >= 3  # the offset differs by model and by type
    est = pred.predict(test)
    again = load_predictor(pred.save(tmp_path / "t.npz")).predict(test)
    assert np.array_equal(again.quantiles, est.quantiles)
    other = pred.predict([dataclasses.replace(r, model="Mistral-7B-Instruct-v0.3") for r in test[:20]])
    assert np.isfinite(other.quantiles).all()


def test_task_offsets_need_the_cues():
    with pytest.raises(ValueError, match="'task_offsets' needs 'cues'"):
        TextGBM(task_offsets=True, cues=False)
    with pytest.raises(ValueError, match="parameter 'task_offsets' must be true, false or null, got 'yes'"):
        TextGBM(task_offsets="yes")
    assert TextGBM(cues=False).params["task_offsets"] is None  # the default: on only with the cues


def test_a_model_file_from_before_task_offsets_still_loads_and_predicts_the_same(data, tmp_path):
    # a file written before the parameter existed: no `task_offsets` in its params, no
    # `task_stats` array; it must load (same format version) and predict exactly as it did
    import json

    train, test = data
    old = TextGBM(**FAST, task_offsets=False).fit(train)
    path = old.save(tmp_path / "old.npz")
    with np.load(path, allow_pickle=False) as z:
        header = json.loads(str(z["__header__"]))
        arrays = {k: z[k] for k in z.files if k != "__header__"}
    del header["params"]["task_offsets"]
    np.savez_compressed(path, __header__=np.array(json.dumps(header)), **arrays)
    back = load_predictor(path)
    assert back.task_offsets is None and back.params["task_offsets"] is None
    assert np.array_equal(back.predict(test).quantiles, old.predict(test).quantiles)
