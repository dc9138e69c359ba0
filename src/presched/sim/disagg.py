"""A prefill/decode-disaggregated cluster (DistServe, Splitwise, vLLM disaggregated prefill).

P prefill instances and D decode instances, each an ordinary `Instance` with its own scheduler,
KV cache and policy, behind two routers:

1. A request arrives and the prefill router picks a prefill instance. There it waits, prefills
   (chunked, batched with other prompts) and samples its first token: TTFT is measured there.
   It stops after that token (`seq.stop = 1`) and frees its blocks.
2. Its prompt KV (prompt_tokens x the model's kv_bytes_per_token) travels to the decode side:
   it arrives `latency + bytes / bandwidth` seconds after the first token (a "handoff").
3. At the handoff the decode router picks a decode instance, which queues the request with its
   prompt KV present (vLLM's KV-connector semantics: computed = prompt tokens). Its first step
   there allocates blocks for prompt + 1 tokens and feeds the first token (a decode), sampling
   the second; it then decodes to its true length. The gap between the first and the second
   token includes the transfer. A request preempted on a decode instance loses that KV and
   recomputes prompt and generated tokens locally (vLLM re-prefills; it does not re-fetch).
   A request of one output token is done on the prefill instance and sends nothing.

Event loop: arrivals (sorted by (arrival, position)) and handoffs (a heap of (time, position)).
Before delivering the arrival at t, every prefill instance runs the steps that start before t;
their new finishes become handoffs; the handoffs due at or before t are delivered first, each
after the decode instances ran the steps that start before it (so a decode instance gets new
requests only at handoffs, and lazy decode runs survive handoffs routed elsewhere, as in
`Cluster`). Ties are broken by workload position: deterministic.

Simplifications (docs/simulator.md): the decode router decides when the KV is ready, not when
the prefill returns; a handed-over request waits for admission with its KV outside the decode
instance's block pool (vLLM allocates the blocks first, then pulls the KV into them); transfers do
not share links (no contention); the prefill instance frees a request's blocks at its first token
(vLLM keeps them until the decode side has read them).
"""

from __future__ import annotations

import heapq
import math
import time
from typing import Callable, Sequence

from presched.schedule.interface import Policy
from presched.schedule.routers.interface import Router
from presched.sim.cluster import make_seqs
from presched.sim.config import EngineConfig
from presched.sim.instance import Instance
from presched.sim.result import SimResult
from presched.sim.seq import Seq
from presched.sim.steptime.base import StepTimeModel
from presched.workload.request import Request


