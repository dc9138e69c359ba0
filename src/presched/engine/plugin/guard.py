"""`Guard`: runs policy hooks so that an exception never reaches vLLM's engine loop.

A hook that raises is counted (`errors[hook]`), logged (the first few times per hook, with the
traceback), and the caller takes the FCFS decision instead (see each call site in
`scheduler.py` / `queue.py`). The engine keeps serving.
"""

from __future__ import annotations

import logging
from collections import Counter

log = logging.getLogger("presched.engine.plugin")
_LOGGED_PER_HOOK = 5


class Guard:
    def __init__(self) -> None:
        self.errors: Counter[str] = Counter()
        self.on_error = None  # called after each counted error (the scheduler saves its stats)

    def failed(self, hook: str, exc: BaseException) -> None:
        """Count an exception raised by the policy's `hook`."""
        self.errors[hook] += 1
        n = self.errors[hook]
        if n <= _LOGGED_PER_HOOK:
            log.error("presched policy hook %s raised (%d so far; FCFS decision taken instead): %s: %s",
                      hook, n, type(exc).__name__, exc, exc_info=exc)  # fmt: skip
        if self.on_error is not None:
            self.on_error()

    def call(self, hook: str, fallback, fn, *args):
        """fn(*args), or `fallback` when it raises (counted)."""
        try:
            return fn(*args)
        except Exception as e:  # noqa: BLE001 - any policy bug must not kill the engine
            self.failed(hook, e)
            return fallback

    @property
    def total(self) -> int:
        return sum(self.errors.values())
