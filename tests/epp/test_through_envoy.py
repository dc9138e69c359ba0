"""The picker behind a real Envoy: routing, what the engine gets, streaming, accounting, refusals
(the shared stacks of conftest.py; tests run in file order and leave them idle), each test in
both of Envoy's body modes: BUFFERED request / STREAMED response (the default) and GIE's
FULL_DUPLEX_STREAMED."""

from __future__ import annotations

import json
import threading

import httpx
import pytest


LONG = "word " * 600  # predicted ~1200 tokens by the fitted linear-prompt
SHORT = "hi"


@pytest.fixture(scope="module", params=["buffered", "full-duplex"])
def stack(request):
    st = request.getfixturevalue("stack" if request.param == "buffered" else "full_duplex_stack")
    assert st.st.picker.cfg.envoy_body_mode == request.param
    return st


def post(url: str, body: dict, headers: dict | None = None, timeout: float = 30) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", json={"model": "tiny", **body}, headers=headers, timeout=timeout)


def test_destination_header_prediction_and_log_row(stack):
    n_rows = len(stack.rows())
    r = post(stack.url, {"prompt": SHORT, "max_tokens": 7})
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] == 7
    served = r.headers["x-presched-endpoint"]
    eng = stack.st.engines[[e.address for e in stack.st.picker.cfg.endpoints].index(served)]
    headers, body = eng.seen[-1]
    listed = headers["x-gateway-destination-endpoint"].split(",")
    assert listed[0] == served and len(listed) == 3  # override_host went to the primary
    pred = float(headers["x-presched-predicted-tokens"])
    assert body["vllm_xargs"]["presched_pred_mean"] == pytest.approx(pred, abs=0.05)
    assert body["vllm_xargs"]["presched_pred_q90"] >= body["vllm_xargs"]["presched_pred_mean"]
    assert "stream_options" not in body  # not a stream: nothing added
    stack.idle()
    rows = stack.rows()
    assert len(rows) == n_rows + 1
    row = rows[-1]
    assert (row["id"], row["status"], row["backend"], row["output_tokens"]) == (r.headers["x-request-id"], 200, served, 7)
    assert row["pred_mean"] == pytest.approx(pred, abs=0.05)


def test_a_chunked_upload_reaches_the_engine_whole(stack):
    raw = json.dumps({"model": "tiny", "prompt": SHORT, "max_tokens": 3}).encode()
    r = httpx.post(f"{stack.url}/v1/completions", content=iter([raw[:9], raw[9:]]),
                   headers={"content-type": "application/json"}, timeout=30)  # fmt: skip
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    served = r.headers["x-presched-endpoint"]
    headers, body = stack.st.engines[[e.address for e in stack.st.picker.cfg.endpoints].index(served)].seen[-1]
    assert body["prompt"] == SHORT and "presched_pred_mean" in body["vllm_xargs"]
    if stack.st.picker.cfg.envoy_body_mode == "buffered":  # the picker set the rewritten body's length
        assert int(headers["content-length"]) > len(raw) and "transfer-encoding" not in headers
    else:  # Envoy streams the rewritten body on
        assert headers["transfer-encoding"] == "chunked" and "content-length" not in headers
    stack.idle()


def test_stream_passes_through_and_usage_is_counted(stack):
    before = {b.name: b.served for b in stack.st.picker.gw.backends}
    r = post(stack.url, {"prompt": SHORT, "max_tokens": 5, "stream": True})
    assert r.status_code == 200
    events = [e for e in r.text.split("\n\n") if e]
    # the client did not ask for usage: it gets the engine's 5 token events and [DONE], not the
    # usage event the picker asked for to count tokens
    assert len(events) == 6 and events[-1] == "data: [DONE]"
    assert all(json.loads(e[6:])["choices"] for e in events[:-1])
    served = r.headers["x-presched-endpoint"]
    eng = stack.st.engines[[e.address for e in stack.st.picker.cfg.endpoints].index(served)]
    assert eng.seen[-1][1]["stream_options"] == {"include_usage": True}
    r2 = post(stack.url, {"prompt": SHORT, "max_tokens": 4, "stream": True, "stream_options": {"include_usage": True}})
    usage = [json.loads(e[6:]) for e in r2.text.split("\n\n") if e.startswith("data: {") and '"usage"' in e]
    assert usage and usage[0]["usage"]["completion_tokens"] == 4  # asked for: passed on
    stack.idle()
    rows = stack.rows()[-2:]
    assert [(x["status"], x["output_tokens"], x["stream"]) for x in rows] == [(200, 5, 1), (200, 4, 1)]
    after = {b.name: b.served for b in stack.st.picker.gw.backends}
    assert sum(after.values()) - sum(before.values()) == 2


