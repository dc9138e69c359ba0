"""`presched serve --learn` over real HTTP against the stub (a test double: it answers each
request with `stub_output_tokens` tokens): one gateway for the module's flow, small streams.

What it checks: answers that ended by themselves teach the learner, answers cut by max_tokens
are censored, a client that left teaches nothing; the refit runs and its version reaches the
log and /metrics; shutdown saves the state and a new gateway resumes it. And that request logs
written before the learning columns existed still open, read and train."""

from __future__ import annotations

import sqlite3

import httpx
import pytest

from presched.predict.base import PREDICTORS
from presched.serve.app import build_app
from presched.serve.config import ServeConfig
from presched.serve.learn import make_learner
from presched.serve.log import RequestLog
from presched.serve.log_format import COLUMNS, NAMES
from presched.serve.log_read import load_log_requests, read_log
from presched.workload.request import Request
from serve.test_gateway_api import metric_values, settle

LEARN = {"enabled": True, "refit_every": 40, "min_refit": 30, "holdout": 10, "min_group": 5,
         "tenant_rate": 1000.0, "tenant_burst": 1000}  # fmt: skip


def test_the_gateway_learns_logs_versions_and_resumes(asgi_server, stub_server, tmp_path):
    train = [Request(id=f"t{p}", prompt=" ".join(["w"] * p), prompt_tokens=p, output_tokens=2 * p, model="m")
             for p in range(2, 200, 3)]  # fmt: skip
    pred = PREDICTORS.create("linear-prompt").fit(train)
    up, _ = stub_server(model="m")
    state = tmp_path / "state"
    cfg = ServeConfig(backends=[{"url": up, "model": "m", "max_in_flight": 4}], policy="sjf",
                      learn={**LEARN, "state_dir": str(state)}, log={"path": str(tmp_path / "log.sqlite")})  # fmt: skip
    learner = make_learner(cfg, pred)
    log = RequestLog(cfg.log.path)
    app = build_app(cfg, learner, log)
    url = asgi_server(app)
    gw = app.state.gateway.gw
    for k in range(60):  # the served answers are 5x the prompt, not 2x as trained
        words = 5 + k % 20
        body = {"model": "m", "prompt": " ".join(["w"] * words), "max_tokens": 1000, "stub_output_tokens": 5 * words}
        if k % 10 == 9:
            body["max_tokens"] = 3  # cut by max_tokens: censored
        assert httpx.post(url + "/v1/completions", json=body).status_code == 200
    settle(gw, 60, log)
    learner.wait(30)
    s = learner.status()
    assert s["learned"] == 54 and s["censored"] == 6 and s["refits"] >= 1 and s["predictor_version"] >= 2
    m = metric_values(httpx.get(url + "/metrics").text)
    assert m["presched_predictor_version"] == learner.version
    assert m['presched_learn_completions_total{kind="censored"}'] == 6
    assert "presched_drift_alarm" in m and "presched_drift_statistic" in m
    # the refitted model learned the new ratio: a 10-word prompt now predicts ~50, not ~20
    probe = Request(id="probe", prompt=" ".join(["w"] * 10), prompt_tokens=10, model="m")
    assert 35 < learner.predict([probe]).point[0] < 70
    df = read_log(cfg.log.path)
    assert set(df["predictor_version"].dropna()) >= {1, 2}
    assert set(df["drift_alarm"].dropna()) <= {0, 1}

    # a gateway given a new learner with the same state_dir resumes it (after a clean save)
    learner.close()
    back = make_learner(cfg, pred)
    assert back.version == learner.version and back.counts["learned"] == 54 and len(back.buffer) == 54


def test_learning_needs_a_predictor():
    cfg = ServeConfig(backends=[{"url": "http://127.0.0.1:1"}], learn={"enabled": True})
    with pytest.raises(ValueError, match="learn:"):
        make_learner(cfg, None)


def test_a_log_written_before_the_learning_columns_still_reads_and_trains(tmp_path):
    path = tmp_path / "old.sqlite"
    old = {n: t for n, t in COLUMNS.items() if n not in ("predictor_version", "drift_alarm")}
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE requests (" + ", ".join(f"{n} {t}" for n, t in old.items()) + ")")
    conn.execute("PRAGMA application_id = 1886612583")
    for i in range(5):
        conn.execute("INSERT INTO requests (id, ts, tenant, model, status, prompt_tokens, output_tokens, "
                     "finish_reason, prompt) VALUES (?, ?, 'default', 'm', 200, 4, ?, 'stop', 'hi there')",
                     (f"r{i}", float(i), 10 + i))  # fmt: skip
    conn.commit()
    conn.close()
    df = read_log(path)  # read-only: NULL in the new columns
    assert len(df) == 5 and df["predictor_version"].isna().all()
    assert len(load_log_requests(path).requests) == 5
    log = RequestLog(path)  # a writer adds the columns and writes them
    log.write({"id": "new", "ts": 9.0, "status": 200, "predictor_version": 3, "drift_alarm": 1})
    log.close()
    have = [r[1] for r in sqlite3.connect(path).execute("PRAGMA table_info(requests)")]
    assert set(NAMES) <= set(have)
    assert read_log(path).set_index("id").loc["new", "predictor_version"] == 3
