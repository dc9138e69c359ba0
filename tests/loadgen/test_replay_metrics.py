"""`presched replay`'s figures against the stub's known timing and the gateway's headers (real
HTTP on loopback; the stub is a test double of an engine, see test_replay.py)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from presched.loadgen.replay import ReplayConfig, run_replay
from presched.metrics.summary import GoodputSLO, summarize
from presched.workload.request import Request
from loadgen.replay_rig import Recorder, make_reqs


# --- metrics --------------------------------------------------------------------------------------
def test_metrics_match_the_stubs_known_timing(stub_server):
    token_s = 0.02
    lengths = [2, 4, 6, 16, 20, 5]
    # n tokens, one every token_s, the first at once
    true_e2e = [(n - 1) * token_s for n in lengths]
    reqs = make_reqs(lengths, gap_s=0.03)
    url, _ = stub_server(token_s=token_s)
    res = run_replay(reqs, ReplayConfig(url=url, model="stub"), slo=GoodputSLO(e2el_ms=200))
    s, rows = res.summary, res.rows
    assert s["completed"] == len(lengths) and s["failed"] == 0 and s["errors_by_status"] == {}
    e2e = np.array([r["e2el_s"] for r in rows])
    ttft = np.array([r["ttft_s"] for r in rows])
    # The stub never sends early, so its timing is a floor a busy machine only raises: E2E (from
    # the send, before the server got it, to the end, after its last token) is at least it.
    for r, want in zip(rows, true_e2e):
        assert r["e2el_s"] >= want - 0.002 and 0 < r["ttft_s"] <= r["e2el_s"]
        assert r["events"] == r["output_tokens"]  # one content event per token, as sent
        assert r["max_itl_s"] <= r["e2el_s"] - r["ttft_s"] + 1e-9  # every gap after the first token
    # every figure is the simulator's formula on these rows, whatever the machine made of them
    assert s["mean_ttft_ms"] == pytest.approx(ttft.mean() * 1e3)
    n = np.asarray(lengths)
    assert s["median_tpot_ms"] == pytest.approx(np.median((e2e - ttft) / (n - 1)) * 1e3)
    assert s["mean_itl_ms"] == pytest.approx(res.itl[0].mean() * 1e3)
    assert s["mean_itl_ms"] <= ((e2e - ttft).sum() / (n - 1).sum()) * 1e3 + 1e-6  # gaps fit inside
    assert s["p99_e2el_ms"] == pytest.approx(np.percentile(e2e, 99) * 1e3)
    short = np.argsort(n, kind="stable")[:3]  # the shorter half: 2, 4 and 5 tokens
    assert s["short_p99_e2el_ms"] == pytest.approx(np.percentile(e2e[short], 99) * 1e3)
    # goodput counts the requests whose E2E met 200 ms; 300 and 380 ms of tokens never can
    assert s["good_requests"] == int((e2e <= 0.2).sum()) <= 4
    assert s["total_output_tokens"] == sum(lengths)
    # every figure the simulator reports, under the same names
    assert set(summarize(res.records, None, GoodputSLO(e2el_ms=200))) <= set(s)
    # no queue-wait header from the stub: queue wait unknown, reported NaN, not 0
    assert math.isnan(s["mean_queue_wait_ms"]) and math.isnan(s["max_queue_wait_ms"])
    assert [r["instance"] for r in rows] == [-1] * len(lengths)


def test_non_streaming_and_chat(stub_server):
    url, _ = stub_server(token_s=0.01)
    res = run_replay(make_reqs([3, 9]), ReplayConfig(url=url, stream=False))
    assert [r["output_tokens"] for r in res.rows] == [3, 9]
    assert all(r["ttft_s"] == r["e2el_s"] for r in res.rows)  # first token seen = finish
    assert math.isnan(res.summary["mean_tpot_ms"]) and math.isnan(res.summary["p99_itl_ms"])

    res = run_replay(make_reqs([4, 6]), ReplayConfig(url=url, endpoint="chat"))
    assert [r["output_tokens"] for r in res.rows] == [4, 6]
    assert [r["events"] for r in res.rows] == [4, 6]
    # the gaps between the chat deltas: 8 of them, each after the first token. Their sum lies
    # inside each request's decode time (first token to end); wall-clock floors are not asserted:
    # a shared CI machine's timer slack put 80 ms of stub sleeps at 71.6 ms.
    assert res.itl[0].size == 8 and (res.itl[0] > 0).all()
    assert res.summary["mean_itl_ms"] == pytest.approx(res.itl[0].mean() * 1e3)
    decode_s = sum(r["e2el_s"] - r["ttft_s"] for r in res.rows)
    assert 0 < res.itl[0].sum() <= decode_s + 1e-6


def test_stream_without_usage_counts_events_and_flags_it(stub_server):
    url, _ = stub_server()
    res = run_replay(make_reqs([5, 3]), ReplayConfig(url=url, include_usage=False))
    assert [r["output_tokens"] for r in res.rows] == [5, 3]
    assert res.summary["usage_missing"] == 2


def test_gateway_headers_give_queue_wait_and_backend(asgi_server):
    from presched.serve.stub import StubEngine

    # as the presched gateway does; the odd requests carry no queue-wait header
    def headers(k):
        h = {"x-presched-backend": "gpu-a" if k % 2 else "gpu-b"}
        if k % 2:
            h["x-presched-queue-wait-ms"] = str(10.0 * k)
        return h

    url = asgi_server(Recorder(StubEngine().app(), headers))
    # one at a time: the k-th request the server receives is request k (20 ms apart, two could
    # reach a busy server in either order, and the headers follow the order received)
    res = run_replay(make_reqs([2, 2, 2, 2], gap_s=0.02), ReplayConfig(url=url, model="stub", max_concurrency=1))
    assert [r["instance"] for r in res.rows] == [0, 1, 0, 1]
    waits = [r["queue_wait_s"] for r in res.rows]
    assert waits[0] == pytest.approx(0.01) and waits[2] == pytest.approx(0.03)
    assert math.isnan(waits[1]) and math.isnan(waits[3])
    assert res.summary["mean_queue_wait_ms"] == pytest.approx(20)
    assert res.summary["max_queue_wait_ms"] == pytest.approx(30)  # over the requests that have it


def test_through_the_presched_gateway_reports_its_queue_waits(asgi_server, stub_server):
    from presched.serve.app import build_app
    from presched.serve.config import ServeConfig

    token_s, n = 0.01, 11  # each request holds the only slot for ~100 ms
    up, _ = stub_server(model="m", token_s=token_s)
    backends = [{"url": up, "model": "m", "max_in_flight": 1}]
    app = build_app(ServeConfig(backends=backends, policy="fcfs", log={"path": None}), None, None)
    url = asgi_server(app)
    reqs = [
        Request(id=f"r{i}", prompt_tokens=8, arrival=i * 0.01, output_tokens=n) for i in range(3)
    ]

    res = run_replay(reqs, ReplayConfig(url=url))
    assert res.summary["completed"] == 3 and res.model == "m"
    wait = [r["queue_wait_s"] for r in res.rows]
    busy = (n - 1) * token_s  # FCFS, one slot: r1 waits for r0, r2 for r0 and r1
    # floors (r1 arrives 10 ms after r0, r2 20 ms after), at half of what an idle host gives: a
    # client sending r1 or r2 late (send_lag) shortens the waits by that much, and so does a busy
    # gateway that reads r1 late (its wait starts when it reads it; CI once measured 81 ms
    # against a tight floor of 85). A wait not reported, or reported from the wrong clock, is
    # still far below half.
    lag = [r["send_lag_ms"] / 1e3 for r in res.rows]
    assert (busy - 0.01 - (lag[1] - lag[0])) / 2 <= wait[1]
    assert (2 * busy - 0.02 - (lag[2] - lag[0])) / 2 <= wait[2]
    assert wait[0] < wait[1] < wait[2]  # r0 waited for nobody
    assert res.summary["mean_queue_wait_ms"] == pytest.approx(np.mean(wait) * 1e3)
    assert [r["instance"] for r in res.rows] == [0, 0, 0]
