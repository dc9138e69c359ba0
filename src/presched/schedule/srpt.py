"""`srpt`: shortest predicted remaining processing time, with progressive refinement and LIMITED
preemption (TRAIL's SPRPT, Shahout et al., ICLR 2025); `trail`: the same with TRAIL's defaults.

Order: predicted remaining tokens, lower first. A request that has generated g tokens is
re-estimated from its distribution given L > g (`remaining(stat)`; for `mean`, E[L - g | L > g]),
so a request that outlives its prediction is predicted LONGER, not shorter.

Limited preemption: when the best waiting request c cannot start (batch full or KV short), a
running request v may be preempted (by recompute) for it only if

    (1) g(v) < c_frac * P0(v)              P0: v's predicted total at arrival (TRAIL's c)
    (2) preemptions(v) < max_preemptions
    (3) r(v) > r(c) + min_gap + recompute_weight * (prompt(v) + g(v))

with r the predicted remaining. Among eligible v the one with the largest r is preempted (ties:
latest arrival). (3) charges the tokens v must prefill again, as `srpt-oracle` does: with
recompute_weight = 0 a saturated engine thrashes on recomputes (see oracle.py). c_frac = 0 turns
preemption off (reorder only). KV-pressure victim: the largest r, ties to the latest arrival.

The decision is taken when the queue head or the running batch changes (an arrival that becomes
the head, an admission, a completion, a preemption), not at every decode step: a refined r(v)
that grows while nothing happens is acted on at the next such event. The fast-forwarding
simulator needs this (a refusal must not turn into a preemption while requests only decode; the
tests check that both modes agree), and it keeps the gateway cheap.

Inputs: `seq.estimate`. Config: `stat` ("mean"; any of `lengths.STATS` but `rank`, which is no
length), `c_frac` (2.0), `max_preemptions` (4; None = no limit), `min_gap` (0 tokens),
`recompute_weight` (1.0). Defaults measured (docs/policies/srpt.md): with the recompute charge,
TRAIL's window c_frac = 0.8 mostly forbids preempting requests that outlived a too-short
prediction, which are the ones worth preempting; 2.0 with a cap of 4 did best under noisy
predictions (azure-code, 90 % load).

    POLICIES.create("srpt", c_frac=0.8, max_preemptions=2)
    presched simulate --policy trail --set sim.policy_params.c_frac=0

`trail`: c_frac 0.8 (the paper; the repo's launcher uses 0), stat mean, no cap on preemptions, no
margin and no recompute charge (TRAIL's SGLang patch preempts when r(c) + margin < r(v), margin 0,
at most SGLANG_TRAIL_MAX_PREEMPTIONS_PER_REQ times, 0 = unlimited; SGLang keeps the victim's KV in
its radix cache, so its recompute is often a prefix hit, which presched's simulator does not
model). Deviation: TRAIL refines r with a probe on the model's hidden state every step (every 8
in the repo); presched refines from the predicted distribution, conditioned on L > g.

`LimitedPreemption` is the shared machinery (guard, victim, decision cache); `gittins` uses it
with the Gittins index as the size.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from presched.schedule import lengths
from presched.schedule.interface import Policy, SeqView
from presched.schedule.options import number
from presched.schedule.registry import POLICIES


class LimitedPreemption(Policy):
    """Order by a predicted size, preempt under the guard (1)-(3) of the module doc. Subclasses
    define `size(seq)` (predicted remaining work; lower runs first) and `initial(seq)` (the
    predicted total at arrival, the base of the c_frac window)."""

    name = "limited-preemption"

    def __init__(
        self, c_frac: float, max_preemptions: int | None, min_gap: float, recompute_weight: float
    ) -> None:
        self.c_frac = number("c_frac", c_frac)
        if max_preemptions is not None and (
            isinstance(max_preemptions, bool) or not isinstance(max_preemptions, int)
            or max_preemptions < 0
        ):  # fmt: skip
            raise ValueError(
                f"field 'max_preemptions': must be an integer >= 0 or None (no limit), "
                f"got {max_preemptions!r}"
            )
        self.max_preemptions = max_preemptions
        self.min_gap = number("min_gap", min_gap)
        self.recompute_weight = number("recompute_weight", recompute_weight)
        self._max_p = math.inf if max_preemptions is None else max_preemptions
        self._initial: dict[int, float] = {}  # id(seq) -> initial(seq), from arrival to finish
        self._batch_version = 0  # bumped whenever the running batch changes
        self._declined: tuple | None = None  # (candidate, batch version) last refused

    def size(self, seq: SeqView) -> float:
        raise NotImplementedError

    def initial(self, seq: SeqView) -> float:
        raise NotImplementedError

    def priority(self, seq: SeqView, now: float) -> float:
        return self.size(seq)

    def victim(self, candidates: Sequence[SeqView], now: float) -> SeqView:
        size = self.size
        return max(reversed(candidates), key=lambda s: (size(s), s.arrival))

    def preempt_for(self, candidate, running, now):
        if not running or self.c_frac == 0 or self._max_p == 0:
            return None
        declined = self._declined
        if declined is not None and declined[0] is candidate and declined[1] == self._batch_version:
            return None  # nothing changed since we said no (see the module doc)
        size, init, c_frac, w = self.size, self._initial, self.c_frac, self.recompute_weight
        bar = size(candidate) + self.min_gap
        best, best_r = None, -math.inf
        for v in running:
            if v.preemptions >= self._max_p:
                continue
            p0 = init.get(id(v))
            if p0 is None:
                p0 = self.initial(v)
            if v.generated >= c_frac * p0:
                continue
            r = size(v)
            if r > bar + w * (v.prompt_tokens + v.generated) and (
                r > best_r or (r == best_r and v.arrival >= best.arrival)
            ):
                best, best_r = v, r
        if best is None:
            self._declined = (candidate, self._batch_version)
        return best

    def on_arrival(self, seq, now):
        self._initial[id(seq)] = self.initial(seq)

    def on_schedule(self, seq, now):
        self._batch_version += 1

    def on_preempt(self, seq, now):
        self._batch_version += 1

    def on_finish(self, seq, now):
        self._batch_version += 1
        self._forget(seq)

    def on_cancel(self, seq, now):
        self._batch_version += 1
        self._forget(seq)

    def _forget(self, seq) -> None:
        self._initial.pop(id(seq), None)
        if self._declined is not None and self._declined[0] is seq:
            self._declined = None


@POLICIES.register("srpt")
class SRPT(LimitedPreemption):
    name = "srpt"

    def __init__(
        self, stat: str = "mean", c_frac: float = 2.0, max_preemptions: int | None = 4,
        min_gap: float = 0.0, recompute_weight: float = 1.0,
    ) -> None:  # fmt: skip
        if lengths.check_stat(stat) == "rank":
            raise ValueError(
                "field 'stat': 'rank' is a score, not a length in tokens; srpt needs a length "
                "(order by rank with sjf, stat='rank')"
            )
        super().__init__(c_frac, max_preemptions, min_gap, recompute_weight)
        self.stat = stat
        self.size = lengths.remaining(stat)  # type: ignore[method-assign]
        self.initial = lengths.total(stat)  # type: ignore[method-assign]

    def describe(self) -> str:
        return (f"{self.name}(stat={self.stat}, c_frac={self.c_frac:g}, "
                f"max_preemptions={self.max_preemptions}, min_gap={self.min_gap:g}, "
                f"recompute_weight={self.recompute_weight:g})")  # fmt: skip


@POLICIES.register("trail")
class TRAIL(SRPT):
    """`srpt` with TRAIL's paper defaults (see the module doc)."""

    name = "trail"

    def __init__(
        self, stat: str = "mean", c_frac: float = 0.8, max_preemptions: int | None = None,
        min_gap: float = 0.0, recompute_weight: float = 0.0,
    ) -> None:  # fmt: skip
        super().__init__(stat, c_frac, max_preemptions, min_gap, recompute_weight)
