"""The learner fed from the engine plugin's per-request records (`presched learn --from-log`).

The records are written by the plugin's own writer (`RecordWriter`, `record_row`, `EngineSeq`);
only vLLM's request object is a stand-in (`vreq`, a SimpleNamespace with the attributes
`EngineSeq` reads: vLLM is not importable in this venv; tests/engine runs the real engine)."""

from __future__ import annotations

import json
import subprocess
import sys
from types import SimpleNamespace

import numpy as np

from presched.engine.plugin.records import RecordWriter, record_row
from presched.engine.plugin.seq import EngineSeq
from presched.predict.base import PREDICTORS
from presched.predict.online import OnlineConfig, OnlineLearner
from presched.predict.online.state import HEADER
from presched.serve import cli
from presched.serve.learn_log import POSITION, feed, read_position, row_status
from presched.workload.request import Request

LEARN = {"min_group": 20, "refit_every": 40, "min_refit": 30, "holdout": 10}


def write_records(path, start, n, ratio, rng, aborted_every=0, capped_every=0, prompts=False, arrivals=None):
    """`n` engine records of requests whose answers are `ratio` x twice their prompt
    (`prompts`: with the prompt text, as the plugin's store_prompts writes it); request i arrives
    at `arrivals[i - start]` (default 1000 + i) and is freed 1 s later."""
    w = RecordWriter(path)
    for i in range(start, start + n):
        arrival = 1000.0 + i if arrivals is None else float(arrivals[i - start])
        p = int(rng.integers(5, 200))
        out = max(1, round(2 * ratio * p * rng.lognormal(0, 0.2)))
        status, max_tokens = "FINISHED_STOPPED", 10_000
        if capped_every and i % capped_every == 0:
            status, max_tokens, out = "FINISHED_LENGTH_CAPPED", 3, 3
        if aborted_every and i % aborted_every == 1:
            status = "FINISHED_ABORTED"
        vreq = SimpleNamespace(request_id=f"e{i}", prompt_token_ids=list(range(p)), max_tokens=max_tokens,
                               arrival_time=arrival, num_output_tokens=out, num_preemptions=0,
                               sampling_params=None)  # fmt: skip
        seq = EngineSeq(vreq)
        seq.finish = arrival + 1.0
        w.write(record_row(seq, status, "m", prompt=" ".join(["w"] * p) if prompts else None))
    w.close()


def trained():
    rng = np.random.default_rng(7)  # the records' own noise: calibrated on them
    train = [Request(id=f"t{i}", prompt_tokens=p, output_tokens=max(1, round(2 * p * rng.lognormal(0, 0.2))), model="m")
             for i, p in enumerate(rng.integers(5, 200, 400).tolist())]  # fmt: skip
    return PREDICTORS.create("linear-prompt").fit(train)


