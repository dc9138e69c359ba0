"""`SimConfig` — one simulated deployment — and `build_cluster` / `simulate` that assemble it.

    from presched.sim import SimConfig, simulate
    result = simulate(requests, SimConfig(policy="srpt-oracle", num_instances=4,
                                          router="least-work"))
    # 1 prefill + 3 decode instances (prefill/decode disaggregation, see disagg.py):
    result = simulate(requests, SimConfig(disaggregated=DisaggConfig(num_prefill=1, num_decode=3)))
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from pydantic import Field, ValidationInfo, field_validator, model_validator

from presched.config import Config
from presched.schedule import POLICIES
from presched.schedule.params import ParamsError, validate_params
from presched.schedule.routers import ROUTERS
from presched.sim.cluster import Cluster
from presched.sim.config import MAX_INSTANCES, DisaggConfig, EngineConfig
from presched.sim.disagg import DisaggCluster
from presched.sim.result import SimResult
from presched.sim.steptime import StepTimeConfig, build_step_model, kv_cache_blocks
from presched.sim.steptime.hybrid import hybrid_kv_layout
from presched.workload.request import Request


class SimConfig(Config):
    engine: EngineConfig = Field(default_factory=EngineConfig, description="vLLM scheduler knobs of each instance.")
    step_time: StepTimeConfig = Field(default_factory=StepTimeConfig, description="How long an engine step takes (model, hardware, roofline or fitted).")
    num_instances: int = Field(1, ge=1, le=MAX_INSTANCES, description="Engine instances (replicas) behind the router (at most 4096).")
    router: str = Field("round-robin", description="Router across instances: " + ", ".join(ROUTERS.names()) + ".")
    router_params: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the router.")
    policy: str = Field("fcfs", description="Scheduling policy of every instance: " + ", ".join(POLICIES.names()) + ".")
    policy_params: dict[str, Any] = Field(default_factory=dict, description="Parameters of the policy, checked by its model (`presched config --policy NAME` lists them).")
    fast_forward: bool = Field(True, description="Advance runs of decode-only steps at once (exact; turn off only to check it).")
    disaggregated: DisaggConfig | None = Field(
        None, description="Prefill/decode disaggregation: separate prefill and decode instances with a KV transfer between them (fields: num_prefill, num_decode, prefill_router, decode_router, their _params, kv_transfer_gbps, transfer_latency_ms, prefill_engine). Unset: colocated instances (num_instances, router). Every instance runs `policy`; decode instances use `engine`."
    )

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

    @field_validator("policy_params")
    @classmethod
    def _policy_params_valid(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        if "policy" in info.data:  # errors nest: sim.policy_params.base_quantum
            validate_params(info.data["policy"], v)
        return v

    @model_validator(mode="after")
    def _one_layout(self) -> "SimConfig":
        d = self.disaggregated
        if d is not None and (self.engine.enable_prefix_caching or (
                d.prefill_engine is not None and d.prefill_engine.enable_prefix_caching)):
            raise ValueError("field 'engine.enable_prefix_caching': not supported with "
                             "disaggregated instances yet")
        if d is None or "num_instances" not in self.model_fields_set:
            return self
        if self.num_instances != d.num_prefill + d.num_decode:
            raise ValueError(
                f"field 'num_instances': {self.num_instances} does not match disaggregated "
                f"num_prefill + num_decode = {d.num_prefill + d.num_decode}; leave it unset"
            )
        return self

    def engine_for(self, engine: EngineConfig | None = None) -> EngineConfig:
        """`engine` (default: `self.engine`) as vLLM runs it on this model: for a hybrid
        (state-space) model, `block_size` raised until an attention page holds a Mamba state
        and `state_blocks`, unless set, derived (`steptime.hybrid`); else `engine` itself."""
        engine = engine or self.engine
        st = self.step_time
        layout = hybrid_kv_layout(st.model_spec(), st.tp, engine.block_size)
        if layout is None:
            return engine
        update: dict[str, Any] = {"block_size": layout.block_size}
        if engine.state_blocks is None:
            update["state_blocks"] = layout.state_blocks
        return engine.model_copy(update=update)

    def num_blocks(self, engine: EngineConfig | None = None) -> int:
        """KV blocks per instance of `engine` (default: `self.engine`): its `num_blocks`, else
        derived from model and hardware (for a hybrid model, blocks of
        `engine_for(engine).block_size` tokens)."""
        engine = engine or self.engine
        if engine.num_blocks is not None:
            return engine.num_blocks
        st = self.step_time
        return kv_cache_blocks(
            st.model_spec(), st.hardware_spec(), tp=st.tp, ep=st.ep,
            gpu_memory_utilization=engine.gpu_memory_utilization,
            block_size=engine.block_size,
        )  # fmt: skip

    def policy_factory(self) -> Callable:
        params = dict(self.policy_params)
        factory = POLICIES.get(self.policy)
        try:
            factory(**params)  # fail early, with the parameter named, before a long run
        except ParamsError as e:
            raise e.under("policy_params") from None
        return lambda: factory(**params)


def _router(name: str, params: dict, field: str):
    try:
        return ROUTERS.create(name, **params)
    except ParamsError as e:
        raise e.under(field) from None


def build_cluster(cfg: SimConfig) -> Cluster | DisaggCluster:
    """The colocated `Cluster`, or a `DisaggCluster` when `cfg.disaggregated` is set."""
    if cfg.disaggregated is not None:
        return _build_disagg(cfg, cfg.disaggregated)
    router = None
    if cfg.num_instances > 1:
        router = _router(cfg.router, cfg.router_params, "router_params")
    return Cluster(
        engine=cfg.engine_for(), num_blocks=cfg.num_blocks(), step_model=build_step_model(cfg.step_time),
        policy_factory=cfg.policy_factory(), router=router, num_instances=cfg.num_instances,
        fast_forward=cfg.fast_forward,
    )  # fmt: skip


def _build_disagg(cfg: SimConfig, d: DisaggConfig) -> DisaggCluster:
    prefill_engine = d.prefill_engine or cfg.engine
    return DisaggCluster(
        prefill_engine=cfg.engine_for(prefill_engine), decode_engine=cfg.engine_for(),
        prefill_blocks=cfg.num_blocks(prefill_engine), decode_blocks=cfg.num_blocks(),
        step_model=build_step_model(cfg.step_time), policy_factory=cfg.policy_factory(),
        prefill_router=_router(d.prefill_router, d.prefill_router_params,
                               "disaggregated.prefill_router_params"),
        decode_router=_router(d.decode_router, d.decode_router_params,
                              "disaggregated.decode_router_params"),
        num_prefill=d.num_prefill, num_decode=d.num_decode,
        kv_bytes_per_token=cfg.step_time.model_spec().kv_bytes_per_token,
        transfer_bandwidth=d.kv_transfer_gbps * 1e9 / 8,  # Gb/s -> bytes/s
        transfer_latency=d.transfer_latency_ms / 1e3,
        fast_forward=cfg.fast_forward,
    )  # fmt: skip


def simulate(
    requests: Sequence[Request], cfg: SimConfig | None = None,
    progress: Callable[[int], None] | None = None, estimates=None,
) -> SimResult:  # fmt: skip
    """Run `requests` through the deployment `cfg` (default: one Llama-3.1-8B on an H100, FCFS).
    `estimates`: predicted length distributions (`predict.LengthEstimate`, in request order)."""
    return build_cluster(cfg or SimConfig()).run(requests, progress, estimates)