def test_a_long_requests_endpoint_gets_no_shorts_while_another_is_idle(stack):
    done = {}

    def long():
        done["long"] = post(stack.url, {"prompt": LONG, "max_tokens": 250}, timeout=60)

    t = threading.Thread(target=long)
    t.start()
    gw = stack.st.picker.gw
    for _ in range(500):  # until the long request runs somewhere
        busy = stack.st.call_soon(lambda: [b.name for b in gw.backends if b.running])
        if busy:
            break
        threading.Event().wait(0.01)
    assert busy
    shorts = []
    for _ in range(8):  # only while the long one runs (a loaded machine may be slower than it)
        s = post(stack.url, {"prompt": SHORT, "max_tokens": 2})
        if stack.st.call_soon(lambda: not gw.by_address(busy[0]).running):
            break
        shorts.append(s)
    t.join()
    assert done["long"].status_code == 200 and done["long"].headers["x-presched-endpoint"] == busy[0]
    assert shorts and all(s.status_code == 200 for s in shorts)
    assert busy[0] not in {s.headers["x-presched-endpoint"] for s in shorts}
    stack.idle()


def test_bad_input_gets_an_openai_error_naming_the_field(stack):
    n_rows = len(stack.rows())
    r = post(stack.url, {"prompt": SHORT, "max_tokens": "x"})
    assert r.status_code == 400 and r.headers["content-type"] == "application/json"
    assert r.json()["error"]["param"] == "max_tokens"
    r = post(stack.url, {"prompt": SHORT}, headers={"x-gateway-inference-fairness-id": "t" * 200})
    assert r.status_code == 400 and r.json()["error"]["param"] == "x-gateway-inference-fairness-id"
    r = httpx.post(f"{stack.url}/v1/completions", content=b"{not json", timeout=10)
    assert r.status_code == 400 and r.json()["error"]["param"] == "body"
    r = post(stack.url, {"prompt": SHORT, "model": "other"})
    assert r.status_code == 404 and r.json()["error"]["param"] == "model"
    assert len(stack.rows()) == n_rows  # refused before admission: no row (as `presched serve`)


def test_a_flood_from_one_fairness_id_does_not_starve_another(stack):
    # 3 endpoints x 2 slots run 6; max_queue 12 with two tenants of weight 1 and the unlisted
    # ids' pool (weight 1 too): 4 waiting each
    flood = {"x-gateway-inference-fairness-id": "flood"}
    results = []
    lock = threading.Lock()

    def one(h):
        r = post(stack.url, {"prompt": SHORT, "max_tokens": 300}, headers=h, timeout=60)
        with lock:
            results.append((h["x-gateway-inference-fairness-id"], r.status_code, r))

    threads = [threading.Thread(target=one, args=(flood,)) for _ in range(16)]
    for t in threads:
        t.start()
    gw = stack.st.picker.gw
    for _ in range(1000):  # until the flood fills its share
        if stack.st.call_soon(lambda: gw.shares.waiting("flood")) >= 4:
            break
        threading.Event().wait(0.01)
    calm = post(stack.url, {"prompt": SHORT, "max_tokens": 3}, headers={"x-gateway-inference-fairness-id": "calm"}, timeout=60)
    for t in threads:
        t.join()
    assert calm.status_code == 200
    codes = sorted(c for _, c, _ in results)
    # 16 sent, 6 run and 4 wait (its share): the rest refused, unless some finished meanwhile
    assert set(codes) == {200, 429} and codes.count(200) >= 10
    refused = next(r for _, c, r in results if c == 429)
    assert refused.json()["error"]["type"] == "rate_limit_error" and "flood" in refused.json()["error"]["message"]
    assert refused.headers["retry-after"] == "1"
    stack.idle(20)


