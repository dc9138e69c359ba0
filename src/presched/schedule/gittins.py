"""`gittins`: order by the Gittins index of each request's predicted length distribution.

The Gittins index of a request that has generated g tokens is the best ratio, over horizons D,
of the chance to finish within D more tokens to the expected tokens spent trying:

    G(g) = sup_D  P(L - g <= D | L > g) / E[min(L - g, D) | L > g]        (higher runs first)
    priority = 1 / G(g)      an "effective remaining size": exactly L - g for a known length

The (preemptive) Gittins policy minimises mean response time in the M/G/1 queue among policies
that do not know job sizes (Gittins; Scully, Harchol-Balter et al.). Unlike the mean, it rewards
a LIKELY-short request even when its tail is heavy: a request that is 50 % likely to stop within
20 tokens runs before one that surely needs 100, though its mean may be larger. With exact
predictions it orders like SRPT.

KV-pressure victim: the lowest index (largest 1 / G), ties to the latest arrival. Limited
preemption with `srpt`'s guard (`limited_preemption.py`), with r = 1 / G and the window
c_frac * E[L] (the mean at arrival); c_frac = 0 only reorders. Preemption measured worth it:
without it gittins orders fresh requests as sjf does when every prediction has the same spread
(capture ~0.5 of the srpt-oracle gain under noisy predictions), with it ~0.85
(docs/policies/gittins.md).

Inputs: `seq.estimate` (`RequestEstimate.gittins`). Config (`LimitedPreemptionParams`): `c_frac` (2.0), `max_preemptions`
(4; None = no limit), `min_gap` (0), `recompute_weight` (1.0), as in `srpt`.

    POLICIES.create("gittins", c_frac=0)
    presched simulate --policy gittins --set sim.policy_params.c_frac=0

Reference: Gittins, "Bandit processes and dynamic allocation indices" (1979); Scully,
Harchol-Balter, Scheller-Wolf, "SOAP: one clean analysis of all age-based scheduling policies"
(2018). Deviation: the index is computed on presched's piecewise-linear + exponential-tail
distribution built from the predicted quantiles (`predict/estimate.py`), and service is counted
in output tokens (prefill is not part of the size).
"""

from __future__ import annotations

from presched.schedule.lengths import estimate_of
from presched.schedule.limited_preemption import LimitedPreemption
from presched.schedule.registry import POLICIES


@POLICIES.register("gittins")
class Gittins(LimitedPreemption):
    name = "gittins"

    def size(self, seq) -> float:
        return 1.0 / estimate_of(seq).gittins(seq.generated)

    def initial(self, seq) -> float:
        return estimate_of(seq).mean

    def describe(self) -> str:
        return (
            f"gittins(c_frac={self.c_frac:g}, max_preemptions={self.max_preemptions}, "
            f"min_gap={self.min_gap:g}, recompute_weight={self.recompute_weight:g})"
        )