class DisaggCluster:
    def __init__(
        self,
        prefill_engine: EngineConfig,
        decode_engine: EngineConfig,
        prefill_blocks: int,
        decode_blocks: int,
        step_model: StepTimeModel,
        policy_factory: Callable[[], Policy],
        prefill_router: Router | None = None,
        decode_router: Router | None = None,
        num_prefill: int = 1,
        num_decode: int = 1,
        kv_bytes_per_token: float = 0.0,
        transfer_bandwidth: float = math.inf,
        transfer_latency: float = 0.0,
        fast_forward: bool = True,
    ) -> None:  # fmt: skip
        """`transfer_bandwidth` in bytes/s and `transfer_latency` in seconds: a handoff comes
        `transfer_latency + prompt_tokens * kv_bytes_per_token / transfer_bandwidth` after the
        first token. A pool of more than one instance needs its router."""
        for name, n, router in (("num_prefill", num_prefill, prefill_router),
                                ("num_decode", num_decode, decode_router)):  # fmt: skip
            if n < 1:
                raise ValueError(f"field '{name}': must be >= 1, got {n}")
            if n > 1 and router is None:
                kind = name.removeprefix("num_")
                raise ValueError(f"field '{kind}_router': required with more than one {kind} instance")
        for name, v in (("kv_bytes_per_token", kv_bytes_per_token),
                        ("transfer_latency", transfer_latency)):  # fmt: skip
            if not (v >= 0 and math.isfinite(v)):
                raise ValueError(f"field '{name}': must be a finite number >= 0, got {v}")
        if not transfer_bandwidth > 0:
            raise ValueError(f"field 'transfer_bandwidth': must be > 0, got {transfer_bandwidth}")

        self.prefill_router = prefill_router if num_prefill > 1 else None
        self.decode_router = decode_router if num_decode > 1 else None

        def pool(first: int, n: int, engine: EngineConfig, blocks: int, router) -> list[Instance]:
            lazy = router is None or not router.needs_progress
            return [Instance(first + i, engine, blocks, policy_factory(), step_model,
                             fast_forward, lazy) for i in range(n)]  # fmt: skip

        self.prefill = pool(0, num_prefill, prefill_engine, prefill_blocks, self.prefill_router)
        self.decode = pool(num_prefill, num_decode, decode_engine, decode_blocks,
                           self.decode_router)  # fmt: skip
        self.instances = self.prefill + self.decode  # global index = position here
        self.kv_bytes_per_token = kv_bytes_per_token
        self.transfer_bandwidth = transfer_bandwidth
        self.transfer_latency = transfer_latency

    def transfer_time(self, seq: Seq) -> float:
        """Seconds from its first token to its prompt KV on the decode side."""
        kv_bytes = seq.prompt_tokens * self.kv_bytes_per_token
        return self.transfer_latency + kv_bytes / self.transfer_bandwidth

    def run(
        self, requests: Sequence[Request], progress: Callable[[int], None] | None = None,
        estimates=None,
    ) -> SimResult:  # fmt: skip
        """Simulate all requests to completion (arguments as `Cluster.run`)."""
        seqs = make_seqs(requests, estimates)
        prefill, router = self.prefill, self.prefill_router
        wall = time.perf_counter()
        self._handoffs: list[tuple[float, int, Seq]] = []
        self._pdone = [0] * len(prefill)
        self._ddone = [0] * len(self.decode)
        self._kv_bytes = 0.0
        handoffs = self._handoffs
        for n, seq in enumerate(seqs):
            t = seq.arrival
            for inst in prefill:
                inst.advance(t)
            self._collect_prefills()
            while handoffs and handoffs[0][0] <= t:
                self._deliver(*heapq.heappop(handoffs))
            target = prefill[0] if router is None else prefill[router.route(seq, prefill, t)]
            seq.stop = 1
            target.add(seq, t)
            seq.prefill_instance = target.index
            if progress is not None and n % 1024 == 1023:
                progress(n + 1)
        for inst in prefill:
            inst.advance(math.inf)
        self._collect_prefills()
        while handoffs:
            self._deliver(*heapq.heappop(handoffs))
        for inst in self.decode:
            inst.advance(math.inf)
        self._report_decodes()
        wall = time.perf_counter() - wall
        if progress is not None:
            progress(len(seqs))
        roles = ["prefill"] * len(prefill) + ["decode"] * len(self.decode)
        return SimResult.from_instances(seqs, self.instances, wall, roles, self._kv_bytes)

    def _collect_prefills(self) -> None:
        """Turn the prefill instances' new finishes into handoffs (and tell their router)."""
        router = self.prefill_router
        hook = router is not None and type(router).on_finish is not Router.on_finish
        for j, inst in enumerate(self.prefill):
            fin = inst.finished
            if len(fin) == self._pdone[j]:
                continue
            for seq in fin[self._pdone[j]:]:
                if hook:
                    router.on_finish(seq, j, seq.finish)  # type: ignore[union-attr]
                if seq.generated < seq.target:
                    self._kv_bytes += seq.prompt_tokens * self.kv_bytes_per_token
                    ready = seq.finish + self.transfer_time(seq)
                    heapq.heappush(self._handoffs, (ready, seq.index, seq))
            self._pdone[j] = len(fin)

    def _deliver(self, t: float, _: int, seq: Seq) -> None:
        """The prompt KV of `seq` is ready at `t`: a decode instance takes the request."""
        decode, router = self.decode, self.decode_router
        for inst in decode:
            inst.advance(t)
        seq.stop = seq.target
        seq.finish = None
        seq.computed = seq.prompt_tokens  # its KV arrived (the first token's KV is not yet)
        seq.kv_ready = t
        if router is None:
            target = decode[0]
        else:
            self._report_decodes()
            target = decode[router.route(seq, decode, t)]
        target.add(seq, t)

    def _report_decodes(self) -> None:
        router = self.decode_router
        if router is None or type(router).on_finish is Router.on_finish:
            return
        for j, inst in enumerate(self.decode):
            fin = inst.finished
            for seq in fin[self._ddone[j]:]:
                router.on_finish(seq, j, seq.finish)
            self._ddone[j] = len(fin)
