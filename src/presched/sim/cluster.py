"""A cluster of engine instances behind a router, driven by one event loop.

Events are arrivals; between two arrivals every instance runs (and fast-forwards) on its own.
At an arrival at time t, each instance first executes the steps that start before t, then the
router sees the instances' state and the request joins the chosen instance's waiting queue.
Deterministic: requests are processed in (arrival, workload position) order, and all tie-breaks
are by position, so the same inputs give the same result.
"""

from __future__ import annotations

import math
import time
from typing import Callable, Sequence

from presched.schedule.interface import Policy
from presched.schedule.routers.interface import Router
from presched.sim.config import EngineConfig
from presched.sim.instance import Instance
from presched.sim.result import SimResult
from presched.sim.seq import Seq
from presched.sim.steptime.base import StepTimeModel
from presched.workload.request import Request


class Cluster:
    def __init__(
        self,
        engine: EngineConfig,
        num_blocks: int,
        step_model: StepTimeModel,
        policy_factory: Callable[[], Policy],
        router: Router | None = None,
        num_instances: int = 1,
        fast_forward: bool = True,
    ) -> None:
        if num_instances < 1:
            raise ValueError(f"field 'num_instances': must be >= 1, got {num_instances}")
        if num_instances > 1 and router is None:
            raise ValueError("field 'router': required with more than one instance")
        lazy = router is None or not router.needs_progress
        self.instances = [
            Instance(i, engine, num_blocks, policy_factory(), step_model, fast_forward, lazy)
            for i in range(num_instances)
        ]
        self.router = router

    def run(
        self, requests: Sequence[Request], progress: Callable[[int], None] | None = None,
        estimates=None,
    ) -> SimResult:  # fmt: skip
        """Simulate all requests to completion. `progress(n)` is called every 1024 arrivals.
        `estimates` (a `predict.LengthEstimate`, one row per request, in request order) sets each
        request's `seq.estimate` for policies and routers that read predictions."""
        seqs = make_seqs(requests, estimates)
        insts = self.instances
        router = self.router
        wall = time.perf_counter()
        route_hook = router is not None and type(router).on_finish is not Router.on_finish
        done = [0] * len(insts)
        for n, seq in enumerate(seqs):
            t = seq.arrival
            for inst in insts:
                inst.advance(t)
            if router is None:
                target = insts[0]
            else:
                if route_hook:
                    self._report_finished(done)
                target = insts[router.route(seq, insts, t)]
            target.add(seq, t)
            if progress is not None and n % 1024 == 1023:
                progress(n + 1)
        for inst in insts:
            inst.advance(math.inf)
        if route_hook:
            self._report_finished(done)
        wall = time.perf_counter() - wall
        if progress is not None:
            progress(len(seqs))
        return SimResult.from_instances(seqs, insts, wall)

    def _report_finished(self, done: list[int]) -> None:
        for inst in self.instances:
            fin = inst.finished
            for seq in fin[done[inst.index]:]:
                self.router.on_finish(seq, inst.index, seq.finish)  # type: ignore[union-attr]
            done[inst.index] = len(fin)


def make_seqs(requests: Sequence[Request], estimates=None) -> list[Seq]:
    """One `Seq` per request, in (arrival, workload position) order, with its estimate set."""
    arrivals = [r.arrival for r in requests]
    order = sorted(range(len(requests)), key=arrivals.__getitem__)  # stable: ties by position
    seqs = [Seq(requests[i], i) for i in order]
    if estimates is not None:
        if len(estimates) != len(requests):
            raise ValueError(f"estimates: {len(estimates)} rows for {len(requests)} requests")
        for seq in seqs:
            seq.estimate = estimates[seq.index]
    return seqs