def test_client_disconnect_mid_stream_frees_the_slot_and_logs_once(stack):
    n_rows = len(stack.rows())
    with httpx.Client(timeout=30) as c:
        with c.stream("POST", f"{stack.url}/v1/completions",
                      json={"model": "tiny", "prompt": SHORT, "max_tokens": 400, "stream": True}) as r:
            rid = r.headers["x-request-id"]
            got = 0
            for chunk in r.iter_raw():
                got += chunk.count(b"data: ")
                if got >= 3:
                    break
    stack.idle()
    rows = [x for x in stack.rows() if x["id"] == rid]
    assert len(rows) == 1 and rows[0]["status"] == 499
    assert len(stack.rows()) == n_rows + 1


def test_an_objective_names_its_targets_and_an_unknown_one_is_refused(stack):
    r = post(stack.url, {"prompt": SHORT, "max_tokens": 2}, headers={"x-gateway-inference-objective": "nope"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "x-gateway-inference-objective"
    r = post(stack.url, {"prompt": SHORT, "max_tokens": 2, "vllm_xargs": {"presched_tenant": "evil", "k": 1}},
             headers={"x-gateway-inference-objective": "chat", "x-gateway-inference-fairness-id": "t1"})  # fmt: skip
    assert r.status_code == 200
    # the engine plugin's policies (slo, vtc) read the targets and the fairness id from vllm_xargs
    xa = _seen_body(stack, r)["vllm_xargs"]
    assert (xa["presched_tenant"], xa["k"]) == ("t1", 1) and "presched_slo_e2e" not in xa
    assert 0.3 < xa["presched_slo_ttft"] < 0.5  # 0.5 less the time the picker held it (test_core.py)
    claim = {"presched_tenant": "evil", "presched_quantiles": [1] * 11, "presched_slo_e2e": 0.001}
    r = post(stack.url, {"prompt": SHORT, "max_tokens": 2, "vllm_xargs": claim})
    xa = _seen_body(stack, r)["vllm_xargs"]  # no fairness header, no objective: none of the claims passes
    assert set(xa) == {"presched_pred_mean", "presched_pred_q90"}
    stack.idle()


def _seen_body(stack, r) -> dict:
    served = r.headers["x-presched-endpoint"]
    return stack.st.engines[[e.address for e in stack.st.picker.cfg.endpoints].index(served)].seen[-1][1]


def test_a_large_body_passes_and_one_over_the_bound_gets_413_not_a_hang(stack):
    """A body of 5 MiB (over gRPC's default 4 MiB message limit: in BUFFERED mode it is one
    ext_proc message) reaches the engine whole; one over `max_body_bytes` is answered 413 in the
    OpenAI error format (Envoy's own, from its buffer limit, in BUFFERED mode; the picker's in
    FULL_DUPLEX_STREAMED mode), at once, and leaves no row."""
    import time

    limit = stack.st.picker.cfg.max_body_bytes
    n_rows = len(stack.rows())
    pad = "x" * (5 * 2**20)
    r = post(stack.url, {"prompt": SHORT, "max_tokens": 2, "user": pad})
    assert r.status_code == 200, r.text[:300]
    served = r.headers["x-presched-endpoint"]
    eng = stack.st.engines[[e.address for e in stack.st.picker.cfg.endpoints].index(served)]
    assert eng.seen[-1][1]["user"] == pad
    t = time.monotonic()
    r = post(stack.url, {"prompt": SHORT, "max_tokens": 2, "user": "x" * limit}, timeout=20)
    assert r.status_code == 413 and r.headers["content-type"] == "application/json"
    err = r.json()["error"]
    assert err["param"] == "body" and str(limit) in err["message"]
    assert time.monotonic() - t < 10
    stack.idle()
    assert len(stack.rows()) == n_rows + 1
