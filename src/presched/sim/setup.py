"""`SimConfig` — one simulated deployment — and `build_cluster` / `simulate` that assemble it.

    from presched.sim import SimConfig, simulate
    result = simulate(requests, SimConfig(policy="srpt-oracle", num_instances=4,
                                          router="least-work"))
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from pydantic import Field, field_validator

from presched.config import Config
from presched.schedule import POLICIES
from presched.schedule.routers import ROUTERS
from presched.sim.cluster import Cluster
from presched.sim.config import EngineConfig
from presched.sim.result import SimResult
from presched.sim.steptime import StepTimeConfig, build_step_model, kv_cache_blocks
from presched.workload.request import Request


class SimConfig(Config):
    engine: EngineConfig = Field(default_factory=EngineConfig, description="vLLM scheduler knobs of each instance.")
    step_time: StepTimeConfig = Field(default_factory=StepTimeConfig, description="How long an engine step takes (model, hardware, roofline or fitted).")
    num_instances: int = Field(1, ge=1, description="Engine instances (replicas) behind the router.")
    router: str = Field("round-robin", description="Router across instances: " + ", ".join(ROUTERS.names()) + ".")
    router_params: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the router.")
    policy: str = Field("fcfs", description="Scheduling policy of every instance: " + ", ".join(POLICIES.names()) + ".")
    policy_params: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the policy.")
    fast_forward: bool = Field(True, description="Advance runs of decode-only steps at once (exact; turn off only to check it).")

    @field_validator("router")
    @classmethod
    def _router_known(cls, v: str) -> str:
        ROUTERS.get(v)
        return v

    @field_validator("policy")
    @classmethod
    def _policy_known(cls, v: str) -> str:
        POLICIES.get(v)
        return v

    def num_blocks(self) -> int:
        """KV blocks per instance: `engine.num_blocks`, else derived from model and hardware."""
        if self.engine.num_blocks is not None:
            return self.engine.num_blocks
        st = self.step_time
        return kv_cache_blocks(
            st.model_spec(), st.hardware_spec(), tp=st.tp,
            gpu_memory_utilization=self.engine.gpu_memory_utilization,
            block_size=self.engine.block_size,
        )  # fmt: skip

    def policy_factory(self) -> Callable:
        params = dict(self.policy_params)
        factory = POLICIES.get(self.policy)
        try:
            factory(**params)  # fail early, with the parameter named, before a long run
        except TypeError as e:
            raise ValueError(f"policy_params for {self.policy!r}: {e}") from None
        return lambda: factory(**params)


def build_cluster(cfg: SimConfig) -> Cluster:
    router = None
    if cfg.num_instances > 1:
        try:
            router = ROUTERS.create(cfg.router, **cfg.router_params)
        except TypeError as e:
            raise ValueError(f"router_params for {cfg.router!r}: {e}") from None
    return Cluster(
        engine=cfg.engine, num_blocks=cfg.num_blocks(), step_model=build_step_model(cfg.step_time),
        policy_factory=cfg.policy_factory(), router=router, num_instances=cfg.num_instances,
        fast_forward=cfg.fast_forward,
    )  # fmt: skip


def simulate(
    requests: Sequence[Request], cfg: SimConfig | None = None,
    progress: Callable[[int], None] | None = None, estimates=None,
) -> SimResult:  # fmt: skip
    """Run `requests` through the deployment `cfg` (default: one Llama-3.1-8B on an H100, FCFS).
    `estimates`: predicted length distributions (`predict.LengthEstimate`, in request order)."""
    return build_cluster(cfg or SimConfig()).run(requests, progress, estimates)
