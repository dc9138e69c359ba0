"""Per-step states into the records (`features.record_steps`, table `step_features`) and back,
without an engine: the scheduler's `FeatureConsumer` fed `StepFeatures` as the worker ships them
(the state of the position reading token g arrives in the step that samples token g + 1, before
that token is counted), `RecordWriter`, `load_log_requests`, and `presched train -p probe-refine
--from-log` on such records. (The same on the real engine, against the transformers reference
states: tests/engine/test_probe_hook.py.)"""

from __future__ import annotations

import json
import sqlite3
from types import SimpleNamespace

import numpy as np
import pytest

from presched.engine.plugin.config import parse_plugin_config
from presched.engine.plugin.consume import FeatureConsumer
from presched.engine.plugin.features import StepFeatures, unpack
from presched.engine.plugin.records import STEP_FEATURE_TABLE, RecordWriter, record_row
from presched.engine.plugin.seq import EngineSeq

MODEL = "tiny-llama"
STEP_KEY, PROMPT_KEY = f"hidden:{MODEL}:L1:step:s1", f"hidden:{MODEL}:L1:mean:s1"


def _seq(rid: str, prompt: int = 9) -> EngineSeq:
    vreq = SimpleNamespace(request_id=rid, prompt_token_ids=[1] * prompt, max_tokens=1000,
                           arrival_time=1.0, num_output_tokens=0, num_preemptions=0,
                           sampling_params=None)  # fmt: skip
    return EngineSeq(vreq)


def _consumer(tmp_path, record_steps, records=True) -> FeatureConsumer:
    """`record_steps` None: the default (without records the only way: set, it is refused)."""
    feats = {} if record_steps is None else {"record_steps": list(record_steps)}
    cfg = parse_plugin_config({"features": feats, "records": str(tmp_path / "r.sqlite") if records else None})
    vcfg = SimpleNamespace(model_config=SimpleNamespace(model=f"/models/{MODEL}"))
    return FeatureConsumer(cfg, vcfg, {}, lambda: None)


def _state(rid: str, g: int, hidden: int = 4) -> np.ndarray:
    """A state naming its request and token: [request number, g, ...]."""
    return np.array([int(rid[1:]), g] + [0.5] * (hidden - 2), np.float32)


def _decode(fc: FeatureConsumer, seqs: dict, lengths: dict, again: dict | None = None) -> None:
    """Run every seq to its length as the engine does: the prompt state with the first step,
    then each step ships the state at token g = generated, then the token is counted. A seq in
    `again` gets a second state at that g (other numbers: vLLM's recompute after preemption
    resumes at the next token, so this is the defensive case; keeping the second would show)."""
    fc.step(StepFeatures(layer=1, sink=1, hidden=4, prompt_ids=list(seqs),
                         prompt=np.stack([np.full(4, int(r[1:]), np.float32) for r in seqs]),
                         prompt_n=[8] * len(seqs), prompt_missing=[0] * len(seqs)), seqs)  # fmt: skip
    buf = np.zeros((len(seqs), 4), np.float32)  # one buffer, overwritten every step (as the worker's
    for _ in range(max(lengths.values())):  # arrays are reused): a kept state must be a copy
        live = [r for r in seqs if seqs[r].generated < lengths[r]]
        if live:
            buf[: len(live)] = [_state(r, seqs[r].generated) for r in live]
            fc.step(StepFeatures(layer=1, sink=1, hidden=4, step_ids=live, step=buf[: len(live)]), seqs)
        for r in [r for r in live if (again or {}).get(r) == seqs[r].generated]:
            fc.step(StepFeatures(layer=1, sink=1, hidden=4, step_ids=[r],
                                 step=_state(r, seqs[r].generated)[None] + 100), seqs)  # fmt: skip
        for r in live:
            seqs[r].generated += 1


