"""Engine configuration: the vLLM v1 scheduler knobs the simulator models, and the layout of a
prefill/decode-disaggregated cluster."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from presched.config import Config
from presched.schedule.routers import ROUTERS


MAX_INSTANCES = 4096
"""Most engine instances one simulated deployment has (each holds its own scheduler state)."""


class EngineConfig(Config):
    max_num_seqs: int = Field(256, ge=1, le=2**20, description="Most requests in the running batch (vLLM --max-num-seqs).")
    max_num_batched_tokens: int = Field(
        8192, ge=1, le=2**30, description="Token budget of one engine step: prefill chunks + one per decode (vLLM --max-num-batched-tokens)."
    )
    enable_chunked_prefill: bool = Field(
        True, description="Split long prompts across steps to fit the token budget (vLLM v1 default). If off, a prompt is prefilled in one step: it waits until the step budget has room for all of it (a prompt longer than the whole budget runs alone)."
    )
    long_prefill_token_threshold: int = Field(
        0, ge=0, le=2**30, description="Cap on the prefill chunk one request gets per step; 0 = no cap (vLLM --long-prefill-token-threshold)."
    )
    block_size: int = Field(16, ge=1, le=2**20, description="Tokens per KV-cache block (vLLM --block-size).")
    num_blocks: int | None = Field(
        None, ge=1, le=2**40, description="KV-cache blocks per instance. Default: derived from the model, hardware and gpu_memory_utilization like vLLM's num_gpu_blocks."
    )
    state_blocks: int | None = Field(
        None, ge=0, le=2**20, description="KV-cache blocks each running request holds for its recurrent state, from admission to finish or preemption (vLLM's hybrid KV-cache manager: one block per Mamba layer group). Default: derived from the model (0 without state-space layers; nemotron-nano-9b-v2: 7), and block_size is then raised as vLLM raises it (1312 for Nemotron Nano v2; docs/steptime.md, KV-cache size)."
    )
    enable_prefix_caching: bool = Field(
        False, description="Automatic prefix caching (vLLM --enable-prefix-caching; on by default in vLLM v1, off here so results without block hashes stay as they were): full blocks are cached by the chain hash of the request's `block_hashes`, a hit skips that prefill, unused cached blocks are evicted least recently used first (docs/simulator.md, Prefix caching)."
    )
    gpu_memory_utilization: float = Field(
        0.9, gt=0, le=1, description="Share of GPU memory for weights + KV cache when num_blocks is derived (vLLM --gpu-memory-utilization)."
    )


class DisaggConfig(Config):
    """Prefill/decode disaggregation (DistServe, Splitwise, vLLM disaggregated prefill): see
    sim/disagg.py and docs/simulator.md."""

    num_prefill: int = Field(1, ge=1, le=MAX_INSTANCES, description="Prefill instances: each computes prompts and samples the first token (TTFT), then hands the request over.")
    num_decode: int = Field(1, ge=1, le=MAX_INSTANCES, description="Decode instances: each admits handed-over requests with their prompt KV present and generates the rest.")
    prefill_router: str = Field("round-robin", description="Router across the prefill instances (at arrival): " + ", ".join(ROUTERS.names()) + ".")
    prefill_router_params: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the prefill router.")
    decode_router: str = Field("round-robin", description="Router across the decode instances (when a request's KV arrives): " + ", ".join(ROUTERS.names()) + ".")
    decode_router_params: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the decode router.")
    kv_transfer_gbps: float = Field(
        400.0, gt=0, description="Bandwidth of one prefill-to-decode KV transfer, in Gb/s (gigabits per second; 400 = one 400G InfiniBand/RoCE NIC, 50 GB/s; NVLink in a node is ~3,600-7,200). Transfer time = prompt_tokens * kv_bytes_per_token * 8 / (kv_transfer_gbps * 1e9) + transfer_latency_ms."
    )
    transfer_latency_ms: float = Field(1.0, ge=0, description="Fixed cost of one KV transfer in ms (connection, metadata, completion notification), added to the bandwidth term.")
    prefill_engine: EngineConfig | None = Field(
        None, description="vLLM scheduler knobs of the prefill instances (e.g. a bigger max_num_batched_tokens); default: the same as `engine`."
    )

    @field_validator("prefill_router", "decode_router")
    @classmethod
    def _router_known(cls, v: str) -> str:
        ROUTERS.get(v)
        return v
