"""The gateway's HTTP contract, over real HTTP: byte-faithful relay, OpenAI error shapes, auth,
rate limits, the request log and /metrics.

Upstreams here are test doubles (`StubEngine`, or a canned app that answers fixed bytes) so the
bytes the gateway must relay are known exactly; tests/engine checks the same against vLLM.
"""

from __future__ import annotations

import json
import math
import time

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.applications import Starlette
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from presched.predict.base import PREDICTORS
from presched.predict.estimate import LEVELS
from presched.serve.app import build_app
from presched.serve.config import ServeConfig
from presched.serve.log import RequestLog
from presched.serve.request_body import INT_FIELDS, MAX_DEPTH, Done, check_fields, parse_body
from presched.serve.log_read import read_log
from presched.workload.request import Request

# What a vLLM server streams for a 3-token chat reply with include_usage (shape and spacing
# as vLLM writes them), split into network chunks that cut events in odd places.
EVENTS = [
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}\n\n',
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"H\xc3\xa9"},"logprobs":null,"finish_reason":null}]}\n\n',
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"llo"},"logprobs":null,"finish_reason":null}]}\n\n',
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"!"},"logprobs":null,"finish_reason":"stop","stop_reason":null}]}\n\n',
    b'data: {"id":"chatcmpl-1","object":"chat.completion.chunk","created":1,"model":"m","choices":[],"usage":{"prompt_tokens":9,"total_tokens":12,"completion_tokens":3}}\n\n',
    b"data: [DONE]\n\n",
]
WHOLE = b'{"id":"cmpl-9",  "object":"text_completion","created":1,"model":"m",\n"choices":[{"index":0,"text":" caf\xc3\xa9","finish_reason":"length"}],"usage":{"prompt_tokens":2,"total_tokens":9,"completion_tokens":7}}'


def canned_upstream(seen: list[dict]):
    """Answers every request with the fixed bytes above and records the bodies it received."""

    async def generate(request):
        body = await request.json()
        seen.append(body)
        if body.get("stream"):
            blob = b"".join(EVENTS)
            cuts = [0, 7, 150, 151, 400, 401, len(blob) - 3, len(blob)]

            async def chunks():
                for a, b in zip(cuts, cuts[1:]):
                    yield blob[a:b]

            return StreamingResponse(chunks(), media_type="text/event-stream")
        return Response(WHOLE, media_type="application/json")

    return Starlette(routes=[Route("/v1/chat/completions", generate, methods=["POST"]),
                             Route("/v1/completions", generate, methods=["POST"]),
                             Route("/health", lambda r: Response())])  # fmt: skip


def settle(gw, n: int, log=None) -> None:
    """Wait until `n` requests are fully recorded (the gateway finishes its books just after
    the client has its last byte), then flush the log."""
    deadline = time.monotonic() + 10
    while gw.ended < n:
        assert time.monotonic() < deadline, f"{gw.ended} of {n} requests recorded"
        time.sleep(0.002)
    if log is not None:
        log.flush()


def gateway(asgi_server, upstream: str, log=None, predictor=None, **cfg):
    cfg.setdefault("log", {"path": None})
    backends = [{"url": upstream, "model": cfg.pop("model", "m"), "max_in_flight": 4}]
    app = build_app(ServeConfig(backends=backends, **cfg), predictor, log)
    return asgi_server(app), app.state.gateway.gw


CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": True}


def test_stream_relayed_byte_for_byte(asgi_server):
    seen: list[dict] = []
    url, _ = gateway(asgi_server, asgi_server(canned_upstream(seen)))
    with_usage = {**CHAT, "stream_options": {"include_usage": True}, "temperature": 0.3, "top_k": 7}
    assert httpx.post(url + "/v1/chat/completions", json=with_usage).content == b"".join(EVENTS)
    # without include_usage the client gets what the backend would have sent it: no usage event
    r = httpx.post(url + "/v1/chat/completions", json=CHAT)
    assert r.content == b"".join(e for e in EVENTS if b'"usage"' not in e)
    assert r.headers["content-type"].startswith("text/event-stream")
    # the backend got the client's fields unchanged, plus include_usage
    assert seen[0] == with_usage
    assert seen[1] == {**CHAT, "stream_options": {"include_usage": True}}


