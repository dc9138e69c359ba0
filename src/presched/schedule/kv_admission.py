"""`kv-admission` — admit a request only if the predicted KV footprint of the batch fits.

The inner policy orders the waiting queue; this wrapper gates its head. With q_r the
`quantile` (default 0.9) of request r's predicted output length, g_r the tokens it generated so
far and p_r its prompt, the head c starts only if

    sum over running r of F(r)  +  F(c)  <=  headroom * kv_tokens,
    F(r) = block_size * ceil((p_r + max(q_r, g_r + 1)) / block_size)

i.e. the memory every request will hold at its predicted end (the seed's constraint
sum (prompt_i + L_i) * M_token <= M_KV, rounded up to whole KV blocks as the engine allocates
them). A request that outlives its quantile is charged its current size plus one token
(max(q, g + 1)), so the sum stays an upper bound of what the batch holds now. If every true
length is <= its quantile and headroom <= 1, the running batch never runs out of KV blocks, so
there are no preemptions. If nothing runs, the head is always admitted (no deadlock).

Cost: the sum is kept incrementally (on_schedule / on_tokens / on_preempt / on_finish, O(1)
each; on_tokens moves F(r) exactly as g_r passes q_r), so `admit` is O(1). q_r is read from
`seq.estimate` when r is admitted. While the running requests only decode the sum never shrinks,
so a refusal stays a refusal until a completion (what the simulator's fast-forward assumes).

Inputs: `seq.estimate` (a quantile), `EngineInfo.kv_tokens` and `block_size` (attach).
Config: `inner` ("fcfs"), `inner_params`, `quantile` (0.9), `headroom` (1.0, > 0; < 1 leaves
slack for requests that outlive their quantile), `kv_tokens` (None = the engine's; set it when
the engine does not report its capacity).

    POLICIES.create("kv-admission", inner="sjf-oracle", quantile=0.95, headroom=0.9)
"""

from __future__ import annotations

import math
from typing import Any

from presched.schedule.interface import EngineInfo
from presched.schedule.lengths import estimate_of
from presched.schedule.registry import POLICIES
from presched.schedule.wrapper import Wrapper


@POLICIES.register("kv-admission")
class KVAdmission(Wrapper):
    name = "kv-admission"

    def __init__(
        self,
        inner: str = "fcfs",
        inner_params: dict[str, Any] | None = None,
        quantile: float = 0.9,
        headroom: float = 1.0,
        kv_tokens: int | None = None,
    ) -> None:
        super().__init__(inner, inner_params)
        if not isinstance(quantile, (int, float)) or not 0 < quantile < 1:
            raise ValueError(f"field 'quantile': must be in (0, 1), got {quantile!r}")
        if not isinstance(headroom, (int, float)) or not headroom > 0:
            raise ValueError(f"field 'headroom': must be > 0, got {headroom!r}")
        if kv_tokens is not None and (isinstance(kv_tokens, bool) or not isinstance(kv_tokens, int)
                                      or kv_tokens < 1):  # fmt: skip
            raise ValueError(f"field 'kv_tokens': must be a positive integer, got {kv_tokens!r}")
        self.quantile = float(quantile)
        self.headroom = float(headroom)
        self.kv_tokens = kv_tokens
        self.block_size = 1
        self.limit = float("inf")
        self.footprint = 0  # sum of F(r) over the running requests
        self._running: dict[int, tuple[float, int]] = {}  # id(seq) -> (q, F)

    def attach(self, engine: EngineInfo) -> None:
        kv = self.kv_tokens if self.kv_tokens is not None else engine.kv_tokens
        if kv is None:
            raise ValueError(
                "field 'kv_tokens': the engine does not report its KV capacity; set it"
            )
        self.kv_tokens = kv
        self.block_size = max(int(engine.block_size), 1)
        self.limit = self.headroom * kv
        self.inner.attach(engine)

    def _size(self, seq, q: float) -> int:
        """F(seq): prompt + max(q, g + 1) tokens, rounded up to whole blocks."""
        bs = self.block_size
        return math.ceil((seq.prompt_tokens + max(q, seq.generated + 1)) / bs) * bs

    def predicted_size(self, seq) -> int:
        """F(seq) for a request that is not running (the head of the queue)."""
        return self._size(seq, estimate_of(seq).quantile(self.quantile))

    def admit(self, seq, running, now):
        if running and self.footprint + self.predicted_size(seq) > self.limit:
            return False
        return self.inner.admit(seq, running, now)

    def on_schedule(self, seq, now):
        q = estimate_of(seq).quantile(self.quantile)
        f = self._size(seq, q)
        self._running[id(seq)] = (q, f)
        self.footprint += f
        self.inner.on_schedule(seq, now)

    def on_tokens(self, seq, num_tokens, now):
        entry = self._running.get(id(seq))
        if entry is not None:
            q, f = entry
            if seq.generated + 1 > q:  # outlived its quantile: F grows with g
                new = self._size(seq, q)
                if new != f:
                    self._running[id(seq)] = (q, new)
                    self.footprint += new - f
        self.inner.on_tokens(seq, num_tokens, now)

    def _drop(self, seq) -> None:
        entry = self._running.pop(id(seq), None)
        if entry is not None:
            self.footprint -= entry[1]

    def on_preempt(self, seq, now):
        self._drop(seq)
        self.inner.on_preempt(seq, now)

    def on_finish(self, seq, now):
        self._drop(seq)
        self.inner.on_finish(seq, now)

    def on_cancel(self, seq, now):
        self._drop(seq)
        self.inner.on_cancel(seq, now)
