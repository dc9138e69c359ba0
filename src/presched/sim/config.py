"""Engine configuration: the vLLM v1 scheduler knobs the simulator models."""

from __future__ import annotations

from pydantic import Field

from presched.config import Config


class EngineConfig(Config):
    max_num_seqs: int = Field(256, ge=1, description="Most requests in the running batch (vLLM --max-num-seqs).")
    max_num_batched_tokens: int = Field(
        8192, ge=1, description="Token budget of one engine step: prefill chunks + one per decode (vLLM --max-num-batched-tokens)."
    )
    enable_chunked_prefill: bool = Field(
        True, description="Split long prompts across steps to fit the token budget (vLLM v1 default). If off, a prompt is prefilled in one step: it waits until the step budget has room for all of it (a prompt longer than the whole budget runs alone)."
    )
    long_prefill_token_threshold: int = Field(
        0, ge=0, description="Cap on the prefill chunk one request gets per step; 0 = no cap (vLLM --long-prefill-token-threshold)."
    )
    block_size: int = Field(16, ge=1, description="Tokens per KV-cache block (vLLM --block-size).")
    num_blocks: int | None = Field(
        None, ge=1, description="KV-cache blocks per instance. Default: derived from the model, hardware and gpu_memory_utilization like vLLM's num_gpu_blocks."
    )
    gpu_memory_utilization: float = Field(
        0.9, gt=0, le=1, description="Share of GPU memory for weights + KV cache when num_blocks is derived (vLLM --gpu-memory-utilization)."
    )
