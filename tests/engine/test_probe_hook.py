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

The same engine runs a probe (plugin config `probe`) fitted offline on the reference features of
other prompts, labelled 10 x prompt tokens: each request's final estimate (the record's
pred_mean / pred_quantiles) must be the probe's prediction on its own reference feature, with
pred_source 'probe', except for a request that sent its own prediction in vllm_xargs. It also
runs a `probe-refine` model (plugin config `refine`, at REFINE_AT tokens, which the requests
above never reach): a longer request's final estimate must be that model's prediction on the
reference state at its own REFINE_AT-th generated token and its reference prompt state. The
records keep the per-step states at `features.record_steps` (RECORD_AT, REFINE_AT): the state
of a longer request at REFINE_AT must be that same reference state, every request has one at
RECORD_AT and none at a token it did not reach, its answer-so-far pool at REFINE_AT must be the
mean of the reference states at tokens 1..REFINE_AT, and `presched train -p probe-refine
--from-log` trains on them.
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
from presched.engine.plugin.records import (
    ANSWER_FEATURE_TABLE,
    EGTP_FEATURE_TABLE,
    FEATURE_TABLE,
    STEP_FEATURE_TABLE,
)

PROMPT_LENS = (41, 57, 73, 90)
OUTPUT = 150
REFINE_AT = 160  # beyond OUTPUT: only the refine test's longer requests are refined
RECORD_AT = 20  # features.record_steps = [RECORD_AT, REFINE_AT]: every request reaches RECORD_AT


def _prompts(lens, seed):
    rng = np.random.default_rng(seed)
    return [[1] + rng.integers(3, 4096, n - 1).tolist() for n in lens]


def _reference(tiny_model, prompts, pooling="mean"):
    from presched.predict.probe.features import PromptFeaturizer

    return PromptFeaturizer(tiny_model, layer=None, sink=1).encode_ids(prompts)[pooling]


@pytest.fixture(scope="module")
def probe(tiny_model, tmp_path_factory):
    """A probe fitted on the reference features of 40 other prompts, label 10 x prompt tokens."""
    from presched.predict import PREDICTORS
    from presched.predict.probe.spec import FeatureSpec

    lens = np.random.default_rng(7).integers(20, 120, 40)
    X = _reference(tiny_model, _prompts(lens, 8))
    spec = FeatureSpec(model=tiny_model.name, layer=1, hidden=X.shape[1], pooling="mean", sink=1)
    pred = PREDICTORS.create("probe", model=tiny_model.name, layer=1)
    pred.fit_features(X[:30], 10.0 * lens[:30], X[30:], 10.0 * lens[30:], spec=spec)
    return pred, pred.save(tmp_path_factory.mktemp("probe") / "probe.npz")


@pytest.fixture(scope="module")
def refine(tiny_model, tmp_path_factory):
    """A probe-refine model fitted on reference states of random prompts and answers at
    REFINE_AT (random remaining lengths: what is checked is that the engine feeds it the right
    state, not what it learnt)."""
    from presched.predict import PREDICTORS
    from presched.predict.probe.features import PromptFeaturizer

    rng = np.random.default_rng(11)
    prompts = _prompts(rng.integers(20, 80, 24), 12)
    answers = [rng.integers(3, 4096, REFINE_AT + 4).tolist() for _ in prompts]
    fz = PromptFeaturizer(tiny_model, layer=None, sink=1)
    S = fz.encode_steps(list(zip(prompts, answers)), [REFINE_AT])[:, 0]
    P = fz.encode_ids(prompts)["mean"]
    g = np.full(len(S), float(REFINE_AT))
    L = g + rng.integers(5, 300, len(S))
    pred = PREDICTORS.create("probe-refine", model=tiny_model.name, layer=1)
    pred.fit_steps(S[:16], P[:16], g[:16], L[:16], S[16:], P[16:], g[16:], L[16:])
    return pred, pred.save(tmp_path_factory.mktemp("refine") / "refine.npz"), fz


@pytest.fixture(scope="module")
def hooked(engine_factory, tmp_path_factory, probe, refine):
    d = tmp_path_factory.mktemp("hook")
    rec = d / "rec.sqlite"
    plugin = {"policy": "fcfs", "records": str(rec),
              "features": {"sink_tokens": 1, "egtp": True, "record_steps": [RECORD_AT, REFINE_AT]},
              "probe": str(probe[1]), "refine": str(refine[1]), "refine_at": [REFINE_AT],
              "stats": str(d / "stats.json")}  # fmt: skip
    eng = engine_factory(plugin=plugin, max_num_seqs=4, num_gpu_blocks_override=5, max_model_len=512,
                         extra_args=("--max-num-batched-tokens", "32"))  # fmt: skip
    return eng, rec


