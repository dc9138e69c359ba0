"""Step-time models: how long one engine step (one forward pass over a batch) takes.

An engine step under continuous batching with chunked prefill processes, in one forward pass,
some prefill chunks (new prompt tokens of requests that are still prefilling or recomputing) and
one token for each decoding request. The simulator describes a step by five numbers and asks the
model for its duration in seconds:

- `prefill_tokens`  P = sum of chunk sizes of the prefilling requests in this step
- `prefill_pairs`   sum over those chunks of the causal attention (query, key) pairs:
                    chunk * (context_before + (chunk + 1) / 2); a whole prompt of n tokens gives
                    n (n + 1) / 2, so 2 * pairs ~ "sum of tokens squared"
- `prefill_context` sum over those chunks of (context_before + chunk): KV tokens the chunk reads
- `num_decode`      B = number of decoding requests (one new token each)
- `decode_context`  C = sum of their context lengths (prompt + generated so far)

The fast path of the simulator advances many decode-only steps at once. During such a run B is
fixed and C grows by B per step, so it needs the duration as a line in C: `decode_line` returns
the time of one decode-only step at context C, its slope in C, and the largest C for which that
line is exact (a roofline switches from memory- to compute-bound there; a fitted linear model
returns infinity). The simulator never extrapolates a line past that limit.
"""

from __future__ import annotations

from abc import ABC, abstractmethod


class StepTimeModel(ABC):
    """Duration of one engine step. Pure function of the step's shape; no state."""

    @abstractmethod
    def step_time(
        self,
        prefill_tokens: int,
        prefill_pairs: float,
        prefill_context: int,
        num_decode: int,
        decode_context: int,
    ) -> float:
        """Seconds for one step with this shape (see the module docstring). Called by the
        simulator for every step that is not part of a decode-only fast-forward."""

    @abstractmethod
    def decode_line(self, num_decode: int, decode_context: int) -> tuple[float, float, float]:
        """For a decode-only step with `num_decode` requests and total context
        `decode_context`: (seconds, d seconds / d context, largest context for which
        `seconds + slope * (c - decode_context)` equals `step_time(0, 0, 0, num_decode, c)`)."""

    def describe(self) -> str:
        """One line for tables and logs."""
        return type(self).__name__
