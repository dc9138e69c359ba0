"""The hook's row split (`features.split_rows`), its delivery to seqs and its records, without
an engine: random chunked-prefill schedules of several requests per step, each row of the step's
tensor tagged with its (request, position), must pool every prompt's non-sink positions exactly
once, finish each prompt on the chunk that holds its last position, and point each request's
last row at its last scheduled (verified) position."""

from __future__ import annotations

import sqlite3
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from presched.engine.plugin.config import PluginConfigError
from presched.engine.plugin.features import (WORKER_CLS, PromptPools, StepFeatures,
                                             check_engine_config, deliver, split_rows,
                                             unpack)  # fmt: skip
from presched.engine.plugin.records import FEATURE_TABLE, RecordWriter


@st.composite
def schedules(draw, preempt: bool = False):
    """(prompt lengths, sink, steps); each step: (order, {req: n scheduled}, computed before,
    preempted before it). As vLLM: a request computes its P + generated tokens, samples when it
    reaches them; `preempt`: a running request may go back to 0 (recompute)."""
    n = draw(st.integers(1, 5))
    plen = {f"r{i}": draw(st.integers(1, 40)) for i in range(n)}
    out = {r: draw(st.integers(1, 4)) for r in plen}
    sink = draw(st.integers(0, 3))
    budget = draw(st.integers(1, 40))
    computed, gen, steps = dict.fromkeys(plen, 0), dict.fromkeys(plen, 0), []
    while any(gen[r] < out[r] for r in plen):
        order = draw(st.permutations(sorted(plen)))
        gone = [r for r in order if preempt and 0 < computed[r] and gen[r] < out[r]
                and draw(st.integers(0, 5)) == 0]  # fmt: skip
        for r in gone:
            computed[r] = 0
        left, sched = budget, {}
        for r in order:
            if gen[r] >= out[r] or left == 0:
                continue
            k = draw(st.integers(0, min(plen[r] + gen[r] - computed[r], left)))
            if k:
                sched[r] = k
                left -= k
        if not sched:  # at least the first unfinished request moves
            r = next(r for r in order if gen[r] < out[r])
            sched[r] = 1
        steps.append((list(order), sched, dict(computed), gone))
        for r, k in sched.items():
            computed[r] += k
            if computed[r] == plen[r] + gen[r]:
                gen[r] += 1
    return plen, sink, steps


@settings(derandomize=True, deadline=None, max_examples=150)
@given(schedules(), st.integers(0, 3), st.integers(0, 2))
def test_rows_pool_each_prompt_once_under_chunked_prefill(case, pad, extra):
    """`extra`: rows after each request's scheduled ones (the draft model's first forward has
    one slot per request for the sampled token: extra = 1)."""
    plen, sink, steps = case
    pooled = {r: [] for r in plen}
    done = dict.fromkeys(plen, 0)
    for order, sched, computed, _ in steps:
        rows = []  # the step's tensor: each row tagged (request, position); then padding
        for r in order:
            if sched.get(r, 0):
                rows += [(r, computed[r] + j) for j in range(sched[r])] + [("slot", r)] * extra
        rows += [("pad", -1)] * pad
        pieces = split_rows(order, sched, computed, plen, sink, extra=extra)
        assert [p.req_id for p in pieces] == [r for r in order if r in sched]
        for p in pieces:
            assert rows[p.first] == (p.req_id, computed[p.req_id])
            assert rows[p.last] == (p.req_id, computed[p.req_id] + sched[p.req_id] - 1)
            if p.pool is not None:
                got = rows[p.pool[0]: p.pool[1]]
                assert {r for r, _ in got} == {p.req_id}
                pooled[p.req_id] += [pos for _, pos in got]
            done[p.req_id] += p.prompt_done
            if p.prompt_done:
                assert computed[p.req_id] < plen[p.req_id] <= computed[p.req_id] + p.rows
    for r, p in plen.items():
        assert pooled[r] == list(range(min(sink, p), p)), r
        assert done[r] == 1


