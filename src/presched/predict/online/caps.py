"""Per-tenant caps on how fast the learner takes labels: a token bucket per tenant on a clock
the caller passes (wall clock in the gateway, the stream's clock in benchmarks), so one tenant
replaying a burst of odd answers cannot move the calibration or fill the refit buffer alone.
At most `max_tenants` buckets are kept (least recently seen forgotten: bounded memory).

A bucket's clock only moves forward: a `now` earlier than the last one seen refills nothing (rows
fed in completion order but stamped with their arrival times, as `presched learn` feeds them,
step back and forth), so a tenant is granted at most `burst + rate * span` labels over any span
of its clock, whatever the order the times come in. A `now` that is not a finite number refills
nothing either (a NaN once stuck a bucket's clock for good). The buckets are saved with the
learner's state (`state` / `restore`), so a restart does not hand every tenant a fresh burst."""

from __future__ import annotations

import math
from collections import OrderedDict


class TenantCaps:
    def __init__(self, rate: float, burst: int, max_tenants: int = 10_000) -> None:
        self.rate, self.burst, self.max_tenants = rate, burst, max_tenants
        self._buckets: OrderedDict[str, list[float]] = OrderedDict()  # tenant -> [tokens, t]
        self.dropped = 0

    def take(self, tenant: str, now: float) -> bool:
        b = self._buckets.get(tenant)
        if not math.isfinite(now):
            now = b[1] if b is not None else -math.inf
        if b is None:
            b = self._buckets[tenant] = [float(self.burst), now]
            if len(self._buckets) > self.max_tenants:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(tenant)
            if now > b[1]:
                b[0] = min(self.burst, b[0] + (now - b[1]) * self.rate if b[1] > -math.inf else self.burst)
                b[1] = now
        if b[0] >= 1.0:
            b[0] -= 1.0
            return True
        self.dropped += 1
        return False

    def state(self) -> dict:
        """What a save keeps: each bucket's tokens and clock, least recently seen first."""
        return {"buckets": [[t, b[0], b[1] if math.isfinite(b[1]) else None] for t, b in self._buckets.items()],
                "dropped": self.dropped}  # fmt: skip

    def restore(self, v: dict) -> None:
        """The saved buckets under this config's rate, burst and bound (tokens capped at the
        burst; the newest `max_tenants` kept)."""
        rows = v.get("buckets", [])[-self.max_tenants:]
        self._buckets = OrderedDict((str(t), [min(float(tok), float(self.burst)),
                                              -math.inf if clock is None else float(clock)])
                                    for t, tok, clock in rows)  # fmt: skip
        self.dropped = int(v.get("dropped", 0))
