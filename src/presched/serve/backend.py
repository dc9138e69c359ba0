"""`Backend`: one engine behind the gateway — its policy, its waiting queue, what it runs, and
whether it is healthy. It is also the instance view routers read (`schedule/routers`).

Queue mode keeps at most `max_in_flight` requests at the engine, so the engine's own queue stays
empty and the gateway's policy order is the order that runs. Passthrough mode sends every
request at once; `running` then counts what the engine holds (running or in its own queue).

Failures: every request that fails here (refused, timed out, cut off mid-body, a stream that
broke or stalled) counts in `failures` and `strikes` (failures since the last request served
here), and holds the backend down for `health_interval_s * 2**(strikes - 1)` seconds (at most
`MAX_HOLD_S`): a passing health check brings it back only after that, so a backend whose
/health answers but whose responses stall does not read as up at every check.
"""

from __future__ import annotations

from typing import Callable

from presched.schedule.interface import EngineInfo, Policy
from presched.serve.config import BackendConfig
from presched.serve.seq import GatewaySeq

MAX_HOLD_S = 300.0  # longest a failing backend is held down before a health check may pass


class Backend:
    def __init__(self, index: int, cfg: BackendConfig, policy: Policy,
                 drift_alarm: Callable[[], bool] | None = None) -> None:  # fmt: skip
        """`drift_alarm`: reads the online learner's drift alarm (`--learn`), for the policy."""
        self.index = index
        self.cfg = cfg
        self.url = cfg.url
        self.name = cfg.name or cfg.url
        self.model = cfg.model
        self.max_in_flight = cfg.max_in_flight
        self.policy = policy
        self.engine = EngineInfo(kv_tokens=cfg.kv_tokens, max_num_seqs=cfg.max_in_flight, drift_alarm=drift_alarm)
        policy.attach(self.engine)
        self.queue = policy.new_queue()
        self.running: list[GatewaySeq] = []
        self.healthy = True
        self.served = 0
        self.failures = 0
        self.strikes = 0
        self.held_until = float("-inf")  # the gateway's clock (`Gateway.now`)

    # --- what routers see (InstanceView) -------------------------------------------------
    @property
    def num_waiting(self) -> int:
        return len(self.queue)

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_outstanding(self) -> int:
        return len(self.queue) + len(self.running)

    @property
    def kv_free_fraction(self) -> float:
        return 1.0  # not reported by OpenAI-compatible engines

    def outstanding(self):
        """Unfinished requests assigned here: running first, then waiting."""
        yield from self.running
        yield from self.queue

    def has_slot(self) -> bool:
        return self.healthy and len(self.running) < self.max_in_flight

    def note_failure(self, now: float, base_s: float) -> None:
        """A request failed here at `now`: count it and hold the backend down (see above)."""
        self.failures += 1
        self.strikes += 1
        self.held_until = now + min(base_s * 2.0 ** min(self.strikes - 1, 30), MAX_HOLD_S)

    def note_success(self) -> None:
        """A request was served here: later failures start the hold from `base_s` again."""
        self.strikes = 0

    def held(self, now: float) -> bool:
        """Whether a passing health check must not bring the backend back yet."""
        return now < self.held_until

    def __repr__(self) -> str:
        state = "up" if self.healthy else "DOWN"
        return f"Backend({self.name}, {state}, running={self.num_running}, waiting={self.num_waiting})"
