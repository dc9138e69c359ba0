"""Tenants: API keys -> tenant names, and per-tenant rate limits (token buckets).

With no tenants configured, authentication is off and every request is tenant 'default'.
Otherwise `Authorization: Bearer KEY` (or `api-key: KEY`) must name a configured key: a
missing or unknown key is refused (401) before anything else is done with the request.

Queue shares (`QueueShares`, queue mode): so that one tenant filling the gateway queue cannot
make every tenant get 429, tenant t may have at most

    share(t) = max(1, floor(max_queue * w_t / W))      W = the sum of the configured weights

requests waiting; tenant names that are not configured (the HTTP app never sends one when
tenants are configured; other fronts of `Gateway` may) share one pool of what the configured
shares leave, max(1, max_queue - sum of the shares). With `unlisted=True` (the EPP, whose
fairness ids are not authenticated, so unlisted ones are ordinary traffic) that pool counts as
one more tenant of weight 1 instead: W = sum of the weights + 1, each listed tenant gets
max(1, floor(max_queue * w_t / W)) and the pool max(1, floor(max_queue / W)). Without tenants,
the one tenant 'default' has all of max_queue. The total stays bounded by max_queue as well.
"""

from __future__ import annotations

import math
import time
from typing import Callable, Mapping

from presched.serve.config import TenantConfig


class TokenBucket:
    """`rate` tokens per second, at most `burst` saved; `take()` spends one if there is one."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.rate, self.burst, self.clock = rate, burst, clock
        self.tokens = float(burst)
        self.t = clock()

    def take(self) -> bool:
        now = self.clock()
        self.tokens = min(self.burst, self.tokens + (now - self.t) * self.rate)
        self.t = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return True
        return False

    def wait_s(self) -> float:
        """Seconds until the next token (for Retry-After)."""
        return max(0.0, (1.0 - self.tokens) / self.rate)


class Tenants:
    def __init__(self, tenants: list[TenantConfig], clock: Callable[[], float] = time.monotonic) -> None:
        self.by_key: Mapping[str, TenantConfig] = {t.api_key: t for t in tenants}
        self.buckets = {
            t.name: TokenBucket(t.rate_limit_rps, t.burst or max(1, int(t.rate_limit_rps)), clock)
            for t in tenants if t.rate_limit_rps is not None
        }  # fmt: skip

    @property
    def enabled(self) -> bool:
        return bool(self.by_key)

    def identify(self, headers: Mapping[str, str]) -> str | None:
        """The tenant of a request's headers; None if authentication fails."""
        if not self.by_key:
            return "default"
        auth = headers.get("authorization", "")
        key = auth[7:].strip() if auth[:7].lower() == "bearer " else headers.get("api-key", "")
        t = self.by_key.get(key)
        return t.name if t is not None else None

    def allow(self, tenant: str) -> float | None:
        """None if the tenant may start a request now, else seconds to wait (429)."""
        bucket = self.buckets.get(tenant)
        if bucket is None or bucket.take():
            return None
        return bucket.wait_s()


class QueueShares:
    """Per-tenant caps on waiting requests (module doc) and the count of each tenant's waiting
    requests (`add` when one is queued, `sub` when it leaves the queue; no entry at zero)."""

    def __init__(self, tenants: list[TenantConfig], max_queue: int, unlisted: bool = False) -> None:
        """`unlisted`: the tenants not configured share a pool of weight 1 (module doc)."""
        self.caps: dict[str, int] = {}
        self.rest = max_queue
        if tenants:
            total = sum(t.weight for t in tenants) + (1 if unlisted else 0)
            self.caps = {t.name: max(1, math.floor(max_queue * t.weight / total)) for t in tenants}
            self.rest = max(1, math.floor(max_queue / total) if unlisted else max_queue - sum(self.caps.values()))
        self.counts: dict[str | None, int] = {}  # pool -> requests waiting

    def _pool(self, tenant: str) -> str | None:
        return tenant if tenant in self.caps else None  # None: the unconfigured tenants' pool

    def share(self, tenant: str) -> int:
        """The most requests `tenant` (with the others of its pool) may have waiting."""
        return self.caps.get(tenant, self.rest)

    def waiting(self, tenant: str) -> int:
        """Requests of `tenant`'s pool waiting now."""
        return self.counts.get(self._pool(tenant), 0)

    def add(self, tenant: str) -> None:
        pool = self._pool(tenant)
        self.counts[pool] = self.counts.get(pool, 0) + 1

    def sub(self, tenant: str) -> None:
        pool = self._pool(tenant)
        n = self.counts[pool] - 1
        if n:
            self.counts[pool] = n
        else:
            del self.counts[pool]