@settings(derandomize=True, deadline=None, max_examples=150)
@given(schedules(preempt=True), st.booleans())
def test_pools_restart_when_vllm_recomputes_a_preempted_request(case, told):
    """Every pooled prompt state is its own prompt's non-sink positions, once each, also when a
    request is preempted mid-prefill; `told`: the worker is also told which were preempted
    (vLLM's preempted_req_ids) - without it the position going back must restart the sum."""
    plen, sink, steps = case
    pools = PromptPools(sink, lambda: np.zeros(2), np.float64)
    done = {r: [] for r in plen}
    for order, sched, computed, gone in steps:
        if told:
            pools.drop(gone)
        rows = np.array([[computed[r] + j, 1.0] for r in order for j in range(sched.get(r, 0))])
        pieces = split_rows(order, sched, computed, plen, sink)
        for rid, pool in pools.add(pieces, plen, rows):
            done[rid].append((pool.sum.tolist(), pool.n, pool.missing))
    for r, p in plen.items():
        want = [float(sum(range(sink, p))), float(max(p - sink, 0))]
        assert done[r] and all(d == (want, max(p - sink, 0), 0) for d in done[r]), (r, done[r])


@settings(derandomize=True, deadline=None, max_examples=60)
@given(schedules(preempt=True), st.integers(0, 2**32 - 1))
def test_entropy_weighted_pools_are_egtps_under_chunks_and_recomputes(case, seed):
    """Weighted sums across chunks give EGTP's pool sum_i H_i row_i / sum_i H_i over the non-sink
    positions (row = its position; H = a fixed function of the position, some zero), and the
    plain mean where every weight of a prompt is 0 (as `pool_entropy`)."""
    plen, sink, steps = case
    h = np.random.default_rng(seed).choice([0.0, 0.5, 2.0], size=4096)  # past every prompt + answer
    pools = PromptPools(sink, lambda: np.zeros(2), np.float64)
    for order, sched, computed, gone in steps:
        pools.drop(gone)
        pos = [computed[r] + j for r in order for j in range(sched.get(r, 0))]
        rows = np.array([[p, 1.0] for p in pos]).reshape(-1, 2)
        for rid, pool in pools.add(split_rows(order, sched, computed, plen, sink), plen, rows, h[pos]):
            ps = np.arange(sink, plen[rid])
            if not ps.size:  # nothing after the sink: never shipped (the worker keeps n > 0)
                continue
            w = h[ps]
            want = (w @ np.c_[ps, np.ones_like(ps)]) / w.sum() if w.sum() > 0 else np.array([ps.mean(), 1.0])
            np.testing.assert_allclose(pool.weighted(), want, rtol=1e-12)
            np.testing.assert_allclose(pool.mean(), [ps.mean(), 1.0], rtol=1e-12)


def test_spec_tokens_are_not_the_last_verified_row():
    (a, b) = split_rows(["a", "b"], {"a": 3, "b": 1}, {"a": 10, "b": 4}, {"a": 5, "b": 4}, 1,
                        {"a": 2})  # fmt: skip
    assert (a.last, b.last) == (0, 3) and a.pool is None and not b.prompt_done


def _seq(rid, generated=0):
    return SimpleNamespace(id=rid, features_prompt=None, features_n=0, features_missing=0, generated=generated,
                           feature_pools=0, features_step=None, feature_steps=0, features_step_g=0,
                           features_draft=None, draft_n=0, draft_missing=0, draft_pools=0,
                           features_egtp=None)  # fmt: skip