async def _run(url: str, prompts: list[list[int]], xargs=None, output: int = OUTPUT, **extra) -> list[dict]:
    async with httpx.AsyncClient(timeout=120) as c:
        async def one(ids, xa):
            body = dict(model="tiny", prompt=ids, max_tokens=output, ignore_eos=True, temperature=0.0, **extra)
            if xa:
                body["vllm_xargs"] = xa
            r = await c.post(f"{url}/v1/completions", json=body)
            assert r.status_code == 200, r.text
            return r.json()

        return await asyncio.gather(*(one(p, x) for p, x in zip(prompts, xargs or [None] * len(prompts))))


def _rows(rec, n: int, table: str = FEATURE_TABLE) -> list[tuple]:
    q = (f"SELECT r.prompt_tokens, r.output_tokens, r.preemptions, f.spec, f.n, f.missing, "
         f"f.pools, f.steps, f.vec, r.pred_source, r.pred_mean, r.pred_quantiles "
         f"FROM requests r JOIN {table} f ON f.id = r.id")  # fmt: skip
    t0 = time.monotonic()
    while True:  # a row is written when vLLM frees the request, just after the response
        with sqlite3.connect(rec) as c:
            rows = c.execute(q).fetchall() if c.execute(
                f"SELECT name FROM sqlite_master WHERE name = '{table}'").fetchone() else []
        if len(rows) >= n or time.monotonic() - t0 > 10:
            return rows
        time.sleep(0.1)


def _assert_probe_estimate(row, probe, ref) -> None:
    """The record's final estimate is the probe's prediction on the request's reference feature."""
    want = probe.predict_features(ref[None])[0]
    assert row[9] == "probe"
    np.testing.assert_allclose(row[10], want.mean, rtol=1e-4)
    np.testing.assert_allclose(json.loads(row[11]), want.quantiles, rtol=1e-4)


def test_pooled_prompt_states_equal_the_reference_under_chunks_batching_and_preemption(
        hooked, tiny_model, probe):  # fmt: skip
    eng, rec = hooked
    prompts = _prompts(PROMPT_LENS, 15)
    asyncio.run(_run(eng.url, prompts))
    rows = {r[0]: r for r in _rows(rec, len(prompts))}
    assert sorted(rows) == list(PROMPT_LENS)
    ref = _reference(tiny_model, prompts)
    for ids, want in zip(prompts, ref):
        _assert_probe_estimate(rows[len(ids)], probe[0], want)
        p, out, preempt, spec, n, missing, pools, steps, vec = rows[len(ids)][:9]
        assert json.loads(spec) == {"model": tiny_model.name, "layer": 1, "hidden": 256,
                                    "pooling": "mean", "sink": 1, "role": "served"}  # fmt: skip
        got = unpack(vec)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.abs(want).max())
        assert (n, missing) == (p - 1, 0)
        assert steps == out == OUTPUT  # one per-step state per generated token
        assert 1 <= pools <= 1 + preempt  # shipped again after a recompute of the prompt
    preempted = [r for r in rows.values() if r[2] > 0]
    assert preempted, "the forced-short KV cache preempted nothing: the reset path is untested"
    assert any(r[6] > 1 for r in preempted), "no request was recomputed after its prompt pooled"
    # EGTP (features.egtp): the entropy-weighted pools of the same positions, with entropies of
    # vLLM's own logits at every prompt position, equal transformers' (its logits, its entropies).
    # The random model's entropies are all ~8.27 nats (near uniform over 4,096 tokens), so EGTP
    # moves the mean by only ~2e-5 of its norm: what is compared is that move, which an entropy
    # taken one position off changes by ~50 % (measured; the fp32 difference here is under 1 %)
    egtp = {r[0]: r for r in _rows(rec, len(prompts), EGTP_FEATURE_TABLE)}
    for ids, want, mean in zip(prompts, _reference(tiny_model, prompts, "egtp"), ref):
        row = egtp[len(ids)]
        assert json.loads(row[3])["pooling"] == "egtp" and (row[4], row[5]) == (len(ids) - 1, 0)
        move, got = want - mean, unpack(row[8]) - unpack(rows[len(ids)][8])
        err = np.linalg.norm(got - move) / np.linalg.norm(move)
        assert err < 0.15, (len(ids), err)


def test_a_requests_own_prediction_wins_over_the_probe(hooked, tiny_model, probe):
    eng, rec = hooked
    own, plain = 45, 61  # prompt lengths the test above does not use
    prompts = _prompts((own, plain), 16)
    from presched.engine.plugin.estimates import from_xargs

    xargs = {"presched_pred_mean": 77.0}
    asyncio.run(_run(eng.url, prompts, [xargs, None]))
    rows = {r[0]: r for r in _rows(rec, len(PROMPT_LENS) + 2)}
    assert rows[own][9] == "xargs"
    np.testing.assert_allclose(json.loads(rows[own][11]), from_xargs(xargs).quantiles, rtol=1e-9)
    _assert_probe_estimate(rows[plain], probe[0], _reference(tiny_model, prompts)[1])
    stats = json.loads((rec.parent / "stats.json").read_text())
    n = len(PROMPT_LENS) + 1  # + recomputes: a preempted request is probed again when re-pooled
    assert stats["pred_probe"] >= n and stats["probe_errors"] == 0 and stats["pred_xargs"] == 1


