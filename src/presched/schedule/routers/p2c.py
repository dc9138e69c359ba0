"""`p2c-work`: power of d choices on predicted work (Mitzenmacher, "The Power of Two Choices in
Randomized Load Balancing", IEEE TPDS 2001).

Per arrival, sample `d` distinct instances uniformly (seeded RNG; among the `allowed` ones) and
send the request to the one with the least predicted outstanding work, `work(i)` of `least-work`
(expected remaining tokens with progressive refinement, plus weighted prefill; see
`least_work.py`). Ties: lowest index.

Why: it reads the load of d instances instead of all N (O(d x running) per route), and with stale
load reports (a gateway polling its engines) it avoids the herding of least-work, which sends
every arrival of a stale interval to the same instance; d = 2 already gives most of the gain over
random routing. With N <= d it is least-work.

Inputs: as `least-work`. Config: `d` (choices, default 2), `seed` (default 0), and the options
of `least-work` (`stat`, `prompt_weight`, `prior_output_tokens`).
Example: `presched simulate -i 8 --router p2c-work --set sim.router_params.d=3`
"""

from __future__ import annotations

import random
from typing import Any

from pydantic import Field

from presched.schedule.routers.interface import ROUTERS, positions
from presched.schedule.routers.least_work import LeastWork, LeastWorkParams


class P2CParams(LeastWorkParams):
    d: int = Field(2, ge=1, le=1_000_000, description="Instances sampled per request (all of them when there are at most d).")
    seed: int = Field(0, ge=0, le=2**32 - 1, description="Seed of the sampling.")


@ROUTERS.register("p2c-work")
class PowerOfChoicesWork(LeastWork):
    name = "p2c-work"

    Params = P2CParams
    params: P2CParams

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.d = self.params.d
        self._rng = random.Random(self.params.seed)

    def route(self, seq, instances, now, allowed=None) -> int:
        cand = positions(instances, allowed)  # sampled among the allowed instances
        choices = cand if len(cand) <= self.d else sorted(self._rng.sample(cand, self.d))
        i = min(choices, key=lambda i: self.work(instances[i], i))
        self.routed(seq, i)
        return i