def test_step_states_at_record_steps_are_kept_once_recorded_and_read_back(tmp_path):
    from presched.serve.log_read import load_log_requests

    fc = _consumer(tmp_path, (2, 5))
    seqs = {"q0": _seq("q0"), "q1": _seq("q1"), "q2": _seq("q2")}
    lengths = {"q0": 7, "q1": 5, "q2": 2}  # q1 stops before token 5's state, q2 before 2's
    _decode(fc, seqs, lengths, again={"q0": 5})
    # the state shipped at token g, the first that arrived (the second's +100 is not kept)
    assert {g: v.tolist() for g, v in seqs["q0"].features_record.items()} == {
        2: [0, 2, 0.5, 0.5], 5: [0, 5, 0.5, 0.5]}
    assert list(seqs["q1"].features_record) == [2] and seqs["q2"].features_record is None
    w = RecordWriter(tmp_path / "r.sqlite")
    for r, seq in seqs.items():
        w.write(record_row(seq, "FINISHED_STOPPED", "tiny"))
        fc.write(w, seq)
    w.close()
    with sqlite3.connect(tmp_path / "r.sqlite") as c:
        rows = c.execute(f"SELECT id, g, spec, vec FROM {STEP_FEATURE_TABLE} ORDER BY id, g").fetchall()
        pk = [r[1] for r in c.execute(f"PRAGMA table_info({STEP_FEATURE_TABLE})") if r[5]]
    assert [(i, g) for i, g, _, _ in rows] == [("q0", 2), ("q0", 5), ("q1", 2)] and pk == ["id", "g"]
    assert json.loads(rows[0][2]) == {"model": MODEL, "layer": 1, "hidden": 4, "pooling": "step",
                                      "sink": 1, "role": "served"}  # fmt: skip
    assert unpack(rows[1][3]).tolist() == [0, 5, 0.5, 0.5]
    reqs = {r.id: r for r in load_log_requests(tmp_path / "r.sqlite").requests}
    assert set(reqs["q0"].metadata[STEP_KEY]) == {2, 5}
    assert reqs["q0"].metadata[STEP_KEY][5].tolist() == [0, 5, 0.5, 0.5]
    assert reqs["q1"].metadata[STEP_KEY][2].tolist() == [1, 2, 0.5, 0.5]
    assert STEP_KEY not in reqs["q2"].metadata and reqs["q2"].metadata[PROMPT_KEY].tolist() == [2] * 4


def test_nothing_is_kept_without_records_or_record_steps(tmp_path):
    for fc in (_consumer(tmp_path, None, records=False), _consumer(tmp_path, ())):
        seqs = {"q0": _seq("q0")}
        _decode(fc, seqs, {"q0": 4})
        assert seqs["q0"].features_record is None and seqs["q0"].feature_steps == 4


def _records_with_a_planted_law(path, n: int, seed: int, at=(4, 16, 64), answer: bool = False) -> None:
    """Records of `n` requests whose remaining length after token g is read off column 0 of the
    state at g (each row only for g < L, as the engine records); with `answer`, off column 1 of
    the answer pool at g instead (`answer_features`), the step states then noise."""
    rng = np.random.default_rng(seed)
    spec = {"model": MODEL, "layer": 1, "hidden": 6, "sink": 1}
    step, pool = (json.dumps({**spec, "pooling": p}) for p in ("step", "answer"))
    w = RecordWriter(path)
    for i in range(n):
        L = int(rng.integers(2, 300))
        w.write({"id": f"q{i}", "ts": float(i), "model": "tiny", "status": 200, "prompt_tokens": 9,
                 "max_tokens": 1000, "output_tokens": L, "finish_reason": "stop"})  # fmt: skip
        seq = _seq(f"q{i}")
        seq.features_prompt, seq.features_n, seq.feature_pools = rng.normal(size=6).astype(np.float32), 8, 1
        seq.features_record, seq.features_record_answer = {}, {}
        for g in at:
            if g < L:
                s = rng.normal(size=6)
                if answer:
                    seq.features_record[g] = s.astype(np.float32)
                    s = rng.normal(size=6)
                    s[1] = np.log(L - g) - 3 + 0.05 * rng.normal()
                    seq.features_record_answer[g] = s.astype(np.float32)
                else:
                    s[0] = np.log(L - g) - 3 + 0.05 * rng.normal()
                    seq.features_record[g] = s.astype(np.float32)
        w.write_features(seq, json.dumps({**spec, "pooling": "mean"}))
        if seq.features_record:
            w.write_step_features(seq, step, pool if answer else None)
    w.close()


def test_probe_refine_trains_from_the_engine_records(tmp_path):
    from presched.predict import load_predictor
    from presched.serve.log_read import load_log_requests
    from presched.serve.train_log import train_from_log

    log = tmp_path / "r.sqlite"
    _records_with_a_planted_law(log, 200, 0)
    path, report = train_from_log(log, "probe-refine", tmp_path / "refine.npz", params={"model": MODEL, "layer": 1})
    assert report["fit_requests"] + report["validation_requests"] == report["used"] == 200
    pred = load_predictor(path)
    _records_with_a_planted_law(tmp_path / "t.sqlite", 200, 1)
    rows = [(r.metadata[STEP_KEY][g], r.metadata[PROMPT_KEY], g, r.output_tokens)
            for r in load_log_requests(tmp_path / "t.sqlite").requests for g in r.metadata.get(STEP_KEY, {})]  # fmt: skip
    S, P, g, L = (np.array(x, dtype=float) for x in zip(*rows))
    est = pred.predict_steps(S, P, g)
    assert np.corrcoef(np.log(est.mean_remaining(g)), np.log(L - g))[0, 1] > 0.95
    with pytest.raises(ValueError, match=r"^layer: request 'q\d+' has step states of 1, the params say 2"):
        train_from_log(log, "probe-refine", tmp_path / "x.npz", params={"model": MODEL, "layer": 2})


