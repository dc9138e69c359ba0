"""Load-aware routers.

- `least-requests`: the instance with the fewest outstanding (waiting + running) requests
  (Vidur's `lor`, vLLM production-stack's default).
- `least-work`: the instance with the least outstanding work, in tokens:

      work(i) = sum over its unfinished requests r of
                prompt_weight * prompt(r) * 1(no first token yet) + R_r(g_r)

  where g_r is the tokens r generated so far and R_r(g) its expected remaining tokens. With a
  prediction (`seq.estimate`), R_r(g) = E[L_r - g | L_r > g] (`stat="mean"`, progressive
  refinement: a request that outlives its prediction is re-estimated from the tail of its
  distribution instead of counting as nearly done), or another statistic of `schedule/lengths.py`.
  Without one, R_r(g) = max(m - g, 1) with m the running mean of completed requests' lengths at
  this router (prior `prior_output_tokens`). `prompt_weight` converts prefill tokens into
  decode-token equivalents (a prefill token costs far less than a decode step: default 0.1).
- `least-work-oracle`: the same with R_r(g) = L_r - g, the true length (`seq.target`): a bound.

Caveat, measured (docs/policies/routers.md): on engines that run many requests at once, a new
request waits for a free slot, not for the instance's total tokens, and least-work (even with
true lengths) had 8-17 % higher mean E2E than least-requests (4 x 64 slots, 90 % load).

Cost per route: O(running requests of the instances compared), not O(outstanding). The router
keeps, per instance, the sum of its routed, unfinished requests' work as counted at arrival
(updated at `route` and `on_finish`; requests without a prediction are counted apart, times the
current mean). A waiting request's work does not change until it runs, so only running requests
are read, and only for the change since arrival. 4 instances x (64 running + 1000 waiting):
~0.4 ms per route, vs ~4 ms for a scan of every outstanding request. A request preempted back to
the waiting queue counts as at arrival (its prefill is redone; its remaining from its prior).
This reads the first `num_running` entries of `outstanding()`, which lists running requests
first, and assumes the router sees every request routed to an instance and every finish (the
simulator's cluster guarantees both).
"""

from __future__ import annotations

from collections import defaultdict
from itertools import islice

from typing import Any

from pydantic import Field

from presched.schedule.lengths import remaining
from presched.schedule.params import LengthStat, PolicyParams
from presched.schedule.routers.interface import ROUTERS, Router, positions


class LeastWorkParams(PolicyParams):
    stat: LengthStat = Field("mean", description="Statistic of each request's predicted remaining length (a length, so not rank).")
    prompt_weight: float = Field(0.1, ge=0, allow_inf_nan=False, description="Decode-token equivalents of one prompt token still to prefill.")
    prior_output_tokens: float = Field(256.0, ge=1, allow_inf_nan=False, description="Mean output length assumed before any request finished (for requests without a prediction).")


@ROUTERS.register("least-requests")
class LeastRequests(Router):
    name = "least-requests"
    needs_progress = False

    def route(self, seq, instances, now, allowed=None) -> int:
        return min(positions(instances, allowed), key=lambda i: instances[i].num_outstanding)


@ROUTERS.register("least-work")
class LeastWork(Router):
    name = "least-work"
    Params = LeastWorkParams
    params: LeastWorkParams

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        p = self.params
        self.stat = stat = p.stat
        self.prompt_weight = p.prompt_weight
        self._predicted = remaining(stat)
        self._sum = p.prior_output_tokens
        self._n = 1
        # per routed, unfinished request: (work at arrival without the mean, has no prediction)
        self._at_arrival: dict = {}
        # per instance, by position in `instances` (as `route` returns and `on_finish` gets):
        self._fixed: dict[int, float] = defaultdict(float)  # sum of the above
        self._nblind: dict[int, int] = defaultdict(int)  # per instance: requests w/o prediction
        self._count: dict[int, int] = defaultdict(int)  # per instance: routed, unfinished

    def remaining(self, seq) -> float:
        """Expected tokens still to come (see the module doc)."""
        if seq.estimate is not None:
            return self._predicted(seq)
        return max(self._sum / self._n - seq.generated, 1.0)

    def blind(self, seq) -> bool:
        """True if `remaining` uses the running mean (no prediction)."""
        return seq.estimate is None

    def cost(self, seq) -> float:
        """The request's outstanding work, in decode-token equivalents."""
        c = self.remaining(seq)
        if seq.first_token is None:
            c += self.prompt_weight * seq.prompt_tokens
        return c

    def work(self, inst, i: int) -> float:
        """Predicted outstanding work of `inst`, position `i` in the router's instance list:
        O(its running requests)."""
        mean = self._sum / self._n
        w = self._fixed[i] + self._nblind[i] * mean
        at_arrival = self._at_arrival
        for s in islice(inst.outstanding(), inst.num_running):
            if s.first_token is None and not s.generated:
                continue  # still prefilling: as at arrival
            a = at_arrival.get(s)
            w += self.cost(s) - (0.0 if a is None else a[0] + a[1] * mean)
        return w

    def route(self, seq, instances, now, allowed=None) -> int:
        i = min(positions(instances, allowed), key=lambda i: self.work(instances[i], i))
        self.routed(seq, i)
        return i

    def routed(self, seq, instance: int) -> None:
        """Record that `seq` joins the instance at position `instance` (call from `route`)."""
        blind = self.blind(seq)
        fixed = self.cost(seq) - (self._sum / self._n if blind else 0.0)
        self._at_arrival[seq] = (fixed, blind)
        self._fixed[instance] += fixed
        self._nblind[instance] += blind
        self._count[instance] += 1

    def on_finish(self, seq, instance, now) -> None:
        self._sum += seq.generated
        self._n += 1
        self._forget(seq, instance)

    def on_cancel(self, seq, instance, now) -> None:
        self._forget(seq, instance)  # not a completion: the running mean learns nothing

    def _forget(self, seq, instance: int) -> None:
        a = self._at_arrival.pop(seq, None)
        if a is not None:
            self._count[instance] -= 1
            self._nblind[instance] -= a[1]
            # exact zero when empty, so float sums do not drift over a long run
            self._fixed[instance] = self._fixed[instance] - a[0] if self._count[instance] else 0.0


@ROUTERS.register("least-work-oracle")
class LeastWorkOracle(LeastWork):
    name = "least-work-oracle"
    oracle = True

    def remaining(self, seq) -> float:
        return max(seq.target - seq.generated, 1)

    def blind(self, seq) -> bool:
        return False
