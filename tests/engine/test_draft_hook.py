"""The draft model's hook (`presched.engine.plugin.draft`, OUTLETS) inside the real vLLM CPU
engine: speculative decoding with vLLM's `draft_model` method, the tiny random Llama drafting
for itself (the same weights, so its pooled prompt state must equal the target's and the
transformers reference on the same ids), 2 draft tokens per step.

One engine: chunked prefill in chunks of 32 tokens (every prompt is longer), 4 requests at once.
The draft model's first forward of a step reads each request's scheduled positions plus one
slot for the sampled token: a split that forgot that slot (or counted it twice) shifts every
later request's rows, so their pooled states would differ from their references. A draft-probe
fitted on reference features of other prompts must then give each request's final estimate
(pred_source 'draft-probe'). (That a served-model probe wins over it is test_plugin_units'.)
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time

import httpx
import numpy as np
import pytest

from presched.engine.plugin.features import unpack
from presched.engine.plugin.records import DRAFT_FEATURE_TABLE, FEATURE_TABLE

PROMPT_LENS = (41, 57, 73, 90)
OUTPUT = 24


def _prompts(lens, seed):
    rng = np.random.default_rng(seed)
    return [[1] + rng.integers(3, 4096, n - 1).tolist() for n in lens]


def _reference(tiny_model, prompts):
    from presched.predict.probe.features import PromptFeaturizer

    return PromptFeaturizer(tiny_model, layer=1, sink=1).encode_ids(prompts)["mean"]


def _fit(tiny_model, tmp_path_factory, name: str, role: str, scale: float):
    """A `name` predictor fitted on reference features of 40 other prompts (label scale x prompt
    tokens: the two probes below predict differently, so a test can tell whose estimate won)."""
    from presched.predict import PREDICTORS
    from presched.predict.probe.spec import FeatureSpec

    lens = np.random.default_rng(7).integers(20, 120, 40)
    X = _reference(tiny_model, _prompts(lens, 8))
    spec = FeatureSpec(model=tiny_model.name, layer=1, hidden=X.shape[1], pooling="mean", sink=1, role=role)
    pred = PREDICTORS.create(name, model=tiny_model.name, layer=1)
    pred.fit_features(X[:30], scale * lens[:30], X[30:], scale * lens[30:], spec=spec)
    return pred, pred.save(tmp_path_factory.mktemp(name) / f"{name}.npz")


@pytest.fixture(scope="module")
def draft_probe(tiny_model, tmp_path_factory):
    return _fit(tiny_model, tmp_path_factory, "draft-probe", "draft", 10.0)


@pytest.fixture(scope="module")
def drafted(engine_factory, tmp_path_factory, tiny_model, draft_probe):
    d = tmp_path_factory.mktemp("draft")
    rec = d / "rec.sqlite"
    plugin = {"policy": "fcfs", "records": str(rec), "features": {"layer": 1, "sink_tokens": 1, "draft_layer": 1},
              "draft_probe": str(draft_probe[1]), "stats": str(d / "stats.json")}  # fmt: skip
    eng = engine_factory(plugin=plugin, max_num_seqs=4, max_model_len=512, draft_model=tiny_model,
                         num_speculative_tokens=2, extra_args=("--max-num-batched-tokens", "32"))  # fmt: skip
    return eng, rec


async def _run(url: str, prompts: list[list[int]]) -> None:
    async with httpx.AsyncClient(timeout=120) as c:
        async def one(ids):
            body = dict(model="tiny", prompt=ids, max_tokens=OUTPUT, ignore_eos=True, temperature=0.0)
            r = await c.post(f"{url}/v1/completions", json=body)
            assert r.status_code == 200, r.text

        await asyncio.gather(*(one(p) for p in prompts))


def _rows(rec, table: str, n: int) -> dict[int, tuple]:
    q = (f"SELECT r.prompt_tokens, f.spec, f.n, f.missing, f.pools, f.vec, r.pred_source, r.pred_mean "
         f"FROM requests r JOIN {table} f ON f.id = r.id")  # fmt: skip
    t0 = time.monotonic()
    while True:  # a row is written when vLLM frees the request, just after the response
        with sqlite3.connect(rec) as c:
            have = c.execute("SELECT name FROM sqlite_master WHERE name = ?", (table,)).fetchone()
            rows = c.execute(q).fetchall() if have else []
        if len(rows) >= n or time.monotonic() - t0 > 10:
            return {r[0]: r for r in rows}
        time.sleep(0.1)


def test_draft_models_pooled_prompt_states_equal_the_reference_and_drive_the_estimate(
        drafted, tiny_model, draft_probe):  # fmt: skip
    eng, rec = drafted
    prompts = _prompts(PROMPT_LENS, 25)
    asyncio.run(_run(eng.url, prompts))
    draft = _rows(rec, DRAFT_FEATURE_TABLE, len(prompts))
    served = _rows(rec, FEATURE_TABLE, len(prompts))
    assert sorted(draft) == sorted(served) == list(PROMPT_LENS)
    ref = _reference(tiny_model, prompts)
    for ids, want in zip(prompts, ref):
        p, spec, n, missing, pools, vec, source, mean = draft[len(ids)]
        assert json.loads(spec) == {"model": tiny_model.name, "layer": 1, "hidden": 256, "pooling": "mean",
                                    "sink": 1, "role": "draft"}  # fmt: skip
        assert (n, missing, pools) == (p - 1, 0, 1)
        tol = dict(rtol=1e-4, atol=1e-4 * np.abs(want).max())
        np.testing.assert_allclose(unpack(vec), want, **tol)
        np.testing.assert_allclose(unpack(served[len(ids)][5]), want, **tol)  # the target's own pool
        assert source == "draft-probe"
        np.testing.assert_allclose(mean, draft_probe[0].predict_features(want[None])[0].mean, rtol=1e-4)
    stats = json.loads((rec.parent / "stats.json").read_text())
    assert stats["pred_draft_probe"] >= len(prompts) and stats["draft_probe_errors"] == 0
    # the engine really speculated: vLLM counts accepted draft tokens
    metrics = httpx.get(f"{eng.url}/metrics", timeout=10).text
    accepted = [float(line.split()[-1]) for line in metrics.splitlines()
                if line.startswith("vllm:spec_decode_num_accepted_tokens_total")]  # fmt: skip
    assert accepted and sum(accepted) > 0, "no draft token accepted: speculative decoding was off"
