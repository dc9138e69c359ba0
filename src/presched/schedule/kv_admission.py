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
`admit` sums F over the `running` it is given when that is not the whole batch (O(n)): the
simulator asks whether the head would start once the victims it means to preempt are gone.

A head that `admit` refused is not preempted for (`preempt_for` answers None for it, whatever
the inner policy would say) until the batch changes (an arrival, admission, preemption,
completion or cancellation): the KV the running requests take while they decode can turn a head
that fitted (and was refused) into one that does not fit, which would have the inner policy
preempt for a request this wrapper keeps out; and the fast-forwarding simulator needs a refusal
to stay a refusal while requests only decode.

Inputs: `seq.estimate` (a quantile), `EngineInfo.kv_tokens` and `block_size` (attach).
Config (`KVAdmissionParams`): `inner` ("fcfs"), `inner_params`, `quantile` (0.9), `headroom` (1.0, > 0; < 1 leaves
slack for requests that outlive their quantile), `kv_tokens` (None = the engine's; set it when
the engine does not report its capacity).

    POLICIES.create("kv-admission", inner="sjf-oracle", quantile=0.95, headroom=0.9)
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import Field

from presched.schedule.interface import EngineInfo
from presched.schedule.lengths import estimate_of
from presched.schedule.registry import POLICIES
from presched.schedule.wrapper import Wrapper, WrapperParams


class KVAdmissionParams(WrapperParams):
    quantile: float = Field(0.9, gt=0, lt=1, description="Level of the predicted output-length quantile charged per request.")
    headroom: float = Field(1.0, gt=0, allow_inf_nan=False, description="Fraction of the KV capacity the predicted footprints may fill (< 1 leaves slack for requests that outlive their quantile, > 1 over-commits on purpose).")
    kv_tokens: int | None = Field(None, ge=1, le=2**40, description="KV capacity in tokens; None: the engine's (set it when the engine does not report it).")


@POLICIES.register("kv-admission")
class KVAdmission(Wrapper):
    name = "kv-admission"
    Params = KVAdmissionParams
    params: KVAdmissionParams

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        p = self.params
        self.quantile = p.quantile
        self.headroom = p.headroom
        self.kv_tokens = p.kv_tokens
        self.block_size = 1
        self.limit = float("inf")
        self.footprint = 0  # sum of F(r) over the running requests
        self._running: dict[int, tuple[float, int]] = {}  # id(seq) -> (q, F)
        self._refused = None  # the head `admit` refused since the batch last changed

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

    def footprint_of(self, running) -> int:
        """Sum of F over `running`: the kept sum for the whole batch, else recomputed from the
        kept F of each request (a batch with victims taken out)."""
        entries = self._running
        if len(running) == len(entries):
            return self.footprint
        return sum(entries[id(r)][1] for r in running if id(r) in entries)

    def admit(self, seq, running, now):
        if running and self.footprint_of(running) + self.predicted_size(seq) > self.limit:
            self._refused = seq
            return False
        return self.inner.admit(seq, running, now)

    def preempt_for(self, candidate, running, now):
        if candidate is self._refused:
            return None  # refused since the batch last changed (see the module doc)
        return self.inner.preempt_for(candidate, running, now)

    def on_arrival(self, seq, now):
        self._refused = None
        self.inner.on_arrival(seq, now)

    def on_schedule(self, seq, now):
        self._refused = None
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
        self._refused = None
        self._drop(seq)
        self.inner.on_preempt(seq, now)

    def on_finish(self, seq, now):
        self._refused = None
        self._drop(seq)
        self.inner.on_finish(seq, now)

    def on_cancel(self, seq, now):
        self._refused = None
        self._drop(seq)
        self.inner.on_cancel(seq, now)