def test_engine_records_teach_the_learner_and_raise_its_alarm(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "records.sqlite"
    write_records(path, 0, 60, 1.0, rng, aborted_every=10, capped_every=15, prompts=True)  # as trained
    learner = OnlineLearner(trained(), OnlineConfig(enabled=True, tenant_rate=1e9, **LEARN), background=False)
    last, counts = feed(learner, path)
    assert last == 60 and counts == {"ok": 50, "length": 4, "cancelled": 6, "failed": 0, "skipped": 0, "no_text": 0}
    assert learner.counts["learned"] == 50 and learner.counts["censored"] == 4 and learner.counts["ignored"] == 6
    assert learner.counts["refits"] >= 1 and len(learner.buffer) == 50 and not learner.alarm.active
    assert learner.counts["stale"] == 0  # rows after a refit are predicted by the new model
    seen = learner.alarm.count
    # the engine's answers turn 5x longer: appended rows raise the alarm, and only they are read
    write_records(path, 60, 30, 5.0, rng)
    last, counts = feed(learner, path, after=last)
    assert last == 90 and counts["ok"] == 30 and learner.counts["learned"] == 80
    assert len(learner.buffer) == 50  # rows without prompt text recalibrate, never refit
    assert learner.alarm.alarms and learner.alarm.alarms[0] > seen  # raised by the new rows
    w = RecordWriter(path)  # a row without a prompt length, and one failed
    w.write({"id": "np", "ts": 2000.0, "status": 200, "output_tokens": 5, "finish_reason": "stop"})
    w.write({"id": "f", "ts": 2001.0, "status": 500, "prompt_tokens": 4})
    w.close()
    assert feed(learner, path, after=last, batch=1) == (92, {"ok": 0, "length": 0, "cancelled": 0, "failed": 1,
                                                             "skipped": 1, "no_text": 0})  # fmt: skip


def test_rows_in_completion_order_are_capped_on_their_arrival_clock(tmp_path):
    # 400 requests arriving over 20 s, freed in another order (the records' order): their `ts`
    # (arrival) steps back and forth, and the tenant's cap still holds over the 20 s
    rng = np.random.default_rng(0)
    arrival = np.sort(rng.uniform(0, 20, 400)) + 1.7e9
    freed = np.argsort(arrival + rng.uniform(0.1, 5.0, 400))
    path = tmp_path / "records.sqlite"
    write_records(path, 0, 400, 1.0, rng, arrivals=arrival[freed])
    learner = OnlineLearner(trained(), OnlineConfig(enabled=True, refit_every=0, tenant_rate=2.0, tenant_burst=10),
                            background=False)  # fmt: skip
    assert feed(learner, path)[1]["ok"] == 400
    cap = 10 + 2.0 * (arrival.max() - arrival.min())
    assert learner.counts["learned"] <= cap + 1 and learner.counts["capped"] >= 400 - cap - 1


def test_a_batch_never_outgrows_the_predictions_the_learner_remembers(tmp_path):
    path = tmp_path / "records.sqlite"
    write_records(path, 0, 512, 1.0, np.random.default_rng(2))
    learner = OnlineLearner(trained(), OnlineConfig(enabled=True, refit_every=0, tenant_rate=1e9, max_pending=100,
                                                    window=1000), background=False)  # fmt: skip
    assert feed(learner, path, batch=256) == (512, {"ok": 512, "length": 0, "cancelled": 0, "failed": 0,
                                                    "skipped": 0, "no_text": 0})  # fmt: skip
    assert learner.counts["learned"] == 512 and learner.counts["unpredicted"] == 0
    assert learner.conformal.pool.n == 512  # every row scored by the recalibration


def test_row_status_maps_what_a_row_teaches():
    assert row_status(200, 12, "stop", 100) == "ok"
    assert row_status(200, 100, "length", 100) == "length"
    assert row_status(200, 100, None, 100) == "length"  # unknown reason at the cap: censored
    assert row_status(499, 7, "abort", 100) == "cancelled"
    assert row_status(500, None, None, None) == "failed"
    assert row_status(200, None, "stop", 100) == "failed"  # no usage: nothing to learn


def test_presched_learn_resumes_and_reads_only_new_rows(tmp_path):
    rng = np.random.default_rng(1)
    path, state, model = tmp_path / "records.sqlite", tmp_path / "state", tmp_path / "model.npz"
    trained().save(model)
    write_records(path, 0, 40, 1.0, rng)

    def learn(*args):
        return subprocess.run([sys.executable, "-m", "presched.cli", "learn", "--from-log", str(path),
                               "--state", str(state), "--set", "refit_every=0", *args],
                              capture_output=True, text=True, timeout=300)  # fmt: skip

    r = learn()
    assert r.returncode == 2 and "--predictor" in r.stderr and "Traceback" not in r.stderr
    r = learn("--predictor", str(model))
    assert r.returncode == 0, r.stderr
    assert "40 new rows (ok 40)" in r.stdout
    write_records(path, 40, 10, 1.0, rng)
    r = learn()  # resumed from --state: no --predictor needed, only the 10 new rows read
    assert r.returncode == 0, r.stderr
    assert "10 new rows (ok 10)" in r.stdout
    back = OnlineLearner.resume(str(state), OnlineConfig(enabled=True), background=False)
    assert back.counts["learned"] == 50 and read_position(state, path) == 50
    assert back.position == {"log": str(path.resolve()), "rowid": 50}  # in the state's header
    assert not (state / "log-position.json").exists()
    r = learn("--set", "alarm_h=-1")
    assert r.returncode == 2 and "learn.alarm_h" in r.stderr and "Traceback" not in r.stderr


def test_presched_learn_stopped_mid_pass_learns_each_row_once(tmp_path, monkeypatch):
    # the learner saves within a pass (after its refit at 250 rows, every save_every=500 rows);
    # Ctrl-C at row 550 leaves that save, and the next run resumes after the last row it holds
    path, state, model = tmp_path / "records.sqlite", tmp_path / "state", tmp_path / "model.npz"
    trained().save(model)
    write_records(path, 0, 600, 1.0, np.random.default_rng(3), prompts=True)
    args = {"from_log": path, "state": state, "predictor": model, "set_": ["tenant_rate=1e9"], "follow": None}
    observe, calls = OnlineLearner.observe, []

    def ctrl_c_at_row_550(self, *a, **k):
        calls.append(1)
        if len(calls) == 550:
            raise KeyboardInterrupt
        return observe(self, *a, **k)

    monkeypatch.setattr(OnlineLearner, "observe", ctrl_c_at_row_550)
    cli.learn(**args)  # returns quietly on Ctrl-C
    monkeypatch.setattr(OnlineLearner, "observe", observe)
    mid = OnlineLearner.resume(str(state), OnlineConfig(enabled=True), background=False)
    assert mid.counts["learned"] == 500 and read_position(state, path) == 500  # every row teaches: rowid = rows
    cli.learn(**args)
    back = OnlineLearner.resume(str(state), OnlineConfig(enabled=True), background=False)
    assert back.counts["learned"] == 600 and read_position(state, path) == 600


def test_a_state_saved_with_a_position_file_beside_it_is_resumed_from_that_file(tmp_path):
    # an older presched kept the position in log-position.json, its header had none
    path, state = tmp_path / "records.sqlite", tmp_path / "state"
    write_records(path, 0, 30, 1.0, np.random.default_rng(4))
    learner = OnlineLearner(trained(), OnlineConfig(enabled=True, tenant_rate=1e9), background=False)
    feed(learner, path, batch=20)
    learner.save(str(state))
    with np.load(state / HEADER) as z:
        saved = {k: z[k] for k in z.files}
    header = json.loads(str(saved["__header__"]))
    assert header.pop("position") == {"log": str(path.resolve()), "rowid": 30}
    np.savez(state / HEADER, **{**saved, "__header__": np.array(json.dumps(header))})
    assert read_position(state, path) == 0
    (state / POSITION).write_text(json.dumps({"log": str(path.resolve()), "rowid": 20}))
    assert read_position(state, path) == 20 and read_position(state, tmp_path / "other.sqlite") == 0


def test_rows_without_ts_count_at_the_rows_clock_not_the_monotonic_one(tmp_path):
    """A row with a NULL ts took the learner's monotonic clock (seconds since boot) into a bucket
    that otherwise runs on epoch arrivals: the first epoch row after it refilled the bucket."""
    path = tmp_path / "records.sqlite"
    w = RecordWriter(path)
    for i in range(60):  # one tenant, arrivals within 1 s, the first 15 rows and every third without ts
        w.write({"id": f"r{i}", "ts": None if i < 15 or i % 3 == 0 else 1.7e9 + i / 60, "status": 200,
                 "prompt_tokens": 10, "output_tokens": 20, "finish_reason": "stop", "model": "m"})  # fmt: skip
    w.close()
    learner = OnlineLearner(trained(), OnlineConfig(enabled=True, refit_every=0, tenant_rate=1.0, tenant_burst=10),
                            background=False)  # fmt: skip
    assert feed(learner, path)[1]["ok"] == 60
    assert learner.counts["learned"] <= 10 + 1  # the burst and one second's rate, not a second burst


def text_trained():
    rng = np.random.default_rng(8)
    train = [Request(id=f"t{i}", prompt_tokens=p, prompt=" ".join(["w"] * p), output_tokens=2 * p, model="m")
             for i, p in enumerate(rng.integers(5, 200, 300).tolist())]  # fmt: skip
    return PREDICTORS.create("lexical-gbm").fit(train)


def test_a_text_predictor_skips_and_counts_rows_without_prompt_text(tmp_path):
    # the plugin's default (store_prompts off) writes no prompt text: a text predictor cannot
    # predict those rows, so it has no score for them: they are counted as no_text, not an error
    path, state, model = tmp_path / "records.sqlite", tmp_path / "state", tmp_path / "model.npz"
    rng = np.random.default_rng(5)
    write_records(path, 0, 20, 1.0, rng, aborted_every=10)  # no prompt text
    write_records(path, 20, 10, 1.0, rng, prompts=True)  # with it
    learner = OnlineLearner(text_trained(), OnlineConfig(enabled=True, tenant_rate=1e9), background=False)
    last, counts = feed(learner, path, batch=8)
    assert last == 30 and counts == {"ok": 10, "length": 0, "cancelled": 2, "failed": 0, "skipped": 0, "no_text": 18}
    assert learner.counts["learned"] == 10 and learner.counts["unpredicted"] == 0 and len(learner.buffer) == 10
    assert learner.position == {"log": str(path.resolve()), "rowid": 30}
    text_trained().save(model)
    r = subprocess.run([sys.executable, "-m", "presched.cli", "learn", "--from-log", str(path), "--state", str(state),
                        "--predictor", str(model), "--set", "refit_every=0"],
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "30 new rows (ok 10, cancelled 2, no_text 18)" in r.stdout
    assert "18 rows without prompt text taught nothing" in r.stdout and "store_prompts" in r.stdout