def test_delivery_to_seqs_and_records(tmp_path):
    seqs = {"a": _seq("a"), "b": _seq("b", generated=5)}
    sf = StepFeatures(layer=1, sink=1, hidden=3, prompt_ids=["a", "gone"],
                      prompt=np.array([[1, 2, 3], [4, 5, 6]], np.float32), prompt_n=[7, 1],
                      prompt_missing=[0, 0], step_ids=["b", "a"],
                      step=np.array([[0, 0, 1], [0, 1, 0]], np.float32))  # fmt: skip
    deliver(sf, seqs)  # "gone" was freed: dropped
    seqs["a"].generated = 1  # the scheduler counts the step's token after delivery
    deliver(StepFeatures(layer=1, sink=1, hidden=3, step_ids=["a"],
                         step=np.array([[9, 9, 9]], np.float32)), seqs)  # fmt: skip
    a, b = seqs["a"], seqs["b"]
    assert a.features_prompt.tolist() == [1, 2, 3] and a.features_n == 7 and a.feature_pools == 1
    assert a.features_step.tolist() == [9, 9, 9] and a.feature_steps == 2
    assert b.features_prompt is None and b.features_step.tolist() == [0, 0, 1]
    # each state is at the token its step read: g = tokens generated before that step
    assert (a.features_step_g, b.features_step_g) == (1, 5)
    w = RecordWriter(tmp_path / "r.sqlite")
    w.write_features(a, '{"layer": 1}')
    w.close()
    row = sqlite3.connect(tmp_path / "r.sqlite").execute(
        f"SELECT id, spec, n, pools, steps, vec FROM {FEATURE_TABLE}").fetchone()
    assert row[:5] == ("a", '{"layer": 1}', 7, 1, 2) and unpack(row[5]).tolist() == [1, 2, 3]


def _assert_trains_from_log(log, name: str, params: dict, reqs) -> None:
    """`presched train -p name --from-log log` fits the planted law (log length in column 0)."""
    from presched.predict import load_predictor
    from presched.serve.train_log import train_from_log

    path, _ = train_from_log(log, name, log.parent / f"{name}.npz", params=params)
    est = load_predictor(path).predict(reqs)
    got = np.array([r.output_tokens for r in reqs])
    assert np.corrcoef(np.log(est.point), np.log(got))[0, 1] > 0.95


def test_probe_trains_from_the_engine_records(tmp_path):
    """`presched train -p probe --from-log` on records with a prompt_features table: the vectors
    reach the probe under their FeatureSpec key (a length read off the first coordinate)."""
    from presched.serve.log_read import load_log_requests

    rng = np.random.default_rng(0)
    spec = '{"model": "tiny-llama", "layer": 1, "hidden": 4, "pooling": "mean", "sink": 1}'
    w = RecordWriter(tmp_path / "r.sqlite")
    for i in range(60):
        n = int(rng.integers(5, 400))
        vec = np.r_[np.log(n), rng.normal(size=3)].astype(np.float32)
        w.write({"id": f"q{i}", "ts": float(i), "model": "tiny", "status": 200, "prompt_tokens": 9,
                 "max_tokens": 1000, "output_tokens": n, "finish_reason": "stop"})  # fmt: skip
        seq = _seq(f"q{i}")
        seq.features_prompt, seq.features_n, seq.feature_pools = vec, 8, 1
        w.write_features(seq, spec)
    w.close()
    reqs = load_log_requests(tmp_path / "r.sqlite").requests
    key = "hidden:tiny-llama:L1:mean:s1"
    assert all(r.metadata[key][0] == np.float32(np.log(r.output_tokens)) for r in reqs)
    _assert_trains_from_log(tmp_path / "r.sqlite", "probe", {"model": "tiny-llama", "layer": 1}, reqs)


def _vllm_config(worker_cls: str, prefix_caching: bool, eager: bool = True):
    return SimpleNamespace(parallel_config=SimpleNamespace(worker_cls=worker_cls),
                           model_config=SimpleNamespace(enforce_eager=eager),
                           cache_config=SimpleNamespace(enable_prefix_caching=prefix_caching))  # fmt: skip


