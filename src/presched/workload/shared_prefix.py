"""Shared prefixes for any workload: system prompts and multi-turn conversations, with block
hashes (`workload/prefix.py`) so that the simulator's prefix cache and prefix-aware routers
have something to share.

    WorkloadConfig(shared_prefix=SharedPrefixConfig(system_prompts=8, mean_turns=3))

Each request's own prompt (its `prompt_tokens` new tokens, a user message) gets, in front of it:

- a **system prompt** (with probability `system_prompt_share`, at the start of a conversation):
  one of `system_prompts` prompts of `system_prompt_tokens` tokens, chosen with Zipf popularity
  (exponent `popularity`; 0 = uniform);
- in a **conversation** (`mean_turns` > 1), everything the conversation had so far: the previous
  turn's prompt and its answer (its `output_tokens`). A request is a later turn of an open
  conversation (chosen uniformly) with probability 1 - 1 / mean_turns; otherwise it starts a
  conversation whose number of turns is geometric with mean `mean_turns`. A turn that would
  pass `max_prompt_tokens` starts a new conversation instead.

So `prompt_tokens` grows by the shared part (the load of a workload changes with these options;
compare policies and routers on the same one). Token ids are synthetic (unique ints; a system
prompt's are its own), so only the structure is shared, not any text; the hashes cover prompt
and answer, so a later turn hits the earlier answer too (vLLM caches decode blocks as well).
Arrival times are kept: a later turn may arrive while the earlier one still runs (an open-loop
simplification; real users wait for the answer), and then hits only what is cached by then.
`metadata` gets `conversation`, `turn` (0 = first) and `system_prompt` (-1 = none).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np
from pydantic import Field

from presched.config import Config
from presched.workload.prefix import DEFAULT_BLOCK_TOKENS, chain_hashes
from presched.workload.request import Request

_FRESH = 1 << 40  # first synthetic token id of request contents (upwards)
_SYS = 1 << 32  # system prompt j's ids: -(j + 1) * _SYS upwards, below 0 and disjoint from the
# contents' (as positive ids they met the contents' from j = 255 on: false shared prefixes)


class SharedPrefixConfig(Config):
    """System prompts and multi-turn conversations added in front of every request's prompt."""

    system_prompts: int = Field(0, ge=0, le=1_000_000, description="Distinct shared system prompts (0 = none).")
    system_prompt_tokens: int = Field(1024, ge=1, le=1_000_000, description="Tokens of each system prompt.")
    system_prompt_share: float = Field(1.0, ge=0, le=1, description="Share of conversations that start with a system prompt.")
    popularity: float = Field(1.0, ge=0, description="Zipf exponent of system-prompt popularity: prompt j is chosen with weight 1/(j+1)^popularity (0 = uniform).")
    mean_turns: float = Field(1.0, ge=1, description="Mean turns per conversation (geometric); > 1: a later turn's prompt is the conversation so far (earlier prompt and answer) plus its own message.")
    max_prompt_tokens: int = Field(32768, ge=1, description="A turn whose prompt would be longer starts a new conversation instead.")
    block_tokens: int = Field(DEFAULT_BLOCK_TOKENS, ge=1, description="Tokens per hashed block (a multiple or divisor of the engine's block_size).")


def add_shared_prefixes(
    requests: Sequence[Request], cfg: SharedPrefixConfig, seed: int = 0
) -> list[Request]:
    """`requests` (in arrival order) with shared prefixes and block hashes (see module doc)."""
    rng = np.random.default_rng([2, seed])
    weights = 1.0 / np.arange(1, cfg.system_prompts + 1) ** cfg.popularity
    weights = weights / weights.sum() if cfg.system_prompts else weights
    follow = 1.0 - 1.0 / cfg.mean_turns
    fresh = _FRESH
    open_convs: list[list] = []  # [conversation id, tokens so far, turns left, turn, system
    # prompt, block hashes of the tokens so far]
    sys_hashes: dict[int, tuple[int, ...]] = {}
    bt = cfg.block_tokens
    n_convs = 0
    out = []
    for r in requests:
        answer = r.target_tokens if r.output_tokens is not None else 0
        conv = None
        if open_convs and follow > 0 and rng.random() < follow:
            k = int(rng.integers(len(open_convs)))
            if len(open_convs[k][1]) + r.prompt_tokens <= cfg.max_prompt_tokens:
                conv = open_convs[k]
        if conv is None:
            sys_j = -1
            history: list[int] = []
            if cfg.system_prompts and rng.random() < cfg.system_prompt_share:
                sys_j = int(rng.choice(cfg.system_prompts, p=weights))
                base = -(sys_j + 1) * _SYS
                history = list(range(base, base + cfg.system_prompt_tokens))
                if sys_j not in sys_hashes:
                    sys_hashes[sys_j] = chain_hashes(history, bt)
            turns = int(rng.geometric(1.0 / cfg.mean_turns)) if cfg.mean_turns > 1 else 1
            conv = [n_convs, history, turns, -1, sys_j, sys_hashes.get(sys_j, ())]
            n_convs += 1
            if turns > 1:
                open_convs.append(conv)
        conv[3] += 1
        own = list(range(fresh, fresh + r.prompt_tokens))
        reply = list(range(fresh + r.prompt_tokens, fresh + r.prompt_tokens + answer))
        fresh += r.prompt_tokens + answer
        prompt = conv[1] + own
        tokens = prompt + reply
        hashes = _extend(conv[5], len(conv[1]), tokens, bt)
        out.append(dataclasses.replace(
            r, prompt_tokens=len(prompt), block_hashes=hashes, hash_block_tokens=bt,
            metadata={**r.metadata, "conversation": conv[0], "turn": conv[3], "system_prompt": conv[4]},
        ))  # fmt: skip
        conv[1] = tokens
        conv[5] = hashes
        conv[2] -= 1
        if conv[2] <= 0:
            open_convs = [c for c in open_convs if c is not conv]
    return out


def _extend(shared: tuple[int, ...], shared_tokens: int, tokens: list[int], bt: int) -> tuple[int, ...]:
    """`chain_hashes(tokens, bt)` for `tokens` that start with the `shared_tokens` tokens whose
    hashes are `shared`: those of their full blocks are reused, the same int objects (equal
    values; requests that share a prefix then share its keys in memory, which the simulator's
    prefix cache compares), and the chain goes on from the last of them."""
    full = shared_tokens // bt
    if not full:
        return chain_hashes(tokens, bt)
    return shared[:full] + chain_hashes(tokens[full * bt :], bt, parent=shared[full - 1])
