"""The `Request` record: one LLM request as every part of presched sees it.

A request is immutable. Drivers keep their own mutable state beside it (the simulator's
`sim.seq.Seq`, the gateway's in-flight record); loaders, arrival processes and composition make
new records with `dataclasses.replace`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any


class InvalidRequestError(ValueError):
    """A request field has a bad value; the message names the field."""


@dataclass(frozen=True, slots=True)
class Request:
    """One request.

    Times are seconds; token counts are tokens of the served model's tokenizer where known.
    """

    id: str
    prompt_tokens: int
    arrival: float = 0.0
    output_tokens: int | None = None
    """True output length when known (trace replay, datasets). The simulator generates exactly
    `min(output_tokens, max_tokens)` tokens; a request without it cannot be simulated."""
    max_tokens: int | None = None
    tenant: str = "default"
    model: str = ""
    prompt: str | None = None
    output_samples: tuple[int, ...] = ()
    """Other observed output lengths of the same prompt (CASTILLO has 10 per prompt and model)."""
    slo_ttft: float | None = None
    slo_tpot: float | None = None
    slo_e2e: float | None = None
    block_hashes: tuple[int, ...] = ()
    """Prefix-cache identities of the request's first full blocks of `hash_block_tokens` tokens
    each (prompt first, then output; a chain hash: equal values = equal tokens from the start
    through that block). Only full blocks: a loader drops the partial last one. Mooncake's
    `hash_ids`; `workload/prefix.py` makes them from token ids. Empty: nothing to share."""
    hash_block_tokens: int = 0
    """Tokens per entry of `block_hashes` (Mooncake: 512); 0 when there are none."""
    metadata: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            _bad("id", self.id, "a non-empty string")
        _check_int("prompt_tokens", self.prompt_tokens, minimum=1)
        if not isinstance(self.arrival, (int, float)) or not math.isfinite(self.arrival) or self.arrival < 0:
            _bad("arrival", self.arrival, "a finite number of seconds >= 0")
        if self.output_tokens is not None:
            _check_int("output_tokens", self.output_tokens, minimum=1)
        if self.max_tokens is not None:
            _check_int("max_tokens", self.max_tokens, minimum=1)
        for name in ("slo_ttft", "slo_tpot", "slo_e2e"):
            v = getattr(self, name)
            if v is not None and (not isinstance(v, (int, float)) or not v > 0):
                _bad(name, v, "a positive number of seconds")
        if self.block_hashes:
            _check_int("hash_block_tokens", self.hash_block_tokens, minimum=1)
            if not isinstance(self.block_hashes, tuple):
                _bad("block_hashes", self.block_hashes, "a tuple of integers")

    @property
    def target_tokens(self) -> int:
        """Tokens the request will generate: its true length capped by `max_tokens`."""
        if self.output_tokens is None:
            raise InvalidRequestError(
                f"request {self.id!r}: output_tokens is unknown, so its length cannot be replayed"
            )
        if self.max_tokens is None:
            return self.output_tokens
        return min(self.output_tokens, self.max_tokens)


def _bad(name: str, value: Any, want: str) -> None:
    raise InvalidRequestError(f"field {name!r}: got {value!r}, expected {want}")


def _check_int(name: str, value: Any, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        _bad(name, value, f"an integer >= {minimum}")