def test_whole_response_relayed_byte_for_byte(asgi_server, tmp_path):
    log = RequestLog(tmp_path / "log.sqlite")
    url, gw = gateway(asgi_server, asgi_server(canned_upstream([])), log=log)
    r = httpx.post(url + "/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 7})
    assert r.status_code == 200 and r.content == WHOLE
    assert r.headers["x-request-id"].startswith("cmpl-")
    settle(gw, 1, log)
    row = read_log(tmp_path / "log.sqlite").iloc[0]
    assert row["output_tokens"] == 7 and row["finish_reason"] == "length" and row["stream"] == 0


def test_stream_usage_and_timings_logged(asgi_server, stub_server, tmp_path):
    up, _ = stub_server(model="m", token_s=0.002)
    log = RequestLog(tmp_path / "log.sqlite", store_prompts=True)
    url, gw = gateway(asgi_server, up, log=log)
    body = {"model": "m", "prompt": "count me", "max_tokens": 12, "stream": True}
    text = httpx.post(url + "/v1/completions", json=body).text
    assert text.count("data: ") == 13 and text.endswith("data: [DONE]\n\n")  # 12 tokens + DONE
    assert '"usage"' not in text
    settle(gw, 1, log)
    row = read_log(tmp_path / "log.sqlite").iloc[0]
    assert row["status"] == 200 and row["output_tokens"] == 12 and row["prompt"] == "count me"
    assert row["tenant"] == "default" and row["endpoint"] == "completions" and row["stream"] == 1
    assert 0 <= row["queue_wait_s"] <= row["ttft_s"] <= row["e2e_s"]
    assert row["e2e_s"] >= 11 * 0.002 * 0.9


@pytest.mark.parametrize(
    "body, status, param",
    [
        (b"{not json", 400, "body"),
        (b"[1, 2]", 400, "body"),
        (b'{"model": "m"}', 400, "prompt"),
        (b'{"model": "m", "prompt": 5}', 400, "prompt"),
        (b'{"model": "m", "prompt": "x", "max_tokens": 0}', 400, "max_tokens"),
        (b'{"model": "m", "prompt": "x", "max_tokens": "9"}', 400, "max_tokens"),
        (b'{"model": "m", "prompt": "x", "stream": "yes"}', 400, "stream"),
        (b'{"model": "m", "prompt": "x", "n": 3}', 400, "n"),
        (b'{"model": 7, "prompt": "x"}', 400, "model"),
        (b'{"model": "other", "prompt": "x"}', 404, "model"),
        (b'{"model": "m", "prompt": ["a", "b"]}', 400, "prompt"),
        (b'{"model": "m", "prompt": "' + b"word " * 400 + b'"}', 413, "prompt"),
        # integers are bounded (2**63 overflowed SQLite) and bools or floats are not integers
        (b'{"model": "m", "prompt": "x", "max_tokens": 9223372036854775808}', 400, "max_tokens"),
        (b'{"model": "m", "prompt": "x", "max_tokens": 2147483648}', 400, "max_tokens"),
        (b'{"model": "m", "prompt": "x", "max_tokens": true}', 400, "max_tokens"),
        (b'{"model": "m", "prompt": "x", "n": true}', 400, "n"),
        (b'{"model": "m", "prompt": "x", "n": 1.0}', 400, "n"),
        (b'{"model": "m", "prompt": "x", "seed": 18446744073709551616}', 400, "seed"),
        (b'{"model": "m", "prompt": "x", "seed": false}', 400, "seed"),
        (b'{"model": "m", "prompt": "x", "top_k": -2}', 400, "top_k"),
        (b'{"model": "m", "prompt": "x", "top_k": 5.0}', 400, "top_k"),
        (b'{"model": "m", "prompt": "x", "logprobs": 4294967296}', 400, "logprobs"),
        (b'{"model": "m", "prompt": "x", "priority": -9223372036854775809}', 400, "priority"),
        (b'{"model": "m", "prompt": "x", "min_tokens": -1}', 400, "min_tokens"),
        (b'{"model": "m", "prompt": [1, 9223372036854775808]}', 400, "prompt"),
        (b'{"model": "m", "prompt": "x", "max_tokens": ' + b"9" * 5000 + b"}", 400, "body"),
        (b'{"model": "m", "prompt": "x", "temperature": NaN}', 400, "body"),
        (b'{"model": "m", "prompt": "x", "top_p": Infinity}', 400, "body"),
        # JSON nested 1,000 deep raised RecursionError (a plain-text 500, connection dropped)
        (b'{"model": "m", "prompt": "x", "vllm_xargs": ' + b"[" * 1000 + b"]" * 1000 + b"}", 400, "body"),
        (b'{"model": "m", "prompt": "x", "stop": ' + b"[" * 100 + b"]" * 100 + b"}", 400, "body"),
        # a lone surrogate raised UnicodeEncodeError while counting tokens
        (b'{"model": "m", "prompt": "hi \\ud800"}', 400, "prompt"),
        (b'{"model": "m", "prompt": ["\\udfff"]}', 400, "prompt"),
        (b'{"model": "\\ud800", "prompt": "x"}', 404, "model"),
    ],
)
def test_bad_input_gets_openai_error_naming_the_field(asgi_server, stub_server, body, status, param):
    up, engine = stub_server(model="m")
    url, gw = gateway(asgi_server, up, max_prompt_tokens=300)
    r = httpx.post(url + "/v1/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status
    err = r.json()["error"]
    assert err["param"] == param and err["code"] == status and isinstance(err["message"], str)
    assert param in err["message"]
    assert engine.received == 0 and gw.accepted == 0  # refused before anything was queued


def test_chat_field_errors(asgi_server, stub_server):
    up, _ = stub_server(model="m")
    url, _ = gateway(asgi_server, up)
    user = {"role": "user", "content": "x"}
    for body, param in (({"model": "m"}, "messages"),
                        ({"model": "m", "messages": [{"content": "x"}]}, "messages[0]"),
                        ({"model": "m", "messages": [{"role": "user", "content": 3}]}, "messages[0].content"),
                        ({"model": "m", "messages": [user, {"role": "user", "content": "a\ud800"}]}, "messages[1].content"),
                        ({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "\udc00"}]}]},
                         "messages[0].content[0].text"),
                        ({"model": "m", "messages": [user], "logprobs": 3}, "logprobs"),
                        ({"model": "m", "messages": [user], "top_logprobs": True}, "top_logprobs"),
                        ({"model": "m", "messages": [user], "max_completion_tokens": 2**63}, "max_completion_tokens")):  # fmt: skip
        r = httpx.post(url + "/v1/chat/completions", content=json.dumps(body),  # ASCII: \ud800 escaped
                       headers={"content-type": "application/json"})  # fmt: skip
        assert r.status_code == 400 and r.json()["error"]["param"] == param, r.text
    ok = {"model": "m", "messages": [user], "logprobs": True, "top_logprobs": 2, "seed": -(2**63), "max_tokens": 2}
    assert httpx.post(url + "/v1/chat/completions", json=ok).status_code == 200


