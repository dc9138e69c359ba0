"""`GatewaySeq`: the gateway's mutable state of one accepted request.

It has the attributes policies and routers read (see `schedule/interface.py`), on the gateway's
wall clock (seconds since the gateway started), plus what the proxy and the log need. Policies
cannot tell it from the simulator's `Seq`: that is how one policy object runs under both clocks.

`target` is the exact output length only when the client forces it (`ignore_eos` with
`max_tokens`, as load generators do); otherwise None, and oracle policies refuse the request.
"""

from __future__ import annotations

import asyncio
from typing import Any

from presched.workload.request import Request


class GatewaySeq:
    __slots__ = (
        "request", "id", "arrival", "prompt_tokens", "tenant", "target", "estimate",
        "generated", "first_scheduled", "first_token", "last_token", "finish", "max_itl",
        "preemptions", "recomputed_tokens", "instance", "routed", "tried", "released",
        "key", "ts",
    )  # fmt: skip

    def __init__(self, request: Request, arrival: float, ts: float, target: int | None,
                 estimate: Any = None) -> None:  # fmt: skip
        self.request = request
        self.id = request.id
        self.arrival = arrival
        self.ts = ts  # unix time of arrival (the log's clock)
        self.prompt_tokens = request.prompt_tokens
        self.tenant = request.tenant
        self.target = target
        self.estimate = estimate
        self.generated = 0
        self.first_scheduled: float | None = None
        self.first_token: float | None = None
        self.last_token: float | None = None
        self.finish: float | None = None
        self.max_itl = 0.0
        self.preemptions = 0  # the gateway never preempts; the engine's own are invisible
        self.recomputed_tokens = 0
        self.instance = -1  # backend index it runs on
        self.routed = -1  # backend index the router chose (its bookkeeping key)
        self.tried: set[int] = set()  # backends that failed it before the first byte
        self.released: asyncio.Future | None = None  # set to the backend when it may start
        self.key: float | None = None  # the policy's key when queued (logged)

    def on_token(self, now: float) -> None:
        """One more output token (one content event of the stream) at `now`."""
        if self.first_token is None:
            self.first_token = now
        else:
            gap = now - self.last_token  # type: ignore[operator]
            if gap > self.max_itl:
                self.max_itl = gap
        self.last_token = now
        self.generated += 1

    def __repr__(self) -> str:
        return f"GatewaySeq({self.id!r}, arrival={self.arrival:.3f}, backend={self.instance})"
