"""`presched serve --learn` over real HTTP against the stub (a test double: it answers each
request with `stub_output_tokens` tokens): one gateway for the module's flow, small streams.

What it checks: answers that ended by themselves teach the learner, answers cut by max_tokens
are censored, a client that left teaches nothing; the refit runs and its version reaches the
log and /metrics; shutdown saves the state and a new gateway resumes it. And that request logs
written before the learning columns existed still open, read and train."""

from __future__ import annotations

import sqlite3

import httpx
import numpy as np
import pytest

from presched.predict.base import PREDICTORS
from presched.predict.estimate import LEVELS
from presched.serve.app import build_app
from presched.serve.config import ServeConfig
from presched.serve.learn import make_learner
from presched.serve.log import RequestLog
from presched.serve.log_format import COLUMNS, NAMES
from presched.serve.log_read import load_log_requests, read_log
from presched.workload.request import Request
from serve.test_gateway_api import metric_values, settle
from serve.test_gateway_order import WORDS, burst_behind_blocker

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


def test_the_drift_alarm_turns_fallback_to_arrival_order_and_back(asgi_server, stub_server):
    # fallback(sjf) behind a learner whose alarm trips fast (alarm_h 4: three answers far longer
    # than predicted) and clears after a calm window of 10; the tracker never decides
    # (min_samples 1000) and nothing recalibrates or refits, so only the alarm moves the order.
    # The bursts are cut by max_tokens (censored: the alarm does not see them).
    rng = np.random.default_rng(0)
    train = [Request(id=f"t{i}", prompt_tokens=p, output_tokens=max(1, int(2 * p * rng.lognormal(0, 0.5))), model="stub")
             for i, p in enumerate(rng.integers(2, 300, 400).tolist())]  # fmt: skip
    pred = PREDICTORS.create("linear-prompt").fit(train)
    up, engine = stub_server(model="stub", token_s=0.002, max_concurrency=1)
    learn = {**LEARN, "alarm_h": 4.0, "alarm_window": 10, "min_group": 10_000, "refit_every": 0}
    cfg = ServeConfig(backends=[{"url": up, "model": "stub", "max_in_flight": 1}], policy="fallback",
                      policy_params={"inner": "sjf", "min_samples": 1000, "window": 1000},
                      learn=learn, log={"path": None})  # fmt: skip
    learner = make_learner(cfg, pred)
    app = build_app(cfg, learner)
    url = asgi_server(app)
    gw = app.state.gateway.gw
    order = [WORDS[k] for k in (90, 8, 150, 3, 45, 20)]
    sjf = sorted(order, key=len)
    done = 1  # the probe of the policy's start-up check is not counted; requests so far

    def burst():
        nonlocal done
        started, _ = burst_behind_blocker(url, engine, order, [2] * 6, lambda: gw.num_waiting)
        engine.started.clear()
        done += 7
        settle(gw, done - 1)
        return started

    def answers(n, ratio):  # sequential requests whose answers are `ratio` x the predicted median
        nonlocal done
        for k in range(n):
            prompt = " ".join(["w"] * (5 + 2 * k))
            probe = Request(id="probe", prompt_tokens=app.state.gateway.count(prompt), model="stub")
            median = float(pred.predict([probe]).quantiles[0, LEVELS.index(0.5)])
            body = {"model": "stub", "prompt": prompt, "max_tokens": 100_000,
                    "stub_output_tokens": max(1, round(ratio * median))}  # fmt: skip
            assert httpx.post(url + "/v1/completions", json=body, timeout=30).status_code == 200
            done += 1
            settle(gw, done - 1)
        engine.started.clear()

    def alarm_metric():
        return metric_values(httpx.get(url + "/metrics").text)["presched_drift_alarm"]

    assert burst() == sjf and alarm_metric() == 0
    answers(5, 10.0)  # far longer than predicted: the alarm is raised
    assert learner.alarm.active and alarm_metric() == 1
    assert burst() == order  # fallback runs fcfs: arrival order
    answers(12, 1.0)  # as predicted: a calm window clears it
    assert not learner.alarm.active and alarm_metric() == 0
    assert burst() == sjf
    pol = gw.backends[0].policy
    assert [m for _, _, m in pol.switches] == ["conservative", "predictive"] and pol.tracked == "predictive"


def test_a_usage_count_past_any_answer_is_not_a_count():
    from presched.serve.relay import MAX_USAGE_TOKENS, usage_tokens

    assert usage_tokens({"completion_tokens": 42}) == 42
    assert usage_tokens({"completion_tokens": MAX_USAGE_TOKENS}) == MAX_USAGE_TOKENS
    for bad in (10**400, MAX_USAGE_TOKENS + 1, -1, 1.5, True, "7", None):
        assert usage_tokens({"completion_tokens": bad}) is None, bad
