"""Prefix-cache block hashes for requests: a chain hash over full blocks of token ids.

vLLM's automatic prefix caching names a full block by hash(parent block's hash, the block's
token ids), so equal hashes mean equal tokens from the start of the request through that block;
a partial last block has no hash. `chain_hashes` computes that chain; `with_hashes` attaches it
to a request (`Request.block_hashes`). The simulator, the gateway's routers and the synthetic
workloads all use this one function, so a prompt hashes the same under every driver.

Hashes are Python's `hash` of (parent, tuple of ints): deterministic across processes (ints and
tuples of ints are not salted by PYTHONHASHSEED) and 64-bit on 64-bit builds.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable, Sequence

from presched.workload.request import Request

DEFAULT_BLOCK_TOKENS = 16
"""Tokens per hashed block by default: vLLM's default KV block size."""


def chain_hashes(
    tokens: Sequence[int], block_tokens: int = DEFAULT_BLOCK_TOKENS, parent: int = 0,
    limit: int | None = None,
) -> tuple[int, ...]:  # fmt: skip
    """Hashes of the full blocks of `tokens` (len(tokens) // block_tokens of them), each of its
    parent's hash and its own tokens; `parent` seeds the chain (e.g. a model or tenant salt).
    `limit`: hash at most that many blocks (routers that only look at a prompt's start)."""
    if block_tokens < 1:
        raise ValueError(f"field 'block_tokens': must be >= 1, got {block_tokens}")
    n = len(tokens) // block_tokens
    if limit is not None:
        n = min(n, limit)
    out = []
    h = parent
    for i in range(n):
        h = hash((h, tuple(tokens[i * block_tokens : (i + 1) * block_tokens])))
        out.append(h)
    return tuple(out)


def load_tokenizer(path: Path | str):
    """A `tokenizers.Tokenizer` from a `tokenizer.json`; a `UserError` (the CLI's `error:`,
    exit 2) naming the file and the problem when it is missing or not a tokenizer."""
    from tokenizers import Tokenizer

    from presched.config import UserError

    p = Path(path)
    if not p.is_file():
        raise UserError(f"tokenizer: {p}: {'a folder, not a file' if p.is_dir() else 'file not found'}")
    try:
        return Tokenizer.from_file(str(p))
    except Exception as e:  # noqa: BLE001 - tokenizers raises a bare Exception
        raise UserError(f"tokenizer: {p}: not a tokenizer.json ({e})") from None


def text_encoder(tokenizer: Path | None = None) -> tuple[Callable[[str], list[int]], str]:
    """(encode(text) -> token ids, description): a model's `tokenizer.json` if given, else
    o200k_base (`toktok`, presched[predict]), else pseudo-ids of 4-character pieces (a CRC-32
    each). The ids only name a prompt's blocks for hashing: an approximate tokenizer still gives
    equal ids to equal text, which is all a prefix match needs. The gateway uses this too."""
    if tokenizer is not None:
        tok = load_tokenizer(tokenizer)
        return (lambda s: tok.encode(s, add_special_tokens=False).ids), f"tokenizer {tokenizer}"
    try:
        import toktok

        enc = toktok._encoding("o200k_base")
        return enc.encode_ordinary, "o200k_base (toktok)"
    except Exception:  # noqa: BLE001 - optional dependency
        import zlib

        return (lambda s: [zlib.crc32(s[i:i + 4].encode("utf-8", "surrogatepass"))
                           for i in range(0, len(s), 4)]), "4-character pieces"  # fmt: skip


def hash_prompts(
    requests: Sequence[Request], block_tokens: int = DEFAULT_BLOCK_TOKENS,
    encode: Callable[[str], list[int]] | None = None,
) -> list[Request]:  # fmt: skip
    """Requests with `block_hashes` of their prompt text's token ids (`text_encoder`), cut at
    the request's `prompt_tokens` (a trace counts its prompt with the serving model's tokenizer;
    hashes past it would name the request's output blocks by prompt text); those without text
    are left as they are."""
    encode = encode or text_encoder()[0]
    return [with_hashes(r, encode(r.prompt)[: r.prompt_tokens], block_tokens) if r.prompt else r
            for r in requests]  # fmt: skip


def with_hashes(
    request: Request, tokens: Sequence[int], block_tokens: int = DEFAULT_BLOCK_TOKENS
) -> Request:
    """`request` with `block_hashes` of `tokens` (its prompt's token ids, optionally followed by
    its output's: a later turn of a conversation shares the earlier answer too)."""
    return dataclasses.replace(
        request, block_hashes=chain_hashes(tokens, block_tokens),
        hash_block_tokens=block_tokens,
    )  # fmt: skip