def test_body_over_the_size_limit_is_413(asgi_server, stub_server):
    up, _ = stub_server(model="m")
    url, _ = gateway(asgi_server, up, max_body_bytes=2048)
    r = httpx.post(url + "/v1/completions", json={"model": "m", "prompt": "x" * 5000})
    assert r.status_code == 413 and r.json()["error"]["type"] == "invalid_request_error"


JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 10**6) | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4),
    max_leaves=12,
)
FIELDS = st.fixed_dictionaries({}, optional={
    "model": st.sampled_from(["m", "nope"]) | JSON, "prompt": st.text(max_size=50) | JSON,
    "messages": JSON | st.lists(st.fixed_dictionaries({"role": st.just("user")}, optional={"content": JSON | st.text()}), max_size=3),
    "max_tokens": st.integers(-2, 8) | JSON, "stream": st.booleans() | JSON, "n": JSON,
    "stream_options": JSON, "ignore_eos": JSON, "vllm_xargs": JSON,
})  # fmt: skip


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=FIELDS | JSON, chat=st.booleans())
def test_fuzzed_bodies_never_crash_the_gateway(asgi_server, stub_server, body, chat):
    if not hasattr(test_fuzzed_bodies_never_crash_the_gateway, "url"):
        up, _ = stub_server(model="m")
        test_fuzzed_bodies_never_crash_the_gateway.url = gateway(asgi_server, up)  # type: ignore[attr-defined]
    url, gw = test_fuzzed_bodies_never_crash_the_gateway.url  # type: ignore[attr-defined]
    path = "/v1/chat/completions" if chat else "/v1/completions"
    r = httpx.post(url + path, content=json.dumps(body), headers={"content-type": "application/json"},
                   timeout=10)  # fmt: skip
    assert r.status_code in (200, 400, 404), r.text
    if r.status_code != 200:
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["code"] == r.status_code
    assert gw.num_waiting == 0


