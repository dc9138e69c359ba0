"""What `Gateway` does when a policy hook raises at run time: count and log it, take the request
(or every request of a queue that failed) out of its queue and slot, and make its `wait` raise
`PolicyError` (the app answers 500 in OpenAI format and logs the row). A mixin of `Gateway`: it
uses the gateway's own `_remove`, `_cancelled`, `now` and `shares`."""

from __future__ import annotations

import logging

from presched.serve.backend import Backend
from presched.serve.errors import PolicyError
from presched.serve.seq import GatewaySeq

_log = logging.getLogger("presched.serve")  # as the gateway logs


class PolicyFaults:
    """Policy-error handling for `Gateway` (see the module doc)."""

    policy_errors: int

    def _policy_error(self, b: Backend, seq: GatewaySeq | None, hook: str, e: Exception) -> None:
        self.policy_errors += 1
        _log.warning("policy %r failed in %s on backend %s (request %s): %s: %s", b.policy.name,
                     hook, b.name, seq.id if seq is not None else "-", type(e).__name__, e)  # fmt: skip

    def _fault(self, b: Backend, seq: GatewaySeq, hook: str, e: Exception) -> None:
        """A hook raised for `seq`, not yet released: it leaves `b` and its `wait` raises."""
        self._policy_error(b, seq, hook, e)
        if seq in b.queue:
            self._remove(b, seq)
        if seq in b.running:
            b.running.remove(seq)
        self._cancelled(b, seq, self.now())
        if seq.released is not None and not seq.released.done():
            seq.released.set_exception(PolicyError(b.policy.name, hook, e))

    def _fault_queue(self, b: Backend, e: Exception) -> None:
        """The queue of `b` failed (not attributable to one request): every request waiting
        there is failed, and `b` gets a fresh queue."""
        waiting = list(b.queue)
        b.queue = b.policy.new_queue()
        for s in waiting:
            self.shares.sub(s.tenant)
        for s in waiting:
            self._fault(b, s, "the waiting queue", e)
