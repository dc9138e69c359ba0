"""The gateway orders requests by policy, over real HTTP, in front of a stand-in engine.

The upstream is `StubEngine` (a test double: one slot, a fixed time per token) so that the order
in which requests reach the engine is observable and exact; tests/engine repeats the SJF-vs-FCFS
check against real vLLM. The predictor is a real one (`linear-prompt`, fitted here on requests
whose output is twice the prompt), so predicted length grows with the prompt.
"""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from starlette.applications import Starlette
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from presched.predict.base import PREDICTORS
from presched.schedule.fcfs import FCFS
from presched.serve.app import build_app
from presched.serve.config import ServeConfig
from presched.serve.log import RequestLog, read_log
from presched.workload.request import Request

WORDS = {k: " ".join(["word"] * k) for k in (3, 8, 20, 45, 90, 150)}


@pytest.fixture(scope="module")
def predictor():
    reqs = [Request(id=f"t{p}", prompt_tokens=p, output_tokens=2 * p, model="stub")
            for p in range(2, 300, 3)]  # fmt: skip
    return PREDICTORS.create("linear-prompt").fit(reqs)


def start_gateway(asgi_server, upstream: str, predictor=None, **cfg):
    cfg.setdefault("log", {"path": None})
    backends = [{"url": upstream, "model": "stub", "max_in_flight": cfg.pop("max_in_flight", 1)}]
    app = build_app(ServeConfig(backends=backends, **cfg), predictor)
    return asgi_server(app), app.state.gateway.gw


def post(url: str, prompt: str, max_tokens: int, out: dict | None = None, **extra) -> httpx.Response:
    r = httpx.post(url + "/v1/completions", timeout=30,
                   json={"model": "stub", "prompt": prompt, "max_tokens": max_tokens, **extra})  # fmt: skip
    if out is not None:
        out[prompt] = time.perf_counter()  # when its client had the whole answer
    return r