@pytest.fixture(autouse=True)
def _forget_fuzz_server():
    yield
    if hasattr(test_fuzzed_bodies_never_crash_the_gateway, "url"):
        del test_fuzzed_bodies_never_crash_the_gateway.url  # type: ignore[attr-defined]


TENANTS = [{"name": "gold", "api_key": "sk-gold", "weight": 2},
           {"name": "free", "api_key": "sk-free", "rate_limit_rps": 0.5, "burst": 2}]  # fmt: skip


def test_api_keys_map_to_tenants(asgi_server, stub_server, tmp_path):
    up, engine = stub_server(model="m")
    log = RequestLog(tmp_path / "log.sqlite")
    url, gw = gateway(asgi_server, up, log=log, tenants=TENANTS)
    body = {"model": "m", "prompt": "x", "max_tokens": 2}
    for headers in ({}, {"authorization": "Bearer sk-wrong"}, {"authorization": "sk-gold"}):
        r = httpx.post(url + "/v1/completions", json=body, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert httpx.get(url + "/v1/models").status_code == 401
    assert httpx.get(url + "/v1/models", headers={"authorization": "Bearer sk-free"}).json()["data"][0]["id"] == "m"
    ok = httpx.post(url + "/v1/completions", json=body, headers={"authorization": "Bearer sk-gold"})
    assert ok.status_code == 200 and engine.received == 1
    settle(gw, 1, log)
    assert list(read_log(tmp_path / "log.sqlite")["tenant"]) == ["gold"]


def test_rate_limit_per_tenant(asgi_server, stub_server):
    up, _ = stub_server(model="m")
    url, _ = gateway(asgi_server, up, tenants=TENANTS)
    body = {"model": "m", "prompt": "x", "max_tokens": 2}
    free = [httpx.post(url + "/v1/completions", json=body, headers={"authorization": "Bearer sk-free"})
            for _ in range(4)]  # fmt: skip
    assert [r.status_code for r in free] == [200, 200, 429, 429]  # burst 2, then 0.5 req/s
    assert free[2].json()["error"]["type"] == "rate_limit_error"
    assert 1 <= int(free[2].headers["retry-after"]) <= 3
    gold = httpx.post(url + "/v1/completions", json=body, headers={"authorization": "Bearer sk-gold"})
    assert gold.status_code == 200  # other tenants are not limited by it


def test_metrics_export_requests_and_prediction_error(asgi_server, stub_server):
    reqs = [Request(id=f"t{p}", prompt_tokens=p, output_tokens=2 * p, model="m") for p in range(2, 200, 3)]
    pred = PREDICTORS.create("linear-prompt").fit(reqs)
    up, _ = stub_server(model="m")
    url, gw = gateway(asgi_server, up, predictor=pred, policy="sjf")
    for k in (5, 10, 20, 40):
        r = httpx.post(url + "/v1/completions", json={"model": "m", "prompt": " ".join(["w"] * k), "max_tokens": 2 * k})
        assert r.status_code == 200
    settle(gw, 4)
    text = httpx.get(url + "/metrics").text
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, v = line.rsplit(" ", 1)
            values[name] = float(v)
    assert values['presched_requests_total{status="200",tenant="default"}'] == 4
    assert values["presched_e2e_seconds_count"] == 4
    assert values["presched_predictor_samples"] == 4
    assert values["presched_predictor_kendall_tau"] == pytest.approx(gw.tracker.kendall_tau)
    assert not math.isnan(values["presched_predictor_mae_tokens"])
    assert values[f'presched_backend_up{{backend="{up}"}}'] == 1
    h = httpx.get(url + "/health").json()
    assert h["status"] == "ok" and h["finished"] == 4 and h["predictor"]["samples"] == 4


def test_prediction_logged_with_quantiles(asgi_server, stub_server, tmp_path):
    reqs = [Request(id=f"t{p}", prompt_tokens=p, output_tokens=3 * p, model="m") for p in range(2, 200, 3)]
    pred = PREDICTORS.create("linear-prompt").fit(reqs)
    up, _ = stub_server(model="m")
    log = RequestLog(tmp_path / "log.sqlite")
    url, gw = gateway(asgi_server, up, log=log, predictor=pred, policy="sjf")
    httpx.post(url + "/v1/completions", json={"model": "m", "prompt": "a b c d e f g h", "max_tokens": 4})
    settle(gw, 1, log)
    row = read_log(tmp_path / "log.sqlite").iloc[0]
    q = row["pred_quantiles"]
    assert len(q) == len(LEVELS) and q == sorted(q)
    est = pred.predict([Request(id="x", prompt_tokens=int(row["prompt_tokens"]), model="m")])[0]
    assert q == pytest.approx([est.quantile(p) for p in LEVELS], abs=0.01)
    assert row["pred_mean"] == pytest.approx(est.mean) == pytest.approx(row["priority"])  # sjf key


def metric_values(text: str) -> dict[str, float]:
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, v = line.rsplit(" ", 1)
            values[name] = float(v)
    return values


def test_unknown_paths_and_methods_get_openai_errors_and_are_counted(asgi_server, stub_server):
    up, _ = stub_server(model="m")
    url, _ = gateway(asgi_server, up)
    for method, path, status in (("GET", "/nope", 404), ("GET", "/v1/completions", 405),
                                 ("DELETE", "/v1/chat/completions", 405), ("POST", "/health", 405)):  # fmt: skip
        r = httpx.request(method, url + path)
        assert r.status_code == status and r.headers["content-type"] == "application/json", r.text
        err = r.json()["error"]
        assert set(err) == {"message", "type", "param", "code"} and err["code"] == status
    assert set(r.headers["allow"].split(", ")) == {"GET", "HEAD"}  # 405 says what is allowed
    httpx.post(url + "/v1/completions", content=b"{", headers={"content-type": "application/json"})
    values = metric_values(httpx.get(url + "/metrics").text)
    assert values['presched_http_responses_total{endpoint="other",status="404"}'] == 1
    assert values['presched_http_responses_total{endpoint="/v1/completions",status="405"}'] == 1
    assert values['presched_http_responses_total{endpoint="/v1/completions",status="400"}'] == 1
    assert values['presched_http_responses_total{endpoint="/health",status="405"}'] == 1
    assert values["presched_unhandled_errors_total"] == 0


def test_an_unexpected_exception_is_answered_counted_and_logged(asgi_server, stub_server, tmp_path, caplog):
    """A bug anywhere in the request path must give an OpenAI 500, a log row, a server log line
    and a metric, and leave the connection usable. TEST DOUBLE: the token counter is replaced
    by one that raises, standing in for any bug (the real inputs that used to crash, deep JSON
    and lone surrogates, are 400s now: test_bad_input_gets_openai_error_naming_the_field)."""
    up, engine = stub_server(model="m")
    log = RequestLog(tmp_path / "log.sqlite")
    app = build_app(ServeConfig(backends=[{"url": up, "model": "m"}], log={"path": None}), None, log)
    url, gw, g = asgi_server(app), app.state.gateway.gw, app.state.gateway
    real_count = g.count

    def broken(text: str) -> int:
        if text == "boom":
            raise RuntimeError("a bug")
        return real_count(text)

    g.count = broken
    with httpx.Client() as client, caplog.at_level("ERROR", logger="presched.serve.guard"):
        r = client.post(url + "/v1/completions", json={"model": "m", "prompt": "boom", "max_tokens": 2})
        assert r.status_code == 500 and r.headers["content-type"] == "application/json"
        assert r.json()["error"] == {"message": "gateway error: RuntimeError (logged)",
                                     "type": "server_error", "param": None, "code": 500}  # fmt: skip
        ok = client.post(url + "/v1/completions", json={"model": "m", "prompt": "fine", "max_tokens": 2})
        assert ok.status_code == 200  # same client, the gateway still serves
    assert "unhandled error on POST /v1/completions" in caplog.text and "RuntimeError: a bug" in caplog.text
    settle(gw, 1, log)
    rows = read_log(tmp_path / "log.sqlite")
    assert sorted(rows["status"].tolist()) == [200, 500]
    bad = rows[rows["status"] == 500].iloc[0]
    assert bad["error"] == "gateway error: RuntimeError: a bug" and bad["endpoint"] == "completions"
    values = metric_values(httpx.get(url + "/metrics").text)
    assert values["presched_unhandled_errors_total"] == 1
    assert values['presched_http_responses_total{endpoint="/v1/completions",status="500"}'] == 1
    assert values['presched_http_responses_total{endpoint="/v1/completions",status="200"}'] == 1
    assert engine.received == 1 and gw.num_waiting == 0


def test_a_chunked_body_over_the_limit_is_refused_while_it_is_sent(asgi_server, stub_server):
    """Regression: a chunked body was buffered whole before max_body_bytes was checked (four
    200 MB uploads took the gateway from 177 MB to 1.33 GB). 64 MiB offered, 1 MiB allowed: the
    gateway answers 413 and closes, so the client stops long before it has sent it all."""
    up, engine = stub_server(model="m")
    url, gw = gateway(asgi_server, up, max_body_bytes=2**20)
    chunk, total = b"x" * 2**16, 2**26
    sent = 0

    def body():
        nonlocal sent
        yield b'{"model": "m", "prompt": "'
        while sent < total:
            sent += len(chunk)
            yield chunk

    r = None
    try:  # no Content-Length: httpx sends a generator chunked
        r = httpx.post(url + "/v1/completions", content=body(), headers={"content-type": "application/json"})
    except (httpx.WriteError, httpx.ReadError, httpx.RemoteProtocolError):
        pass  # the server closed while we were still writing: refused all the same
    assert sent < total // 4, f"the client could send {sent} of {total} bytes"
    if r is not None:
        assert r.status_code == 413 and r.json()["error"]["code"] == 413
        assert r.headers["connection"] == "close"
    assert engine.received == 0 and gw.accepted == 0
    ok = httpx.post(url + "/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 1})
    assert ok.status_code == 200


def test_status_endpoints_need_a_key_when_tenants_are_configured(asgi_server, stub_server):
    """Regression: /metrics and /health told anyone the tenant names and backend URLs."""
    up, _ = stub_server(model="m")
    gold, free = {"authorization": "Bearer sk-gold"}, {"api-key": "sk-free"}
    url, _ = gateway(asgi_server, up, tenants=TENANTS)
    httpx.post(url + "/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 1}, headers=gold)
    r = httpx.get(url + "/metrics")
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
    assert httpx.get(url + "/metrics", headers={"authorization": "Bearer sk-nope"}).status_code == 401
    live = httpx.get(url + "/health")
    assert live.status_code == 200 and live.json() == {"status": "ok"}  # liveness, nothing else
    assert 'tenant="gold"' in httpx.get(url + "/metrics", headers=free).text
    assert httpx.get(url + "/health", headers=gold).json()["backends"][0]["url"] == up

    admin = {"authorization": "Bearer sk-admin"}
    url, _ = gateway(asgi_server, up, tenants=TENANTS, admin_api_key="sk-admin")
    assert httpx.get(url + "/metrics", headers=gold).status_code == 401  # only the admin key
    assert httpx.get(url + "/health", headers=gold).json() == {"status": "ok"}
    assert httpx.get(url + "/metrics", headers=admin).status_code == 200
    assert "backends" in httpx.get(url + "/health", headers=admin).json()

    url, _ = gateway(asgi_server, up, admin_api_key="sk-admin")  # no tenants, still closed
    assert httpx.get(url + "/metrics").status_code == 401
    url, _ = gateway(asgi_server, up, tenants=TENANTS, public_status=True)
    assert httpx.get(url + "/metrics").status_code == 200 and "backends" in httpx.get(url + "/health").json()
    with pytest.raises(ValueError, match="admin_api_key: must differ"):
        ServeConfig(backends=[{"url": up}], tenants=TENANTS, admin_api_key="sk-free")


def test_bodies_that_are_not_json_by_content_type_get_415(asgi_server, stub_server):
    up, engine = stub_server(model="m")
    url, _ = gateway(asgi_server, up)
    raw = b'{"model": "m", "prompt": "x", "max_tokens": 1}'
    for ct in ("text/plain", "application/x-www-form-urlencoded", None, "application/jsonx"):
        r = httpx.post(url + "/v1/completions", content=raw, headers={"content-type": ct} if ct else {})
        assert r.status_code == 415 and r.json()["error"]["param"] == "content-type", ct
    assert engine.received == 0
    ok = httpx.post(url + "/v1/chat/completions", headers={"content-type": "Application/JSON; charset=utf-8"},
                    content=b'{"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 1}')  # fmt: skip
    assert ok.status_code == 200
    url, _ = gateway(asgi_server, up, check_content_type=False)
    assert httpx.post(url + "/v1/completions", content=raw, headers={"content-type": "text/plain"}).status_code == 200


def test_hosts_outside_the_allow_list_are_refused(asgi_server, stub_server):
    up, engine = stub_server(model="m")
    url, _ = gateway(asgi_server, up, allowed_hosts=["gw.example", "*.internal"], public_status=True)
    body = {"model": "m", "prompt": "x", "max_tokens": 1}
    for host in ("evil.example", "127.0.0.1", "internal", "gw.example.evil"):
        r = httpx.post(url + "/v1/completions", json=body, headers={"host": host})
        assert r.status_code == 400 and r.json()["error"]["param"] == "host", host
        assert httpx.get(url + "/health", headers={"host": host}).status_code == 400
    assert engine.received == 0
    for host in ("gw.example", "GW.example:8080", "a.b.internal:1"):
        assert httpx.post(url + "/v1/completions", json=body, headers={"host": host}).status_code == 200
    values = metric_values(httpx.get(url + "/metrics", headers={"host": "gw.example"}).text)
    assert values['presched_http_responses_total{endpoint="/v1/completions",status="400"}'] == 4


def test_an_exception_after_admission_ends_the_request_with_a_row(asgi_server, stub_server, tmp_path, caplog):
    """The same for a bug once the request is accepted (it holds a queue place and a slot).
    TEST DOUBLE: building the upstream body raises, standing in for any bug while serving."""
    up, engine = stub_server(model="m")
    log = RequestLog(tmp_path / "log.sqlite")
    app = build_app(ServeConfig(backends=[{"url": up, "model": "m"}], log={"path": None}), None, log)
    url, gw, g = asgi_server(app), app.state.gateway.gw, app.state.gateway

    def broken(seq, body):
        raise KeyError("a bug")

    g._upstream_body = broken
    with caplog.at_level("ERROR", logger="presched.serve.app"):
        r = httpx.post(url + "/v1/completions", json={"model": "m", "prompt": "x", "max_tokens": 2})
    assert r.status_code == 500 and r.json()["error"]["type"] == "server_error"
    assert "unhandled error while serving" in caplog.text and "KeyError: 'a bug'" in caplog.text
    settle(gw, 1, log)
    row = read_log(tmp_path / "log.sqlite").iloc[0]
    assert row["status"] == 500 and "KeyError" in row["error"]
    values = metric_values(httpx.get(url + "/metrics").text)
    assert values["presched_unhandled_errors_total"] == 1
    assert values['presched_requests_total{status="500",tenant="default"}'] == 1
    assert gw.num_waiting == 0 and sum(b.num_running for b in gw.backends) == 0 and engine.received == 0


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(sorted(INT_FIELDS)), v=JSON | st.integers(-(2**70), 2**70), chat=st.booleans())
def test_integer_fields_accept_exactly_their_range(name, v, chat):
    body = {"model": "m", "prompt": "x", name: v}
    if chat:
        body = {"model": "m", "messages": [{"role": "user", "content": "x"}], name: v}
    problem = check_fields(body, chat, ["m"])
    lo, hi = INT_FIELDS[name]
    if chat and name == "logprobs":  # chat's logprobs is a bool
        ok = v is None or isinstance(v, bool)
    else:
        ok = v is None or (isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi)
    assert (problem is None) == ok, (name, v, problem)
    if problem is not None:
        assert problem[0] == name and problem[1].startswith(f"{name}: ") and problem[2] == 400


@settings(max_examples=60, deadline=None)
@given(depth=st.integers(1, 3 * MAX_DEPTH), wrap=st.sampled_from(["[", "{"]))
def test_json_deeper_than_the_bound_is_refused(depth, wrap):
    inner = ("[" * depth + "]" * depth) if wrap == "[" else ('{"a": ' * depth + "1" + "}" * depth)
    raw = ('{"model": "m", "prompt": "x", "vllm_xargs": {"k": ' + inner + "}}").encode()
    total = depth + 2  # the body and vllm_xargs around it
    try:
        parse_body(raw, False, ["m"])
        refused = False
    except Done as d:
        refused = json.loads(d.response.body)["error"]["param"] == "body"
    assert refused == (total > MAX_DEPTH)


def test_send_prediction_names_the_tenant_to_the_engine_and_drops_a_claimed_one(asgi_server):
    """With send_prediction the engine plugin's policies (vtc) get the tenant the API key maps
    to as vllm_xargs presched_tenant; a client's own presched_tenant never reaches the engine."""
    seen: list[dict] = []
    up = asgi_server(canned_upstream(seen))
    url, _ = gateway(asgi_server, up, tenants=TENANTS, send_prediction=True)
    body = {**CHAT, "stream": False, "vllm_xargs": {"presched_tenant": "gold", "k": 1}}
    httpx.post(url + "/v1/chat/completions", json=body, headers={"authorization": "Bearer sk-free"})
    assert seen[-1]["vllm_xargs"] == {"presched_tenant": "free", "k": 1}
    url, _ = gateway(asgi_server, up, send_prediction=True)  # no tenants: everyone is 'default'
    httpx.post(url + "/v1/chat/completions", json=body)
    assert seen[-1]["vllm_xargs"] == {"k": 1}


def test_a_clients_own_presched_xargs_never_reach_the_engine_unless_trusted(asgi_server):
    """A client's presched_quantiles would outrank the gateway's prediction in the engine (and
    presched_tenant, _target, _slo_* set its share, oracle length, deadlines): dropped, with or
    without send_prediction; `trust_client_xargs` forwards them (a benchmark's oracle lengths)."""
    seen: list[dict] = []
    up = asgi_server(canned_upstream(seen))
    claim = {"presched_quantiles": [1] * 11, "presched_point": 1, "presched_pred_mean": 1, "presched_pred_q90": 2,
             "presched_target": 1, "presched_tenant": "gold", "presched_slo_ttft": 0.001, "presched_slo_e2e": 1}
    body = {**CHAT, "stream": False, "vllm_xargs": {**claim, "k": 1}}
    for send in (False, True):
        url, _ = gateway(asgi_server, up, send_prediction=send)
        httpx.post(url + "/v1/chat/completions", json=body)
        assert seen[-1]["vllm_xargs"] == {"k": 1}
    httpx.post(url + "/v1/chat/completions", json={**body, "vllm_xargs": claim})
    assert "vllm_xargs" not in seen[-1]  # nothing left to forward
    url, _ = gateway(asgi_server, up, trust_client_xargs=True)
    httpx.post(url + "/v1/chat/completions", json=body)
    assert seen[-1]["vllm_xargs"] == {**claim, "k": 1}
