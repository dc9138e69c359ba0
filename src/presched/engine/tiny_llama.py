"""Build, offline, a tiny random-weight Llama model folder that vLLM can serve.

Nothing can be downloaded from a model hub here, so the real-engine tests serve a model made on
the spot: a byte-level BPE tokenizer (vocabulary 4,096) trained with `tokenizers` on the repo's own
text (README.md and docs/*.md, present in every checkout), wrapped in a
`PreTrainedTokenizerFast` with a ChatML chat template, and a `LlamaForCausalLM` with random weights
(hidden 256, 2 layers, 4 heads, 2 KV heads, head_dim 64, 4,096 positions; ~3.2 M parameters) drawn
with a fixed seed. The output is noise, but the engine's work per token (scheduling, paged KV,
batching, sampling, streaming) is real, which is what scheduling experiments need.

Runs in the ENGINE venv (it needs torch and transformers); the main venv only imports this module
for `is_complete` (torch and transformers are imported inside functions):

    PYTHONPATH=src .venv-engine/bin/python -m presched.engine.tiny_llama --out DIR

Idempotent: a complete DIR (its stamp matches BUILD_VERSION) is left alone. The folder is built
under a temporary name and renamed into place, so a killed build never leaves a half model.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from presched.engine import folder

# Bump when the recipe below changes: `is_complete` then reports old folders as stale.
BUILD_VERSION = 1
VOCAB_SIZE = 4096
SEED = 0
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
ARCH = dict(
    hidden_size=256,
    intermediate_size=512,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=64,
    max_position_embeddings=4096,
    rms_norm_eps=1e-5,
    rope_theta=10000.0,
    tie_word_embeddings=False,
)


def is_complete(out: Path) -> bool:
    """True when `out` holds a finished build at BUILD_VERSION (read from its stamp file)."""
    return folder.is_complete(out, "tiny-llama", BUILD_VERSION)


def training_text() -> list[str]:
    """The repo's own prose in a fixed order: README.md and docs/**/*.md (~220 kB, in every
    checkout and in CI); the presched sources are added only when the docs are missing."""
    pkg = Path(__file__).resolve().parents[1]  # src/presched
    repo = pkg.parents[1]
    files = [repo / "README.md", *sorted((repo / "docs").rglob("*.md"))]
    texts = [f.read_text(encoding="utf-8", errors="replace") for f in files if f.is_file()]
    if sum(map(len, texts)) < 50_000:
        texts += [f.read_text(encoding="utf-8") for f in sorted(pkg.rglob("*.py"))]
    if sum(map(len, texts)) < 50_000:
        raise RuntimeError(f"too little local text to train a tokenizer ({pkg}, {repo})")
    return texts


def build_tokenizer(texts: list[str]):
    """A byte-level BPE tokenizer (VOCAB_SIZE entries, SPECIAL tokens first) as a
    `PreTrainedTokenizerFast` with CHAT_TEMPLATE; eos is <|im_end|>, no BOS is added."""
    # The trainer breaks ties between equally frequent pairs differently from run to run when it
    # runs on several threads; one thread makes the vocabulary reproducible.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ.setdefault("RAYON_NUM_THREADS", "1")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        model_max_length=ARCH["max_position_embeddings"],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build(out: Path, force: bool = False) -> Path:
    """Write the tiny model to `out` (skipped when already complete unless `force`); returns it."""
    out = Path(out)
    if is_complete(out) and not force:
        print(f"tiny-llama: {out} is complete, nothing to do")
        return out
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(1)
    t0 = time.perf_counter()
    tok = build_tokenizer(training_text())
    ids = tok.convert_tokens_to_ids(SPECIAL)
    cfg = LlamaConfig(
        vocab_size=len(tok),
        bos_token_id=ids[0],
        eos_token_id=ids[2],
        pad_token_id=ids[0],
        dtype="float32",
        **ARCH,
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(cfg).to(torch.float32).eval()
    model.generation_config = GenerationConfig(
        bos_token_id=ids[0], eos_token_id=ids[2], pad_token_id=ids[0]
    )
    n_params = sum(p.numel() for p in model.parameters())
    with folder.staged(out, kind="tiny-llama", version=BUILD_VERSION, vocab=len(tok),
                       params=n_params, seed=SEED, arch=ARCH) as tmp:  # fmt: skip
        tok.save_pretrained(tmp)
        model.save_pretrained(tmp, safe_serialization=True)
    dt = time.perf_counter() - t0
    print(f"tiny-llama: wrote {out} ({n_params / 1e6:.2f} M params, vocab {len(tok)}, {dt:.1f} s)")
    return out


def main(argv: list[str] | None = None) -> int:
    return folder.build_cli(build, __doc__, argv)


if __name__ == "__main__":
    sys.exit(main())
