"""`Seq`: the simulator's mutable state of one request inside one engine instance.

Token accounting follows vLLM v1: a request has `num_tokens = prompt + generated` tokens; each
step computes KV for some of them (`computed` catches up to `num_tokens`); when a step brings
`computed` to `num_tokens`, the step samples one new token. Preemption by recompute sets
`computed` back to 0, so the prompt and every generated token are prefilled again.

`stop` is the output length at which the request leaves the instance it is on: its true length
`target` on a colocated or decode instance, 1 on a prefill instance of a disaggregated cluster
(see disagg.py), which hands it over after its first token. Schedulers stop on `stop`; oracle
policies read `target`.
"""

from __future__ import annotations

from typing import Any

from presched.workload.request import Request

WAITING, RUNNING, FINISHED = 0, 1, 2
NEVER = 2**30 - 1
"""`next_unit_end` of a request with no unit to insert: `computed` never reaches it (prefix caching
refuses instances of NEVER KV tokens or more; the scheduler, requests that need more KV than the
instance has). An int of one 30-bit digit, not `math.inf` nor `sys.maxsize`: Python 3.11 compares
two such ints on its fast path (`COMPARE_OP_INT_JUMP`), so the per-request, per-step
`computed >= next_unit_end` costs ~100 instructions less than with `sys.maxsize` (two digits)."""


class Seq:
    __slots__ = (
        "request", "id", "index", "arrival", "prompt_tokens", "target", "stop", "tenant",
        "generated", "computed", "blocks", "status", "instance", "estimate",
        "first_scheduled", "first_token", "last_token", "finish",
        "preemptions", "recomputed_tokens", "max_itl", "prefill_instance", "kv_ready",
        "keys", "unit_tokens", "cache_node", "cached_upto", "next_unit_end", "cached_tokens",
    )  # fmt: skip

    def __init__(self, request: Request, index: int) -> None:
        self.request = request
        self.id = request.id
        self.index = index  # position in the workload: deterministic tie-breaks
        self.arrival = request.arrival
        self.prompt_tokens = request.prompt_tokens
        self.target = request.target_tokens  # true length; only oracle policies may read it
        self.stop = self.target  # leaves this instance at this many output tokens
        self.tenant = request.tenant
        self.generated = 0
        self.computed = 0
        self.blocks = 0
        self.status = WAITING
        self.instance = -1
        self.estimate: Any = None
        self.first_scheduled: float | None = None
        self.first_token: float | None = None
        self.last_token: float | None = None
        self.finish: float | None = None
        self.preemptions = 0
        self.recomputed_tokens = 0  # tokens prefilled again because of preemptions
        self.max_itl = 0.0
        self.prefill_instance = -1  # disaggregated: the prefill instance (`instance`: decode)
        self.kv_ready: float | None = None  # disaggregated: time its prompt KV reached decode
        # prefix caching (sim/prefix_cache.py; set by the instance's block manager)
        self.keys: tuple[int, ...] = ()  # cache keys of its units
        self.unit_tokens = 0  # tokens per unit
        self.cache_node = None  # deepest cache tree node it holds (and so every ancestor)
        self.cached_upto = 0  # units [0, cached_upto) are cached and held
        self.next_unit_end = NEVER  # `computed` at which the next unit is full
        self.cached_tokens = 0  # prompt tokens found cached, over all its admissions

    @property
    def num_tokens(self) -> int:
        return self.prompt_tokens + self.generated

    def __repr__(self) -> str:
        return (f"Seq({self.id!r}, prompt={self.prompt_tokens}, gen={self.generated}/"
                f"{self.target}, computed={self.computed}, blocks={self.blocks}, "
                f"status={self.status})")