def test_probe_refine_replaces_the_estimate_from_the_engines_own_step_state(hooked, tiny_model, probe, refine):
    eng, rec = hooked
    lens = (38, 66)  # prompt lengths the tests above do not use
    prompts = _prompts(lens, 18)
    outs = asyncio.run(_run(eng.url, prompts, output=REFINE_AT + 12, return_token_ids=True))
    rows = {r[0]: r for r in _rows(rec, len(PROMPT_LENS) + 2 + len(lens))}
    pred, _, fz = refine
    answers = [o["choices"][0]["token_ids"] for o in outs]
    S = fz.encode_steps(list(zip(prompts, answers)), [REFINE_AT])[:, 0]
    P = _reference(tiny_model, prompts)
    want = pred.predict_steps(S, P, np.full(len(lens), float(REFINE_AT)))
    for i, n in enumerate(lens):
        row = rows[n]
        assert row[9] == "refine", row[9]  # the probe's step-0 estimate was replaced
        np.testing.assert_allclose(row[10], want[i].mean, rtol=1e-3)
        np.testing.assert_allclose(json.loads(row[11]), want[i].quantiles, rtol=1e-3)
    stats = json.loads((rec.parent / "stats.json").read_text())
    assert stats["pred_refine"] >= len(lens) and stats["refine_errors"] == 0
    # features.record_steps: the records' state at REFINE_AT is the reference state there
    states, lengths = _step_rows(rec, n_at_refine=len(lens))
    assert len(lengths) == len(PROMPT_LENS) + 2 + len(lens)
    for i, n in enumerate(lens):
        spec, vec = states[n][REFINE_AT]
        assert json.loads(spec) == {"model": tiny_model.name, "layer": 1, "hidden": 256,
                                    "pooling": "step", "sink": 1, "role": "served"}  # fmt: skip
        np.testing.assert_allclose(unpack(vec), S[i], rtol=1e-4, atol=1e-4 * np.abs(S[i]).max())
    for p, out in lengths.items():  # every request reached RECORD_AT; none has a row at g >= L
        assert RECORD_AT in states.get(p, {}) and all(g < out for g in states[p]), (p, out, sorted(states.get(p, {})))
        assert set(states[p]) == ({RECORD_AT, REFINE_AT} if out > REFINE_AT else {RECORD_AT})
    # ... and its answer-so-far pool there the mean of the reference states at tokens 1..REFINE_AT
    # (a state lost or added twice around a preemption, or token 0's state pooled, fails it)
    A = fz.encode_steps(list(zip(prompts, answers)), range(1, REFINE_AT + 1)).mean(axis=1)
    pools, _ = _step_rows(rec, n_at_refine=len(lens), table=ANSWER_FEATURE_TABLE)
    for i, n in enumerate(lens):
        spec, vec = pools[n][REFINE_AT]
        assert json.loads(spec)["pooling"] == "answer"
        np.testing.assert_allclose(unpack(vec), A[i], rtol=1e-4, atol=1e-4 * np.abs(A[i]).max())
    # presched train -p probe-refine --from-log on the records trains a model that loads
    from presched.predict import load_predictor
    from presched.serve.train_log import train_from_log

    # (sent with ignore_eos: every request was cut by max_tokens, so keep_censored)
    path, report = train_from_log(rec, "probe-refine", rec.parent / "from-log.npz", keep_censored=True,
                                  params={"model": tiny_model.name, "layer": 1})  # fmt: skip
    back = load_predictor(path)
    assert type(back).__name__ == "ProbeRefine" and back.hidden == 256
    assert report["validation_requests"] >= 1
    assert np.isfinite(back.predict_steps(S, P, np.full(len(lens), float(REFINE_AT))).quantiles).all()


def _step_rows(rec, n_at_refine: int, table: str = STEP_FEATURE_TABLE) -> tuple[dict, dict]:
    """({prompt tokens: {g: (spec, vec)}} of the records' step_features, {prompt tokens:
    output_tokens} of every request), once `n_at_refine` rows at REFINE_AT are written (a
    request's step rows follow its requests row)."""
    q = (f"SELECT r.prompt_tokens, f.g, f.spec, f.vec FROM requests r "
         f"JOIN {table} f ON f.id = r.id")  # fmt: skip
    t0 = time.monotonic()
    while True:
        with sqlite3.connect(rec) as c:
            rows = c.execute(q).fetchall()
            lengths = dict(c.execute("SELECT prompt_tokens, output_tokens FROM requests").fetchall())
        if sum(g == REFINE_AT for _, g, _, _ in rows) >= n_at_refine:
            break
        if time.monotonic() - t0 > 10:
            pytest.fail(f"{table}: {sum(g == REFINE_AT for _, g, _, _ in rows)} rows at g={REFINE_AT} "
                        f"after 10 s, {n_at_refine} expected ({len(rows)} step rows, {len(lengths)} requests)")
        time.sleep(0.1)
    states: dict = {}
    for p, g, spec, vec in rows:
        states.setdefault(p, {})[g] = (spec, vec)
    return states, lengths
