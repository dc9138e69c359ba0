"""Token counting for loaders that only have text (ShareGPT, generic files with `prompt`).

The default is a deliberately simple, dependency-free approximation: about 4 characters per
token, `max(1, round(len(text) / 4))`, which is the usual rule of thumb for English text with
BPE tokenizers of the Llama/GPT families. It is not any model's tokenizer; pass your own
`count_tokens` callable (e.g. `lambda s: len(tok.encode(s))`) when exact counts matter.
"""

from __future__ import annotations

from collections.abc import Callable

TokenCounter = Callable[[str], int]


def approx_tokens(text: str) -> int:
    """About 4 characters per token, at least 1: `max(1, round(len(text) / 4))`."""
    return max(1, round(len(text) / 4))
