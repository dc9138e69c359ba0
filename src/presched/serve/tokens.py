"""Prompt text and prompt token counts of OpenAI request bodies.

Counting, best first: the served model's own `tokenizer.json` (exact for that model), o200k_base
from `toktok` (installed with presched[predict]; close for modern models), else ~4 characters
per token. Chat prompts count every message's text plus 4 tokens per message for the template
(the same approximation OpenAI documents); a template-exact count needs the model's template.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable


def counter(tokenizer: Path | None = None) -> tuple[Callable[[str], int], str]:
    """(count(text) -> tokens, description)."""
    if tokenizer is not None:
        from presched.workload.prefix import load_tokenizer

        tok = load_tokenizer(tokenizer)  # a UserError naming the file if it is none
        return (lambda s: len(tok.encode(s, add_special_tokens=False).ids)), f"tokenizer {tokenizer}"
    try:
        import toktok

        enc = toktok._encoding("o200k_base")
        return enc.count, "o200k_base (toktok)"
    except Exception:  # noqa: BLE001 - optional dependency
        return (lambda s: max(1, (len(s) + 3) // 4)), "~4 characters per token"


def encoder(tokenizer: Path | None = None) -> tuple[Callable[[str], list[int]], str]:
    """(encode(text) -> token ids, description), the same choice as `counter`: the workloads'
    `workload.prefix.text_encoder`, so a prompt hashes the same in the gateway and in a
    simulated workload (`prompt_hashes`)."""
    from presched.workload.prefix import text_encoder

    return text_encoder(tokenizer)


def prompt_hashes(ids: list[int], block_tokens: int, max_blocks: int = 0) -> tuple[int, ...]:
    """The prompt's prefix-cache block hashes: `workload.prefix.chain_hashes` of its token ids,
    the one hash every driver uses (at most `max_blocks` blocks; 0 = all)."""
    from presched.workload.prefix import chain_hashes

    return chain_hashes(ids, block_tokens, limit=max_blocks or None)


MAX_TOKEN_ID = 2**31 - 1
"""Largest token id accepted in a prompt sent as ids (vocabularies are far smaller)."""


def _text(s: str, field: str) -> str:
    """`s` if it is valid Unicode; JSON's "\\ud800" escapes can make lone surrogates, which no
    tokenizer, engine or SQLite can encode."""
    try:
        s.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"{field}: not valid Unicode (a lone surrogate {s[e.start]!r} at "
                         f"character {e.start})") from None  # fmt: skip
    return s


def prompt_text(body: dict[str, Any], chat: bool) -> tuple[str, int, list[int] | None]:
    """(text, number of messages, token ids if the client sent ids instead of text).

    Raises ValueError naming the field when the prompt is missing or malformed (also: text that
    is not valid Unicode, token ids outside [0, MAX_TOKEN_ID])."""
    if chat:
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise ValueError("messages: required, a non-empty list of {role, content}")
        parts = []
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise ValueError(f"messages[{i}]: expected an object with a string 'role'")
            c = m.get("content")
            if isinstance(c, str):
                parts.append(_text(c, f"messages[{i}].content"))
            elif isinstance(c, list):
                for j, p in enumerate(c):
                    if not isinstance(p, dict):
                        raise ValueError(f"messages[{i}].content[{j}]: expected an object")
                    if p.get("type") == "text":
                        if not isinstance(p.get("text"), str):
                            raise ValueError(f"messages[{i}].content[{j}].text: expected a string")
                        parts.append(_text(p["text"], f"messages[{i}].content[{j}].text"))
            elif c is not None:
                raise ValueError(f"messages[{i}].content: expected a string, a list of parts or null")
        return "\n".join(parts), len(msgs), None
    p = body.get("prompt")
    if isinstance(p, str):
        return _text(p, "prompt"), 0, None
    if isinstance(p, list) and p and all(isinstance(x, str) for x in p):
        if len(p) > 1:
            raise ValueError("prompt: batched prompts (a list of several) are not supported; send one request each")
        return _text(p[0], "prompt"), 0, None
    if isinstance(p, list) and p and all(isinstance(x, int) and not isinstance(x, bool) for x in p):
        if not 0 <= min(p) <= max(p) <= MAX_TOKEN_ID:
            raise ValueError(f"prompt: token ids must be in [0, {MAX_TOKEN_ID}]")
        return "", 0, p
    raise ValueError("prompt: required, a string (or a list of token ids)")