ANSWER_KEY = f"hidden:{MODEL}:L1:answer:s1"


def test_answer_pools_average_the_states_of_tokens_one_to_g_once_each(tmp_path):
    """A_g = mean of the states at generated tokens 1..g: with states [n, k, .5, .5] that is
    [n, (g + 1) / 2, .5, .5]. Fails if token 0's state (the prompt's last position) is pooled,
    if a repeated state is added again, or if A is not written or read back."""
    from presched.serve.log_read import load_log_requests

    fc = _consumer(tmp_path, (2, 5))
    seqs = {"q0": _seq("q0"), "q1": _seq("q1")}
    _decode(fc, seqs, {"q0": 7, "q1": 5}, again={"q0": 3})  # a second state at g = 3 (+100)
    assert {g: v.tolist() for g, v in seqs["q0"].features_record_answer.items()} == {
        2: [0, 1.5, 0.5, 0.5], 5: [0, 3.0, 0.5, 0.5]}
    assert seqs["q0"].features_answer[1] == 6 and seqs["q0"].features_answer_g == 6
    assert list(seqs["q1"].features_record_answer) == [2]
    w = RecordWriter(tmp_path / "r.sqlite")
    for seq in seqs.values():
        w.write(record_row(seq, "FINISHED_STOPPED", "tiny"))
        fc.write(w, seq)
    w.close()
    reqs = {r.id: r for r in load_log_requests(tmp_path / "r.sqlite").requests}
    assert reqs["q0"].metadata[ANSWER_KEY][5].tolist() == [0, 3.0, 0.5, 0.5]
    assert reqs["q0"].metadata[STEP_KEY][5].tolist() == [0, 5, 0.5, 0.5]
    assert set(reqs["q1"].metadata[ANSWER_KEY]) == {2}


def test_no_answer_sums_without_records_or_an_answer_refine(tmp_path):
    fc = _consumer(tmp_path, None, records=False)
    seqs = {"q0": _seq("q0")}
    _decode(fc, seqs, {"q0": 4})
    assert seqs["q0"].features_answer is None


def test_probe_refine_with_answer_reads_the_answer_pools_from_the_records(tmp_path):
    """A planted law in the answer pool's column 1 (the step state is noise): the answer model
    learns it, the plain one cannot; records without answer pools are refused by name."""
    from presched.predict import load_predictor
    from presched.serve.log_read import load_log_requests
    from presched.serve.train_log import train_from_log

    log, test = tmp_path / "r.sqlite", tmp_path / "t.sqlite"
    _records_with_a_planted_law(log, 300, 0, answer=True)
    _records_with_a_planted_law(test, 200, 1, answer=True)
    rows = [(r.metadata[STEP_KEY][g], r.metadata[PROMPT_KEY], g, r.output_tokens, r.metadata[ANSWER_KEY][g])
            for r in load_log_requests(test).requests for g in r.metadata.get(STEP_KEY, {})]  # fmt: skip
    S, P, g, L, A = (np.array(x, dtype=float) for x in zip(*rows))
    corr = {}
    for answer in (True, False):
        path, _ = train_from_log(log, "probe-refine", tmp_path / f"a{answer}.npz",
                                 params={"model": MODEL, "layer": 1, "answer": answer})  # fmt: skip
        pred = load_predictor(path)
        est = pred.predict_steps(S, P, g, A if answer else None)
        corr[answer] = np.corrcoef(np.log(est.mean_remaining(g)), np.log(L - g))[0, 1]
    assert corr[True] > 0.95 and corr[False] < 0.5, corr
    with pytest.raises(ValueError, match="answer true"):
        pred = load_predictor(tmp_path / "aTrue.npz")
        pred.predict_steps(S, P, g)
    _records_with_a_planted_law(tmp_path / "old.sqlite", 100, 2)  # no answer_features table
    with pytest.raises(ValueError, match="an answer pool"):
        train_from_log(tmp_path / "old.sqlite", "probe-refine", tmp_path / "y.npz",
                       params={"model": MODEL, "layer": 1, "answer": True})  # fmt: skip
