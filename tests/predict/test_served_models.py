"""Per-model conditioning for models a predictor never saw: names match canonically, an unseen
model warns once per predictor and model (naming the fallback), a predictor that ignores the
model never warns, and `presched predict` prints the warning instead of accepting silently."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import numpy as np
import pytest

from presched.predict.base import PREDICTORS
from presched.predict.estimate import LEVELS
from presched.predict.served_models import ServedModels, UnknownModelWarning, model_key, resolve_for
from presched.predict.text_gbm import TextGBM
from presched.workload.request import Request


def _reqs(models, n=30):
    """`n` requests per model; the k-th model answers k+1 times as long."""
    return [Request(id=f"{m}-{p}", prompt_tokens=p, output_tokens=(k + 1) * p, model=m, prompt=f"p{p}")
            for k, m in enumerate(models) for p in range(2, 2 + n)]  # fmt: skip


@pytest.fixture(scope="module")
def median():
    return PREDICTORS.create("model-median").fit(_reqs(["Qwen--Qwen2.5-7B-Instruct", "google--gemma-3-4b-it"]))


def test_model_key_is_canonical():
    assert model_key("Qwen/Qwen2.5-7B-Instruct") == model_key("Qwen--Qwen2.5-7B-Instruct") == "qwen--qwen2.5-7b-instruct"
    assert model_key("llama-3") != model_key("llama-3.1")


def test_resolve_maps_spellings_and_lists_the_unseen(median):
    known = ServedModels.of(median)
    reqs = [Request(id="a", prompt_tokens=3, model="qwen/qwen2.5-7b-instruct"),
            Request(id="b", prompt_tokens=3, model="new/x-9b"), Request(id="c", prompt_tokens=3, model="new/x-9b")]  # fmt: skip
    out, unknown = known.resolve(reqs)
    assert [r.model for r in out] == ["Qwen--Qwen2.5-7B-Instruct", "new/x-9b", "new/x-9b"]
    assert unknown == ["new/x-9b"] and [r.id for r in out] == ["a", "b", "c"]


def test_unseen_model_warns_once_per_predictor_and_model(median):
    reqs = [Request(id="b", prompt_tokens=3, model="new/x-9b")]
    with pytest.warns(UnknownModelWarning, match=r"'model-median' was not fitted on served model 'new/x-9b'.*pooled"):
        resolve_for(median, reqs)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        resolve_for(median, reqs)  # the second time: silent
        resolve_for(PREDICTORS.create("global-median").fit(_reqs(["a"])), reqs)  # ignores the model


def test_text_gbm_names_its_family_fallback():
    p = TextGBM()
    p.models = ["Qwen--Qwen2.5-7B-Instruct", "Qwen--Qwen2.5-14B-Instruct", "google--gemma-3-4b-it"]
    assert "2 qwen model(s)" in p.unknown_model_fallback("Qwen/Qwen3-8B")
    assert "all 3 models" in p.unknown_model_fallback("acme/Foo-7B")
    assert "per task type" not in p.unknown_model_fallback("acme/Foo-7B")
    from presched.predict.task_type import TaskOffsets

    p.task_offsets = TaskOffsets(p.models, np.zeros((2, 3, 2)))  # a fit with task offsets says so
    assert "spread (overall and per task type) of the 2 qwen" in p.unknown_model_fallback("Qwen/Qwen3-8B")


def test_predict_cli_warns_on_an_unseen_model(median, tmp_path):
    model = median.save(tmp_path / "m.npz")
    rows = tmp_path / "in.jsonl"
    rows.write_text("\n".join(json.dumps({"id": i, "prompt_tokens": 5, "model": m})
                              for i, m in enumerate(["Qwen/Qwen2.5-7B-Instruct", "acme/New-7B"])) + "\n")  # fmt: skip
    r = subprocess.run([sys.executable, "-m", "presched.cli", "predict", "-m", str(model), "-i", str(rows)],
                       capture_output=True, text=True, timeout=120)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "warning:" in r.stderr and "'acme/New-7B'" in r.stderr and "Qwen" not in r.stderr
    out = [json.loads(line) for line in r.stdout.splitlines()]
    assert [o["model"] for o in out] == ["Qwen/Qwen2.5-7B-Instruct", "acme/New-7B"]  # names as given
    mid = LEVELS.index(0.5)
    assert out[0]["point"] == pytest.approx(median.table["Qwen--Qwen2.5-7B-Instruct"][mid], rel=1e-3)
    assert out[1]["point"] == pytest.approx(median.table["__all__"][mid], rel=1e-3)  # the pooled fallback
    assert out[0]["point"] != pytest.approx(out[1]["point"], rel=0.05)
