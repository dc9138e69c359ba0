"""Model and hardware descriptions for the analytical step-time models (presets: presets.py).

Units everywhere: bytes, seconds, FLOP/s (floating-point operations per second), bytes/s.

`ModelSpec` is a decoder-only transformer: dense (Llama-style) or mixture-of-experts, with
grouped-query (GQA) or multi-head latent attention (MLA), optional sliding-window layers and
optional state-space (Mamba) layers; weights, routed experts and KV cache each in their own
number format (dtypes.py). Per token and layer, with `b(x)` the bytes of format x:

    routed_expert_params = mlp_matrices * hidden_size * moe_intermediate_size   (one expert)
    routed_params        = num_moe_layers * num_experts * routed_expert_params
    dense_params         = num_params - routed_params   (attention, embeddings, dense MLPs,
                                                         shared experts, routers)
    lookup_params        = vocab_size * hidden_size unless tie_word_embeddings, else 0
                           (a separate input embedding: held, only T rows looked up per step)
    streamed_params      = dense_params - lookup_params   (what a step reads and multiplies)
    active_params        = dense_params + num_moe_layers * experts_per_token * routed_expert_params
    weight_bytes         = dense_params * b(weight_dtype) + routed_params * b(expert_dtype)
    kv per layer, GQA    = 2 (K and V) * num_kv_heads * head_dim * b(kv_dtype)
    kv per layer, MLA    = (kv_lora_rank + qk_rope_head_dim) * b(kv_dtype)  (one latent, all heads)
    kv_bytes_per_token   = num_attention_layers * kv per layer

A dense model has num_experts = 0 (then active = total parameters). `HardwareSpec` is one GPU:
dense tensor-core peaks (no sparsity) in BF16 and, where it has them, FP8 and FP4; HBM bandwidth
and capacity; the per-direction NVLink bandwidth that all-reduces and all-to-alls use.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from presched.config import Config
from presched.sim.steptime.dtypes import DType, dtype_bytes

GIB = 2**30
MIB = 2**20
RATE_MAX = 1e30
"""Bound on a HardwareSpec rate (FLOP/s, bytes/s): finite, yet far enough past any GPU that a
link or memory which costs nothing can be modelled (1e30, as the step-time tests do)."""
RATE_MIN = 1e6
"""Slowest rate (and smallest memory) taken: below it a value is a unit slip (3.35 for 3.35 TB/s)
and every step takes hours; 1e-300 made a run end with 'requests never finished'."""


class ModelSpec(Config):
    """Shape of a transformer, enough for FLOP and byte counts (formulas: module docstring)."""

    name: str = Field(description="Preset or model name, used in tables and logs.")
    num_params: float = Field(gt=0, le=1e15, description="Total parameters (embeddings and all experts).")
    num_layers: int = Field(gt=0, le=2**24, description="Transformer blocks (attention or SSM + MLP/MoE).")
    hidden_size: int = Field(gt=0, le=2**24, description="Residual-stream width (d_model).")
    num_heads: int = Field(gt=0, le=2**24, description="Attention (query) heads.")
    num_kv_heads: int = Field(gt=0, le=2**24, description="Key/value heads (GQA); MLA: set to num_heads.")
    head_dim: int = Field(gt=0, le=2**24, description="Dimension of one attention head (GQA).")
    intermediate_size: int | None = Field(
        default=None, gt=0, le=2**24, description="Dense MLP inner width; informational."
    )
    vocab_size: int = Field(gt=0, le=2**24, description="Tokenizer vocabulary size.")
    tie_word_embeddings: bool = Field(
        default=False, description="True: the input embedding is the LM head's matrix. False "
        "(Llama-3.1, Qwen3): a separate vocab_size x hidden_size table, held in memory but only "
        "looked up (a few rows per step), neither read whole nor multiplied."
    )
    weight_dtype: DType = Field(
        default="bf16", description="Format of the weights other than routed experts "
        "(bf16, fp16, fp8, mxfp4, nvfp4)."
    )
    expert_dtype: DType | None = Field(
        default=None, description="Format of the routed-expert weights (None: weight_dtype); "
        "gpt-oss: mxfp4."
    )
    kv_dtype: DType = Field(default="bf16", description="Format of the KV cache.")
    # mixture of experts
    num_experts: int = Field(
        default=0, ge=0, le=4096, description="Routed experts per MoE layer (0: dense model)."
    )
    experts_per_token: int = Field(
        default=0, ge=0, le=4096, description="Routed experts each token goes to (top-k)."
    )
    num_shared_experts: int = Field(
        default=0, ge=0, le=64, description="Shared experts per MoE layer (always active; their "
        "parameters count as dense)."
    )
    moe_intermediate_size: int | None = Field(
        default=None, gt=0, le=2**24, description="Inner width of one routed expert."
    )
    num_moe_layers: int | None = Field(
        default=None, ge=0, description="Layers with a MoE block (None: all layers when "
        "num_experts > 0, else 0); the others have a dense MLP."
    )
    mlp_matrices: int = Field(
        default=3, ge=2, le=3, description="Weight matrices per expert MLP: 3 gated (SwiGLU), "
        "2 plain."
    )
    # attention variants
    attention: Literal["gqa", "mla"] = Field(
        default="gqa", description="'gqa' (grouped-query, incl. MHA/MQA) or 'mla' (DeepSeek "
        "multi-head latent attention, KV cache = one compressed latent per token and layer)."
    )
    kv_lora_rank: int | None = Field(
        default=None, gt=0, le=2**24, description="MLA: latent KV width (DeepSeek-V3: 512)."
    )
    qk_rope_head_dim: int | None = Field(
        default=None, gt=0, le=2**24, description="MLA: decoupled RoPE key width cached with the latent (64)."
    )
    num_attention_layers: int | None = Field(
        default=None, ge=0, description="Layers with attention (and a KV cache); None: "
        "num_layers - num_ssm_layers."
    )
    sliding_window: int | None = Field(
        default=None, gt=0, le=2**30, description="Window in tokens of the sliding-window layers."
    )
    num_sliding_layers: int = Field(
        default=0, ge=0, description="Attention layers that attend only to the last "
        "sliding_window tokens (Gemma-3: 5 of 6; gpt-oss: 1 of 2)."
    )
    # hybrid state-space layers
    num_ssm_layers: int = Field(
        default=0, ge=0, description="State-space (Mamba) layers: no KV cache, a fixed state "
        "per sequence."
    )
    ssm_state_bytes: float = Field(
        default=0.0, ge=0, le=1e12, description="Bytes of one sequence's recurrent state in one SSM layer "
        "(read and written every decode step)."
    )

    @model_validator(mode="after")
    def _check(self) -> "ModelSpec":
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_kv_heads={self.num_kv_heads} must divide num_heads={self.num_heads}"
            )
        if self.num_experts:
            if not 1 <= self.experts_per_token <= self.num_experts:
                raise ValueError(f"experts_per_token: got {self.experts_per_token}, expected "
                                 f"1..num_experts={self.num_experts}")  # fmt: skip
            if self.moe_intermediate_size is None:
                raise ValueError("moe_intermediate_size: missing (needed when num_experts > 0)")
            if self.moe_layers > self.num_layers:
                raise ValueError(f"num_moe_layers: got {self.num_moe_layers}, expected <= "
                                 f"num_layers={self.num_layers}")  # fmt: skip
            if self.routed_params >= self.num_params:
                raise ValueError(
                    f"num_params: {self.num_params:.4g} is not more than the routed experts' "
                    f"{self.routed_params:.4g} parameters (num_moe_layers * num_experts * "
                    f"mlp_matrices * hidden_size * moe_intermediate_size); check both"
                )
        else:
            for f in ("experts_per_token", "num_shared_experts", "moe_intermediate_size",
                      "num_moe_layers", "expert_dtype"):  # fmt: skip
                if getattr(self, f):
                    raise ValueError(f"{f}: set but num_experts is 0 (a dense model)")
        mla = (self.kv_lora_rank, self.qk_rope_head_dim)
        if self.attention == "mla" and None in mla:
            missing = "kv_lora_rank" if mla[0] is None else "qk_rope_head_dim"
            raise ValueError(f"{missing}: missing (needed for attention 'mla')")
        if self.attention == "gqa" and mla != (None, None):
            raise ValueError("kv_lora_rank: set but attention is 'gqa'; use attention: mla")
        if self.streamed_params <= 0:
            raise ValueError(
                f"num_params: {self.num_params:.4g} leaves nothing but the input embedding "
                f"({self.lookup_params:.4g} = vocab_size * hidden_size, untied) and routed "
                f"experts; check num_params, or set tie_word_embeddings"
            )
        if self.num_ssm_layers and not self.ssm_state_bytes:
            raise ValueError("ssm_state_bytes: missing (needed when num_ssm_layers > 0)")
        if self.attention_layers + self.num_ssm_layers > self.num_layers:
            raise ValueError(
                f"num_attention_layers: {self.attention_layers} attention + "
                f"{self.num_ssm_layers} SSM layers exceed num_layers={self.num_layers}"
            )
        if self.attention_layers == 0:  # nothing to hold a KV cache: the block size would be 0
            raise ValueError("num_attention_layers: 0; a model the simulator runs needs at least "
                             "one attention layer (its KV cache)")  # fmt: skip
        if self.num_sliding_layers > self.attention_layers:
            raise ValueError(f"num_sliding_layers: got {self.num_sliding_layers}, expected <= "
                             f"{self.attention_layers} attention layers")  # fmt: skip
        if self.num_sliding_layers and self.sliding_window is None:
            raise ValueError("sliding_window: missing (needed when num_sliding_layers > 0)")
        return self

    # ---- parameters and bytes ----------------------------------------------------------------
    @property
    def moe_layers(self) -> int:
        if not self.num_experts:
            return 0
        return self.num_layers if self.num_moe_layers is None else self.num_moe_layers

    @property
    def attention_layers(self) -> int:
        if self.num_attention_layers is not None:
            return self.num_attention_layers
        return self.num_layers - self.num_ssm_layers

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def routed_expert_params(self) -> float:
        """Parameters of one routed expert in one layer (0 for a dense model)."""
        if not self.num_experts:
            return 0.0
        return float(self.mlp_matrices * self.hidden_size * self.moe_intermediate_size)

    @property
    def routed_params(self) -> float:
        """Parameters of all routed experts of all MoE layers."""
        return self.moe_layers * self.num_experts * self.routed_expert_params

    @property
    def dense_params(self) -> float:
        """Parameters every token uses: everything but the routed experts."""
        return self.num_params - self.routed_params

    @property
    def lookup_params(self) -> float:
        """Parameters of a separate input-embedding table (0 when tied): held, not streamed."""
        return 0.0 if self.tie_word_embeddings else float(self.vocab_size * self.hidden_size)

    @property
    def streamed_params(self) -> float:
        """Dense parameters every step reads and multiplies: dense_params - lookup_params."""
        return self.dense_params - self.lookup_params

    @property
    def active_params(self) -> float:
        """Parameters one token uses: dense + experts_per_token routed experts per MoE layer."""
        return self.dense_params + self.moe_layers * self.experts_per_token * self.routed_expert_params

    @property
    def weight_bytes_per_param(self) -> float:
        return dtype_bytes(self.weight_dtype)

    @property
    def expert_bytes_per_param(self) -> float:
        return dtype_bytes(self.expert_dtype or self.weight_dtype)

    @property
    def weight_bytes(self) -> float:
        """Bytes of all weights (Llama-3.1-8B BF16: 16.06e9 B)."""
        return (self.dense_params * self.weight_bytes_per_param
                + self.routed_params * self.expert_bytes_per_param)  # fmt: skip

    def weight_bytes_per_gpu(self, tp: int = 1, ep: int = 1) -> float:
        """Weight bytes one GPU holds: dense weights split tp ways; routed experts split ep ways
        (whole experts, expert parallelism) or, with ep = 1, tp ways."""
        experts = self.routed_params * self.expert_bytes_per_param
        return (self.weight_bytes - experts) / tp + experts / (ep if ep > 1 else tp)

    @property
    def kv_bytes_per_layer(self) -> float:
        """KV-cache bytes of one token in one attention layer (all heads)."""
        kvb = dtype_bytes(self.kv_dtype)
        if self.attention == "mla":
            return (self.kv_lora_rank + self.qk_rope_head_dim) * kvb
        return 2 * self.num_kv_heads * self.head_dim * kvb

    @property
    def kv_bytes_per_token(self) -> float:
        """KV-cache bytes one token occupies over all layers and all GPUs
        (Llama-3.1-8B BF16: 2 * 32 * 8 * 128 * 2 = 131072 B)."""
        return self.attention_layers * self.kv_bytes_per_layer

    def kv_shards(self, tp: int) -> int:
        """Ways the KV cache is split over a tp group: GQA min(tp, num_kv_heads) (vLLM
        replicates KV heads when tp > num_kv_heads); MLA 1 (every rank keeps the latent)."""
        return 1 if self.attention == "mla" else min(tp, self.num_kv_heads)

    def kv_bytes_per_token_per_gpu(self, tp: int) -> float:
        """KV bytes per token on one GPU of a tp-way group."""
        return self.kv_bytes_per_token / self.kv_shards(tp)

    @property
    def attention_flops_per_pair(self) -> float:
        """FLOPs of one (query, key) pair in one attention layer, all heads: GQA QK^T + PV =
        4 * num_heads * head_dim; MLA (absorbed, as in decode) 2 * num_heads * (2 * kv_lora_rank
        + qk_rope_head_dim)."""
        if self.attention == "mla":
            return 2.0 * self.num_heads * (2 * self.kv_lora_rank + self.qk_rope_head_dim)
        return 4.0 * self.num_heads * self.head_dim

    # ---- parallelism -------------------------------------------------------------------------
    def check_tp(self, tp: int) -> None:
        """Raise ValueError (message starts with `tp:`) unless `tp` shards this model the way
        vLLM does: tp divides num_heads, and tp divides num_kv_heads or is a multiple of it
        (then each GPU holds one replicated KV head)."""
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise ValueError(f"tp: got {tp!r}, expected an integer >= 1")
        if self.num_heads % tp:
            raise ValueError(
                f"tp: {tp} does not divide num_heads={self.num_heads} of model {self.name!r}"
            )
        if self.num_kv_heads % tp and tp % self.num_kv_heads:
            raise ValueError(
                f"tp: {tp} neither divides nor is a multiple of num_kv_heads="
                f"{self.num_kv_heads} of model {self.name!r}"
            )

    def check_parallel(self, tp: int, ep: int = 1, dp: int = 1) -> None:
        """`check_tp`, then ep and dp (messages start with the field): ep > 1 needs a MoE model
        whose experts it divides, and equals tp * dp (vLLM's expert-parallel group spans the
        tensor- and data-parallel ranks); a MoE model with dp > 1 needs ep > 1 (without it vLLM
        shards the experts over tp * dp ranks, not represented here: refused, not mis-sized)."""
        self.check_tp(tp)
        for name, v in (("ep", ep), ("dp", dp)):
            if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 4096:
                raise ValueError(f"{name}: got {v!r}, expected an integer in 1..4096")
        if ep > 1:
            if not self.is_moe:
                raise ValueError(f"ep: {ep} > 1 but model {self.name!r} has no experts")
            if self.num_experts % ep:
                raise ValueError(f"ep: {ep} does not divide num_experts={self.num_experts} "
                                 f"of model {self.name!r}")  # fmt: skip
            if ep != tp * dp:
                raise ValueError(f"ep: {ep} != tp * dp = {tp * dp} (vLLM's expert-parallel "
                                 f"group is all tp * dp GPUs)")  # fmt: skip
        elif dp > 1 and self.is_moe:
            raise ValueError(f"dp: {dp} > 1 without expert parallelism: vLLM then shards the "
                             f"experts tensor-parallel over all tp * dp = {tp * dp} GPUs, which "
                             f"this model does not represent; set ep = {tp * dp}")  # fmt: skip


class HardwareSpec(Config):
    """One accelerator. Rates are datasheet peaks; step models apply their own efficiencies."""

    name: str = Field(description="Preset or device name, used in tables and logs.")
    peak_flops: float = Field(ge=RATE_MIN, le=RATE_MAX, description="Dense BF16 tensor-core peak per GPU, FLOP/s.")
    peak_flops_fp8: float | None = Field(
        default=None, ge=RATE_MIN, le=RATE_MAX, description="Dense FP8 tensor-core peak, FLOP/s (None: no FP8 "
        "tensor cores; FP8 weights then compute at the BF16 rate)."
    )
    peak_flops_fp4: float | None = Field(
        default=None, ge=RATE_MIN, le=RATE_MAX, description="Dense FP4 tensor-core peak, FLOP/s (None: FP4 weights "
        "are dequantized and compute at the BF16 rate, as on Hopper)."
    )
    mem_bandwidth: float = Field(ge=RATE_MIN, le=RATE_MAX, description="HBM bandwidth per GPU, bytes/s.")
    mem_capacity: float = Field(
        ge=RATE_MIN,
        le=1e14,
        description="Device memory per GPU in bytes, as CUDA reports it (what vLLM multiplies "
        "by gpu_memory_utilization).",
    )
    interconnect_bandwidth: float = Field(
        ge=RATE_MIN,
        le=RATE_MAX,
        description="GPU-to-GPU bandwidth per direction per GPU (NVLink), bytes/s; used for "
        "tensor-parallel all-reduce and expert-parallel all-to-all.",
    )
    interconnect_latency: float = Field(
        default=5e-6,
        ge=0,
        le=1.0,
        description="Fixed latency of one small all-reduce, seconds (NCCL/custom all-reduce "
        "over NVLink is a few microseconds).",
    )

    def flops_for(self, dtype: str) -> float:
        """Dense peak FLOP/s for GEMMs with weights in `dtype`: FP8 on FP8 tensor cores and
        FP4 formats on FP4 tensor cores where the GPU has them, else the BF16 peak."""
        if dtype == "fp8" and self.peak_flops_fp8:
            return self.peak_flops_fp8
        if dtype in ("mxfp4", "nvfp4") and self.peak_flops_fp4:
            return self.peak_flops_fp4
        return self.peak_flops
