"""Shared fixtures. The shared data (`<repo>/../shared/data` or $PRESCHED_DATA_DIR) must be
present: tests that need it fail loudly instead of being skipped.

Hypothesis explores new random examples on every local run; in CI (CI=true) it replays a fixed,
derandomized set so that a green build stays green for the same code. Both profiles have no
per-example deadline: most properties here are CPU-bound simulations, and on a busy machine a
200 ms deadline fails them for being slow, not wrong (tests assert behaviour, never speed)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest
import uvicorn
from hypothesis import settings

from presched.serve.stub import StubEngine
from presched.workload.paths import data_dir as _data_dir

settings.register_profile("presched", deadline=None, print_blob=True)
settings.register_profile("ci", settings.get_profile("presched"), derandomize=True)
settings.load_profile("ci" if os.environ.get("CI") else "presched")


# --- the engine tier on one pytest-xdist worker ----------------------------------------------------
# The README's test command runs `pytest -n 2`: two workers. Every test that starts a real engine
# (tests/engine, and the script tests marked `engine` in ENGINE_FILES) forms ONE work unit, so it
# runs on one worker in file order: the engines those tests share (session and module fixtures)
# start once, and two engine tests never run at once. The other worker takes the CPU-bound tests
# meanwhile (an engine start mostly waits on one core's imports). xdist's own `--dist loadgroup`
# does not group under pytest 9 (it rewrites `item._nodeid`, which pytest 9 no longer reads), so
# the grouping is this scheduler, keyed on node ids (what xdist's controller sees).
# tests/test_conftest.py checks that every `engine` test is in this tier.
ENGINE_FILES = ("tests/engine/", "tests/benchmarks/test_engine_e2e_script.py")


def in_engine_tier(nodeid: str) -> bool:
    return nodeid.startswith(ENGINE_FILES)


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: without it, never called
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if config.getvalue("dist") != "load":
        return None  # an explicit --dist other than the default: xdist's own
    from xdist.scheduler import LoadScopeScheduling

    class EngineTier(LoadScopeScheduling):
        """`load` (one test per unit), except the engine tier: one unit."""

        def _split_scope(self, nodeid: str) -> str:
            return "engine-tier" if in_engine_tier(nodeid) else nodeid

    return EngineTier(config, log)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    """The shared data folder; raises FileNotFoundError (test error, not skip) if it is missing."""
    return _data_dir()


# --- real HTTP servers (tests/serve, tests/engine) ---------------------------------------------
# Real HTTP servers for the serve tests: uvicorn on a free loopback port, in a background thread.
#
# `stub_server(...)` serves `presched.serve.stub.StubEngine`, a TEST DOUBLE of an inference engine
# (exact output lengths at a fixed `token_s` per token, `max_concurrency` slots). The HTTP stack
# (uvicorn, sockets, SSE framing, keep-alive) is real; only the engine behind it is a stand-in.
# The tests against a real engine (vLLM on the CPU) are in tests/engine.
#
# `asgi_server(app)` serves any ASGI app the same way (the gateway's app, a failing upstream).
# Every server started by a test is stopped when the test ends.


@pytest.fixture
def asgi_server():
    """Factory: `asgi_server(app) -> base URL` (http://127.0.0.1:PORT, uvicorn, own thread)."""
    started: list[tuple[uvicorn.Server, threading.Thread]] = []

    def start(app) -> str:
        config = uvicorn.Config(app, host="127.0.0.1", port=0, log_level="warning", lifespan="auto",
                                timeout_graceful_shutdown=1)  # fmt: skip
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, name="uvicorn-test", daemon=True)
        thread.start()
        deadline = time.monotonic() + 10
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        started.append((server, thread))
        port = server.servers[0].sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    yield start
    for server, _ in started:
        server.should_exit = True
    for _, thread in started:
        thread.join(timeout=5)


@pytest.fixture
def stub_server(asgi_server):
    """Factory: `stub_server(token_s=0.0, max_concurrency=..., ttft_s=0.0, model="stub")` ->
    (base URL, the StubEngine it serves), over real HTTP."""

    def start(**kwargs) -> tuple[str, StubEngine]:
        engine = StubEngine(**kwargs)
        return asgi_server(engine.app()), engine

    return start
