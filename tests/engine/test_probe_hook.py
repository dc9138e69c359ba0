"""The hidden-state hook (`presched.engine.plugin.worker`) inside the real vLLM CPU engine, on the
tiny random Llama (2 layers: the default layer n // 2 = 1), checked against the transformers
reference (`presched.predict.probe.features`) on the same token ids.

One engine: chunked prefill in chunks of 32 tokens (every prompt is longer), 4 requests at
once (several per step), and KV blocks forced short (4 usable x 128 tokens for ~800 tokens of
work) so that vLLM preempts and recomputes. Each request's pooled prompt state, read back from
the plugin's records, must equal its own prompt's reference (a row given to the wrong request
or a chunk pooled twice fails it), pool exactly its non-sink positions, be shipped again after
a recompute, and come with one per-step state per generated token. (Preemption here falls
after the prompts are pooled; the sum's reset for a request preempted mid-prefill is tested
without the engine, test_plugin_features.py, on random schedules.)
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
from presched.engine.plugin.records import FEATURE_TABLE

PROMPT_LENS = (41, 57, 73, 90)
OUTPUT = 150


@pytest.fixture(scope="module")
def hooked(engine_factory, tmp_path_factory):
    rec = tmp_path_factory.mktemp("hook") / "rec.sqlite"
    plugin = {"policy": "fcfs", "records": str(rec), "features": {"sink_tokens": 1}}
    eng = engine_factory(plugin=plugin, max_num_seqs=4, num_gpu_blocks_override=5, max_model_len=512,
                         extra_args=("--max-num-batched-tokens", "32"))  # fmt: skip
    return eng, rec


async def _run(url: str, prompts: list[list[int]]) -> list[dict]:
    async with httpx.AsyncClient(timeout=120) as c:
        async def one(ids):
            r = await c.post(f"{url}/v1/completions", json=dict(
                model="tiny", prompt=ids, max_tokens=OUTPUT, ignore_eos=True, temperature=0.0))
            assert r.status_code == 200, r.text
            return r.json()

        return await asyncio.gather(*(one(p) for p in prompts))


def _rows(rec, n: int) -> list[tuple]:
    q = (f"SELECT r.prompt_tokens, r.output_tokens, r.preemptions, f.spec, f.n, f.missing, "
         f"f.pools, f.steps, f.vec FROM requests r JOIN {FEATURE_TABLE} f ON f.id = r.id")  # fmt: skip
    t0 = time.monotonic()
    while True:  # a row is written when vLLM frees the request, just after the response
        with sqlite3.connect(rec) as c:
            rows = c.execute(q).fetchall() if c.execute(
                f"SELECT name FROM sqlite_master WHERE name = '{FEATURE_TABLE}'").fetchone() else []
        if len(rows) >= n or time.monotonic() - t0 > 10:
            return rows
        time.sleep(0.1)


def test_pooled_prompt_states_equal_the_reference_under_chunks_batching_and_preemption(
        hooked, tiny_model):  # fmt: skip
    from presched.predict.probe.features import PromptFeaturizer

    eng, rec = hooked
    rng = np.random.default_rng(15)
    prompts = [[1] + rng.integers(3, 4096, n - 1).tolist() for n in PROMPT_LENS]
    asyncio.run(_run(eng.url, prompts))
    rows = {r[0]: r for r in _rows(rec, len(prompts))}
    assert sorted(rows) == list(PROMPT_LENS)
    ref = PromptFeaturizer(tiny_model, layer=None, sink=1).encode_ids(prompts)["mean"]
    for ids, want in zip(prompts, ref):
        p, out, preempt, spec, n, missing, pools, steps, vec = rows[len(ids)]
        assert json.loads(spec) == {"model": tiny_model.name, "layer": 1, "hidden": 256,
                                    "pooling": "mean", "sink": 1}  # fmt: skip
        got = unpack(vec)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
        assert (n, missing) == (p - 1, 0)
        assert steps == out == OUTPUT  # one per-step state per generated token
        assert 1 <= pools <= 1 + preempt  # shipped again after a recompute of the prompt
    preempted = [r for r in rows.values() if r[2] > 0]
    assert preempted, "the forced-short KV cache preempted nothing: the reset path is untested"
    assert any(r[6] > 1 for r in preempted), "no request was recomputed after its prompt pooled"
