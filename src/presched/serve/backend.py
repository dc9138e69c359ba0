"""`Backend`: one engine behind the gateway — its policy, its waiting queue, what it runs, and
whether it is healthy. It is also the instance view routers read (`schedule/routers`).

Queue mode keeps at most `max_in_flight` requests at the engine, so the engine's own queue stays
empty and the gateway's policy order is the order that runs. Passthrough mode sends every
request at once; `running` then counts what the engine holds (running or in its own queue).
"""

from __future__ import annotations

from presched.schedule.interface import EngineInfo, Policy
from presched.serve.config import BackendConfig
from presched.serve.seq import GatewaySeq


class Backend:
    def __init__(self, index: int, cfg: BackendConfig, policy: Policy) -> None:
        self.index = index
        self.cfg = cfg
        self.url = cfg.url
        self.name = cfg.name or cfg.url
        self.model = cfg.model
        self.max_in_flight = cfg.max_in_flight
        self.policy = policy
        self.engine = EngineInfo(kv_tokens=cfg.kv_tokens, max_num_seqs=cfg.max_in_flight)
        policy.attach(self.engine)
        self.queue = policy.new_queue()
        self.running: list[GatewaySeq] = []
        self.healthy = True
        self.served = 0

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

    def __repr__(self) -> str:
        state = "up" if self.healthy else "DOWN"
        return f"Backend({self.name}, {state}, running={self.num_running}, waiting={self.num_waiting})"
