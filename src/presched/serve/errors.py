"""The errors the gateway's decisions raise; the fronts (app.py, relay.py) answer them as OpenAI
errors with their `status`."""

from __future__ import annotations


class GatewayError(Exception):
    """A request the gateway cannot serve: `status` is the HTTP status, the message says why."""

    def __init__(self, status: int, message: str, *, kind: str = "server_error",
                 param: str | None = None, retry_after: float | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.status, self.kind, self.param, self.retry_after = status, kind, param, retry_after


class PolicyError(GatewayError):
    """A policy hook raised for this request: it was dropped from the queue (500)."""

    def __init__(self, policy: str, hook: str, e: Exception) -> None:
        why = f"{type(e).__name__}: {e}"
        super().__init__(500, f"scheduling policy {policy!r} failed in {hook}: {why}")