def wait_for(cond, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting")
        time.sleep(0.005)


def burst_behind_blocker(url, engine, prompts, max_tokens, waiting, **extra):
    """One endless streaming request occupies the engine's single slot; `prompts` arrive one
    after the other (each once the previous one waits: `waiting()` counts them); then the
    blocker's client disconnects, which frees the slot. Returns the order in which the engine
    started the requests, and each one's completion time, counted from that moment."""
    done: dict[str, float] = {}
    stop = threading.Event()

    def blocker() -> None:
        body = {"model": "stub", "prompt": "blocker", "max_tokens": 100_000, "stream": True, **extra}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as r:
            for _ in r.iter_raw():
                if stop.is_set():
                    return

    b = threading.Thread(target=blocker)
    b.start()
    wait_for(lambda: "blocker" in engine.started)
    threads = []
    for p, n in zip(prompts, max_tokens):
        th = threading.Thread(target=post, args=(url, p, n, done), kwargs=extra)
        th.start()
        threads.append(th)
        wait_for(lambda: waiting() == len(threads))
    t0 = time.perf_counter()
    stop.set()
    for th in [b, *threads]:
        th.join(30)
    started = [p for p in engine.started if p != "blocker"]
    assert sorted(started) == sorted(prompts)
    return started, {p: t - t0 for p, t in done.items()}


def test_sjf_releases_shortest_prediction_first(asgi_server, stub_server, predictor):
    up, engine = stub_server(model="stub", token_s=0.005, max_concurrency=1)
    url, gw = start_gateway(asgi_server, up, predictor, policy="sjf")
    order = [WORDS[k] for k in (90, 8, 150, 3, 45, 20)]
    started, _ = burst_behind_blocker(url, engine, order, [2] * 6, lambda: gw.num_waiting)
    assert [len(p.split()) for p in started] == [3, 8, 20, 45, 90, 150]
    wait_for(lambda: gw.finished == 6)  # the books close just after the last reply is sent
    assert gw.accepted == 7 and gw.num_waiting == 0  # the blocker was cancelled (499)


def test_fcfs_releases_in_arrival_order(asgi_server, stub_server):
    up, engine = stub_server(model="stub", token_s=0.005, max_concurrency=1)
    url, gw = start_gateway(asgi_server, up, policy="fcfs")
    order = [WORDS[k] for k in (90, 8, 150, 3, 45, 20)]
    started, _ = burst_behind_blocker(url, engine, order, [2] * 6, lambda: gw.num_waiting)
    assert started == order


def test_passthrough_sends_priority_from_prediction(asgi_server, stub_server, predictor):
    # the gateway holds nothing back; the engine (here: the stub, which orders its waiting
    # requests by the `priority` field as vLLM's priority scheduler does) does the ordering
    up, engine = stub_server(model="stub", token_s=0.005, max_concurrency=1)
    url, gw = start_gateway(asgi_server, up, predictor, mode="passthrough", policy="sjf")
    order = [WORDS[k] for k in (45, 150, 3, 90, 20, 8)]
    started, _ = burst_behind_blocker(url, engine, order, [2] * 6, lambda: len(engine._waiting))
    assert [len(p.split()) for p in started] == [3, 8, 20, 45, 90, 150]
    assert gw.num_waiting == 0


def test_sjf_oracle_cuts_mean_e2e_as_the_closed_form_says(asgi_server, stub_server):
    # One slot, n jobs waiting at once: the mean completion time is token_s * mean of the
    # cumulative sums of lengths in service order. Shortest first: (2,5,10,20,30,40) ->
    # 39.5 tokens; arrival order (40,5,30,2,20,10) -> 73.5 tokens: ratio 1.86.
    # A machine's overhead c per request adds 3.5 c to both means and pulls the ratio toward 1:
    # with 15 ms a token it stays above 1.6 up to c = 70 ms (with 6 ms, only up to 30 ms).
    token_s = 0.015
    lengths = [40, 5, 30, 2, 20, 10]
    prompts = [f"job{i}" for i in range(len(lengths))]
    means = {}
    for policy in ("fcfs", "sjf-oracle"):
        up, engine = stub_server(model="stub", token_s=token_s, max_concurrency=1)
        url, gw = start_gateway(asgi_server, up, policy=policy)
        started, done = burst_behind_blocker(url, engine, prompts, lengths, lambda: gw.num_waiting,
                                            ignore_eos=True)  # fmt: skip
        want = prompts if policy == "fcfs" else [p for _, p in sorted(zip(lengths, prompts))]
        assert started == want
        means[policy] = sum(done.values()) / len(done)
    ratio = means["fcfs"] / means["sjf-oracle"]
    # the token clock is a floor (a loaded machine only stretches it); the order gives the ratio
    assert means["fcfs"] >= 0.95 * 73.5 * token_s and means["sjf-oracle"] >= 0.95 * 39.5 * token_s
    assert ratio > 1.6, (ratio, means)


def test_oracle_policy_refuses_requests_without_forced_length(asgi_server, stub_server):
    up, _ = stub_server(model="stub")
    url, gw = start_gateway(asgi_server, up, policy="sjf-oracle")
    r = post(url, "hello", 5)
    assert r.status_code == 400
    assert r.json()["error"]["param"] == "ignore_eos"
    assert post(url, "hello", 5, ignore_eos=True).status_code == 200
    assert gw.accepted == 1


def test_predictive_policy_without_predictor_is_refused_at_start():
    cfg = ServeConfig(backends=[{"url": "http://127.0.0.1:9"}], policy="sjf", log={"path": None})
    with pytest.raises(ValueError, match=r"predictor: policy 'sjf' reads length predictions"):
        build_app(cfg)


def test_vtc_lets_a_late_tenant_pass_a_flooding_one(asgi_server, stub_server):
    # Tenant "flood" queues 6 requests behind its own long request; then "late" sends 2. FCFS
    # would start them 7th and 8th; VTC (fair share: the backlogged tenant with the least
    # service goes next) starts them within the first three, as soon as the flooding tenant's
    # counter has grown past the late one's.
    tenants = [{"name": "flood", "api_key": "k-flood"}, {"name": "late", "api_key": "k-late"}]
    up, engine = stub_server(model="stub", token_s=0.002, max_concurrency=1)
    url, gw = start_gateway(asgi_server, up, policy="vtc", tenants=tenants)
    jobs = [f"flood {i}" for i in range(6)] + ["late 0", "late 1"]
    keys = {p: "k-" + p.split()[0] for p in jobs}
    threads = []

    def send(prompt: str) -> None:
        r = httpx.post(url + "/v1/completions", timeout=30, headers={"authorization": f"Bearer {keys[prompt]}"},
                       json={"model": "stub", "prompt": prompt, "max_tokens": 20})  # fmt: skip
        assert r.status_code == 200

    stop = threading.Event()

    def blocker() -> None:
        body = {"model": "stub", "prompt": "blocker", "max_tokens": 100_000, "stream": True}
        with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30,
                          headers={"authorization": "Bearer k-flood"}) as r:  # fmt: skip
            for _ in r.iter_raw():
                if stop.is_set():
                    return

    threads.append(threading.Thread(target=blocker))
    threads[0].start()
    wait_for(lambda: "blocker" in engine.started)
    for p in jobs:
        threads.append(threading.Thread(target=send, args=(p,)))
        threads[-1].start()
        wait_for(lambda: gw.num_waiting == len(threads) - 1)
    stop.set()
    for th in threads:
        th.join(30)
    started = [p for p in engine.started if p != "blocker"]
    assert sorted(started) == sorted(jobs)
    assert max(started.index("late 0"), started.index("late 1")) <= 3, started