def test_features_refuse_another_worker_compiled_mode_and_prefix_caching():
    """(vLLM's VllmConfig stood in by a namespace: the real one needs the engine venv; the real
    engine start with the flags is test_probe_hook's.) Without --enforce-eager a hand-started
    CPU engine died at its first forward (Dynamo cannot trace the hook's perf_counter)."""
    check_engine_config(_vllm_config(WORKER_CLS, False))
    with pytest.raises(PluginConfigError, match=r"^features: needs --worker-cls .*got 'auto'"):
        check_engine_config(_vllm_config("auto", False))
    with pytest.raises(PluginConfigError, match=r"^features: needs --enforce-eager"):
        check_engine_config(_vllm_config(WORKER_CLS, False, eager=False))
    with pytest.raises(PluginConfigError, match=r"^features: needs prefix caching off"):
        check_engine_config(_vllm_config(WORKER_CLS, True))


def test_draft_layer_needs_a_draft_model():
    def cfg(spec):
        c = _vllm_config(WORKER_CLS, False)
        c.speculative_config = spec
        return c

    check_engine_config(cfg(SimpleNamespace(method="draft_model")), draft_layer=1)
    check_engine_config(cfg(None))  # no draft layer: speculative decoding is not needed
    for spec, got in ((None, "'none'"), (SimpleNamespace(method="ngram"), "'ngram'")):
        with pytest.raises(PluginConfigError, match=rf"^features.draft_layer: needs speculative .*got {got}"):
            check_engine_config(cfg(spec), draft_layer=1)


def test_draft_states_are_delivered_recorded_and_train_a_draft_probe(tmp_path):
    """A request with both pooled states (served and draft model): each reaches its own seq
    field, records table and FeatureSpec key, and `presched train -p draft-probe --from-log`
    learns from the draft's (lengths read off its first coordinate; the served model's vector
    is noise, so a probe trained on the wrong one could not fit)."""
    from presched.serve.log_read import load_log_requests

    seqs = {"a": _seq("a")}
    deliver(StepFeatures(layer=1, sink=1, hidden=2, draft_model="tiny-llama", draft_layer=1, draft_hidden=2,
                         draft_ids=["a", "gone"], draft=np.array([[1, 2], [3, 4]], np.float32),
                         draft_n=[5, 1], draft_missing=[0, 0]), seqs)  # fmt: skip
    a = seqs["a"]
    assert a.features_draft.tolist() == [1, 2] and (a.draft_n, a.draft_pools) == (5, 1)
    assert a.features_prompt is None
    rng = np.random.default_rng(1)
    served = '{"model": "tiny-llama", "layer": 1, "hidden": 4, "pooling": "mean", "sink": 1}'
    draft = '{"model": "tiny-draft", "layer": 0, "hidden": 4, "pooling": "mean", "sink": 1, "role": "draft"}'
    w = RecordWriter(tmp_path / "r.sqlite")
    for i in range(60):
        n = int(rng.integers(5, 400))
        w.write({"id": f"q{i}", "ts": float(i), "model": "tiny", "status": 200, "prompt_tokens": 9,
                 "max_tokens": 1000, "output_tokens": n, "finish_reason": "stop"})  # fmt: skip
        seq = _seq(f"q{i}")
        seq.features_prompt, seq.features_n, seq.feature_pools = rng.normal(size=4).astype(np.float32), 8, 1
        seq.features_draft = np.r_[np.log(n), rng.normal(size=3)].astype(np.float32)
        seq.draft_n, seq.draft_pools = 8, 1
        w.write_features(seq, served)
        w.write_draft_features(seq, draft)
    w.close()
    reqs = load_log_requests(tmp_path / "r.sqlite").requests
    dkey, skey = "hidden:draft:tiny-draft:L0:mean:s1", "hidden:tiny-llama:L1:mean:s1"
    assert all(set(r.metadata) >= {dkey, skey} for r in reqs)
    assert all(r.metadata[dkey][0] == np.float32(np.log(r.output_tokens)) for r in reqs)
    _assert_trains_from_log(tmp_path / "r.sqlite", "draft-probe", {"model": "tiny-draft", "layer": 0}, reqs)
