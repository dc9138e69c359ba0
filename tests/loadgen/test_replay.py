"""`presched replay` against real HTTP servers on loopback (uvicorn in a thread, see conftest).

The upstream is `StubEngine`, a test double of an engine with exactly known timing (each reply
has exactly max_tokens tokens, one every token_s seconds), so every figure can be computed by
hand. The real-engine tier (vLLM on the CPU) lives in tests/engine; the presched gateway here is
the real one.

No test depends on how fast the machine is. The stub never answers early, so its timing is a
floor that a busy machine only raises; the generator's timestamps are checked against the
server's (causality: sent before received, received before the first token came back) and the
figures against the rows they summarize, not against a ceiling.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from presched.loadgen.replay import ReplayConfig, request_body, run_replay, synthetic_prompt
from presched.workload.request import Request
from loadgen.replay_rig import Recorder, assert_one_clock, make_reqs


# --- timing ---------------------------------------------------------------------------------------
def test_requests_reach_the_server_at_their_arrival_times(asgi_server):
    from presched.serve.stub import StubEngine

    arrivals = [0.0, 0.03, 0.05, 0.12, 0.121, 0.2, 0.26, 0.3, 0.41, 0.45]
    reqs = [
        Request(id=f"r{i}", prompt_tokens=8, arrival=a, output_tokens=4)
        for i, a in enumerate(arrivals)
    ]
    rec = Recorder(StubEngine(token_s=0.5).app())  # each reply takes 1.5 s: longer than the run
    url = asgi_server(rec)
    before = time.perf_counter()
    res = run_replay(reqs, ReplayConfig(url=url, model="stub"))
    assert res.summary["failed"] == 0 and res.summary["completed"] == len(reqs)
    assert [r["scheduled_s"] for r in res.rows] == pytest.approx(arrivals)
    # never early, and the lateness it reports is the lateness the server saw
    assert_one_clock(rec.received, res.rows, before)
    lag = [r["send_lag_ms"] for r in res.rows]
    assert np.isclose(res.summary["max_send_lag_ms"], max(lag))
    # open loop: no request waited for a reply, so all 10 were at the server at once (a closed
    # loop would have 1); generous: only a stall of ~1 s would end the first reply in time
    assert rec.max_in_flight == len(reqs)


def test_keep_alive_connections_are_reused(asgi_server):
    from presched.serve.stub import StubEngine

    reqs = [
        Request(id=f"r{i}", prompt_tokens=8, arrival=i * 0.05, output_tokens=3) for i in range(8)
    ]

    for stream in (True, False):
        rec = Recorder(StubEngine().app())
        cfg = ReplayConfig(url=asgi_server(rec), model="stub", stream=stream, max_concurrency=1)
        res = run_replay(reqs, cfg)
        assert res.summary["completed"] == 8
        # one request in flight at a time (on any machine): one connection serves them all
        assert len(set(rec.ports)) == 1, rec.ports


def test_max_concurrency_caps_requests_in_flight_and_reports_the_wait(asgi_server):
    from presched.serve.stub import StubEngine

    token_s = 0.05
    rec = Recorder(StubEngine(token_s=token_s).app())
    reqs = make_reqs([10] * 6)  # all at t=0, each holding its slot >= 9 * 50 ms (the stub's floor)
    url = asgi_server(rec)
    before = time.perf_counter()
    res = run_replay(reqs, ReplayConfig(url=url, model="stub", max_concurrency=2))
    assert res.summary["completed"] == 6
    # never more than 2 at the server; 2 at once (generous: a 450 ms stall would leave 1)
    assert rec.max_in_flight == 2
    assert_one_clock(rec.received, res.rows, before)
    busy = 9 * token_s
    waits = sorted(r["client_wait_ms"] / 1e3 for r in res.rows)
    assert waits[2] >= busy - 0.002 and waits[4] >= 2 * busy - 0.002  # rounds 2 and 3 waited
    assert waits[1] < busy  # round 1 took its slots at once (generous: a 450 ms stall breaks it)
    assert res.summary["max_client_wait_ms"] == pytest.approx(waits[-1] * 1e3)
    # E2E counts from the send (the client wait is reported apart), and the summary is of that
    e2el = [r["e2el_s"] for r in res.rows]
    assert e2el == pytest.approx([r["finish_s"] - r["sent_s"] for r in res.rows])
    assert res.summary["p99_e2el_ms"] == pytest.approx(np.percentile(e2el, 99) * 1e3)


def test_time_scale_stretches_the_schedule(asgi_server):
    from presched.serve.stub import StubEngine

    reqs = [
        Request(id=f"r{i}", prompt_tokens=8, arrival=10 + i * 0.05, output_tokens=2)
        for i in range(4)
    ]

    rec = Recorder(StubEngine().app())
    url = asgi_server(rec)
    before = time.perf_counter()
    res = run_replay(reqs, ReplayConfig(url=url, model="stub", time_scale=2.0))
    # relative to the first (sent at once), gaps doubled; the server never sees one early
    assert [r["scheduled_s"] for r in res.rows] == pytest.approx([0, 0.1, 0.2, 0.3])
    assert_one_clock(rec.received, res.rows, before)


# --- lengths and bodies ---------------------------------------------------------------------------
def test_forced_lengths_generate_the_true_lengths(stub_server):
    url, engine = stub_server()
    lengths = [1, 2, 7, 30, 64]
    reqs = make_reqs(lengths) + [Request(id="capped", prompt_tokens=4, output_tokens=50, max_tokens=9),
                             Request(id="unknown", prompt_tokens=4, max_tokens=5)]  # fmt: skip
    res = run_replay(reqs, ReplayConfig(url=url, max_tokens_default=3))
    assert res.model == "stub"  # asked GET /v1/models
    out = {r["id"]: r["output_tokens"] for r in res.rows}
    assert out == {**{f"r{i}": n for i, n in enumerate(lengths)}, "capped": 9, "unknown": 5}
    assert not any(r["usage_missing"] for r in res.rows)
    assert res.summary["total_output_tokens"] == sum(lengths) + 9 + 5
    assert engine.received == len(reqs)


def test_request_body_fields():
    r = Request(id="a", prompt_tokens=5, output_tokens=40, max_tokens=30, prompt="hi")
    b = request_body(r, ReplayConfig(extra_body={"temperature": 0}), "m", "hi")
    assert b == {"model": "m", "max_tokens": 30, "stream": True, "prompt": "hi", "ignore_eos": True,
                 "stream_options": {"include_usage": True}, "temperature": 0}  # fmt: skip
    b = request_body(r, ReplayConfig(endpoint="chat", stream=False, force_lengths=False), "m", "hi")
    assert b == {"model": "m", "max_tokens": 30, "stream": False,
                 "messages": [{"role": "user", "content": "hi"}]}  # fmt: skip
    free = Request(id="b", prompt_tokens=5, output_tokens=40)
    assert (
        request_body(free, ReplayConfig(force_lengths=False, max_tokens_default=7), "m", "x")[
            "max_tokens"
        ]
        == 7
    )


def test_sample_seeds_give_each_request_its_own_stable_seed():
    from presched.loadgen.replay import request_seed

    a, b = (Request(id=i, prompt_tokens=5, output_tokens=40) for i in ("a", "b"))
    cfg = ReplayConfig(force_lengths=False, sample_seeds=True)
    seed_a = request_body(a, cfg, "m", "x")["seed"]
    assert seed_a == request_seed(0, "a") == 2059793309  # sha256, not Python's salted hash()
    assert request_body(b, cfg, "m", "x")["seed"] != seed_a  # per request, not one global seed
    assert request_body(a, cfg.model_copy(update={"seed": 1}), "m", "x")["seed"] != seed_a
    assert 0 <= seed_a < 2**31
    assert "seed" not in request_body(a, ReplayConfig(force_lengths=False), "m", "x")  # off by default
    pinned = cfg.model_copy(update={"extra_body": {"seed": 7}})
    assert request_body(a, pinned, "m", "x")["seed"] == 7  # extra_body wins


def test_synthetic_prompts_are_deterministic_distinct_and_fit_a_tokenizer():
    r = Request(id="x", prompt_tokens=50)
    p = synthetic_prompt(r, seed=1)
    assert p == synthetic_prompt(r, seed=1) and len(p.split()) == 50
    assert p != synthetic_prompt(Request(id="y", prompt_tokens=50), seed=1)
    assert p != synthetic_prompt(r, seed=2)

    def by_chars(text: str) -> int:  # a tokenizer of about 4 characters a token
        return max(1, round(len(text) / 4))

    for n in (1, 17, 300):
        got = by_chars(synthetic_prompt(Request(id="z", prompt_tokens=n), count_tokens=by_chars))
        assert abs(got - n) <= max(1, 0.02 * n)


def test_api_key_and_per_tenant_keys_are_sent(asgi_server):
    from presched.serve.stub import StubEngine

    rec = Recorder(StubEngine().app())
    reqs = [Request(id=f"r{i}", prompt_tokens=4, arrival=i * 0.02, output_tokens=2, tenant=t)
            for i, t in enumerate(["a", "b", "c"])]  # fmt: skip
    cfg = ReplayConfig(url=asgi_server(rec), model="stub", api_key="k0", tenant_keys={"b": "kb"})
    res = run_replay(reqs, cfg)
    assert rec.auth == ["Bearer k0", "Bearer kb", "Bearer k0"]
    assert res.summary["num_tenants"] == 3