# --- policies and predictors that misbehave; what reaches the engine --------------------------
class BoomOnSchedule(FCFS):
    """FCFS whose `on_schedule` raises for prompts containing 'boom' (a stand-in policy bug)."""

    def on_schedule(self, seq, now):
        if "boom" in (seq.request.prompt or ""):
            raise RuntimeError("broken policy")


def test_a_policy_that_raises_answers_a_logged_500_and_frees_the_slot(asgi_server, stub_server, tmp_path):
    up, _ = stub_server(model="stub")
    log = RequestLog(tmp_path / "log.sqlite")
    backends = [{"url": up, "model": "stub", "max_in_flight": 1}]
    app = build_app(ServeConfig(backends=backends, log={"path": None}), None, log)
    g = app.state.gateway
    b = g.gw.backends[0]
    b.policy = BoomOnSchedule()
    b.queue = b.policy.new_queue()
    url = asgi_server(app)
    r = httpx.post(url + "/v1/completions", json={"model": "stub", "prompt": "boom", "max_tokens": 3}, timeout=10)
    assert r.status_code == 500
    err = r.json()["error"]
    assert err["type"] == "server_error" and "on_schedule" in err["message"] and err["code"] == 500
    assert post(url, "fine", 3).status_code == 200  # the slot did not leak (max_in_flight 1)
    wait_for(lambda: g.gw.ended == 2)
    log.flush()
    assert list(read_log(tmp_path / "log.sqlite")["status"]) == [500, 200]
    assert "presched_policy_errors_total 1.0" in httpx.get(url + "/metrics").text


def recording_upstream(seen: list[dict]) -> Starlette:
    async def complete(request):
        seen.append(await request.json())
        return JSONResponse({"id": "cmpl-1", "object": "text_completion", "model": "stub",
                             "choices": [{"index": 0, "text": "x", "finish_reason": "length"}],
                             "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})  # fmt: skip

    return Starlette(routes=[Route("/v1/completions", complete, methods=["POST"]),
                             Route("/health", lambda r: Response())])  # fmt: skip


@pytest.mark.parametrize("mode", ["queue", "passthrough"])
def test_the_client_cannot_set_the_engines_priority(asgi_server, mode):
    seen: list[dict] = []
    url, _ = start_gateway(asgi_server, asgi_server(recording_upstream(seen)), mode=mode)
    assert post(url, "hello", 2, priority=-1000).status_code == 200
    # queue mode: the gateway's order is the order; passthrough: the gateway's prediction
    # (none here: 0) is the priority
    assert seen[0].get("priority") == (None if mode == "queue" else 0)
    assert seen[0]["prompt"] == "hello"


class GatedPredictor:
    """`linear-prompt`, except that a batch with a 'slow' prompt blocks until `release` is set
    (at most 5 s): a stand-in for a predictor busy with a batch of long prompts."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.entered, self.release = threading.Event(), threading.Event()
        self.events: list[str] = []

    def predict(self, requests):
        if any("slow" in (r.prompt or "") for r in requests):
            self.entered.set()
            self.release.wait(5)
            self.events.append("slow prediction returned")
        return self.inner.predict(requests)


def test_a_slow_prediction_does_not_hold_up_another_stream(asgi_server, stub_server, predictor):
    up, _ = stub_server(model="stub", token_s=0.01)
    gated = GatedPredictor(predictor)
    url, gw = start_gateway(asgi_server, up, gated, max_in_flight=4)
    body = {"model": "stub", "prompt": "fast", "max_tokens": 300, "stream": True}
    slow = threading.Thread(target=post, args=(url, "slow " + WORDS[150], 2))
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=30) as r:
        events = r.iter_raw()
        next(events)  # the stream runs
        slow.start()
        assert gated.entered.wait(10)  # the slow prediction has started and blocks
        for _ in events:
            pass
    gated.events.append("stream done")
    gated.release.set()
    slow.join(30)
    # the stream ended while the predictor was still busy (on the event loop it waited 5 s)
    assert gated.events == ["stream done", "slow prediction returned"]
    wait_for(lambda: gw.ended == 2)
