"""Model and hardware descriptions for the analytical step-time models, with named presets.

Units everywhere: bytes, seconds, FLOP/s (floating-point operations per second), bytes/s.

`ModelSpec` is a dense decoder-only transformer (Llama-style, grouped-query attention):

    kv_bytes_per_token = 2 (K and V) * num_layers * num_kv_heads * head_dim * dtype_bytes
    weight_bytes       = num_params * dtype_bytes

`HardwareSpec` is one GPU: dense BF16 tensor-core peak (no sparsity), HBM bandwidth and
capacity, and the per-direction NVLink bandwidth that a tensor-parallel all-reduce uses.

Presets are looked up with `get_model(name)` / `get_hardware(name)`; each preset states its
source next to its numbers.
"""

from __future__ import annotations

from pydantic import Field, model_validator

from presched.config import Config
from presched.registry import UnknownNameError

GIB = 2**30
MIB = 2**20


class ModelSpec(Config):
    """Shape of a dense transformer, enough for FLOP and byte counts."""

    name: str = Field(description="Preset or model name, used in tables and logs.")
    num_params: float = Field(gt=0, description="Total parameters (embeddings included).")
    num_layers: int = Field(gt=0, description="Transformer blocks.")
    hidden_size: int = Field(gt=0, description="Residual-stream width (d_model).")
    num_heads: int = Field(gt=0, description="Attention (query) heads.")
    num_kv_heads: int = Field(gt=0, description="Key/value heads (grouped-query attention).")
    head_dim: int = Field(gt=0, description="Dimension of one attention head.")
    intermediate_size: int | None = Field(
        default=None, gt=0, description="MLP inner width; informational, not used in FLOP counts."
    )
    vocab_size: int = Field(gt=0, description="Tokenizer vocabulary size.")
    dtype_bytes: float = Field(
        default=2, gt=0, description="Bytes per weight and per KV-cache element (2 for BF16/FP16)."
    )

    @model_validator(mode="after")
    def _check_heads(self) -> "ModelSpec":
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_kv_heads={self.num_kv_heads} must divide num_heads={self.num_heads}"
            )
        return self

    @property
    def kv_bytes_per_token(self) -> float:
        """KV-cache bytes one token occupies over all layers and all GPUs:
        2 * num_layers * num_kv_heads * head_dim * dtype_bytes (Llama-3.1-8B: 131072 B)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.dtype_bytes

    @property
    def weight_bytes(self) -> float:
        """Bytes of all weights: num_params * dtype_bytes (Llama-3.1-8B BF16: 16.06e9 B)."""
        return self.num_params * self.dtype_bytes

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

    def kv_bytes_per_token_per_gpu(self, tp: int) -> float:
        """KV bytes per token on one GPU of a tp-way group: each GPU keeps
        max(num_kv_heads / tp, 1) heads (vLLM replicates KV heads when tp > num_kv_heads)."""
        return self.kv_bytes_per_token / min(tp, self.num_kv_heads)


class HardwareSpec(Config):
    """One accelerator. Rates are datasheet peaks; step models apply their own efficiencies."""

    name: str = Field(description="Preset or device name, used in tables and logs.")
    peak_flops: float = Field(gt=0, description="Dense BF16 tensor-core peak per GPU, FLOP/s.")
    mem_bandwidth: float = Field(gt=0, description="HBM bandwidth per GPU, bytes/s.")
    mem_capacity: float = Field(
        gt=0,
        description="Device memory per GPU in bytes, as CUDA reports it (what vLLM multiplies "
        "by gpu_memory_utilization).",
    )
    interconnect_bandwidth: float = Field(
        gt=0,
        description="GPU-to-GPU bandwidth per direction per GPU (NVLink), bytes/s; used for "
        "tensor-parallel all-reduce.",
    )
    interconnect_latency: float = Field(
        default=5e-6,
        ge=0,
        description="Fixed latency of one small all-reduce, seconds (NCCL/custom all-reduce "
        "over NVLink is a few microseconds).",
    )


# Sources: the models' Hugging Face `config.json` (meta-llama/<name>); parameter counts from
# the model cards / safetensors index (8.03B, 70.6B, 405.9B, 1.24B, 3.21B).
MODEL_PRESETS: dict[str, ModelSpec] = {
    m.name: m
    for m in [
        # meta-llama/Llama-3.2-1B(-Instruct): 16 layers, d 2048, 32 q / 8 kv heads of 64,
        # MLP 8192, vocab 128256, tied embeddings, 1.24e9 params.
        ModelSpec(
            name="llama-3.2-1b", num_params=1.24e9, num_layers=16, hidden_size=2048,
            num_heads=32, num_kv_heads=8, head_dim=64, intermediate_size=8192,
            vocab_size=128256,
        ),
        # meta-llama/Llama-3.2-3B(-Instruct): 28 layers, d 3072, 24 q / 8 kv heads of 128,
        # MLP 8192, vocab 128256, tied embeddings, 3.21e9 params.
        ModelSpec(
            name="llama-3.2-3b", num_params=3.21e9, num_layers=28, hidden_size=3072,
            num_heads=24, num_kv_heads=8, head_dim=128, intermediate_size=8192,
            vocab_size=128256,
        ),
        # meta-llama/Llama-3.1-8B(-Instruct): 32 layers, d 4096, 32 q / 8 kv heads of 128,
        # MLP 14336, vocab 128256, 8.03e9 params.
        ModelSpec(
            name="llama-3.1-8b", num_params=8.03e9, num_layers=32, hidden_size=4096,
            num_heads=32, num_kv_heads=8, head_dim=128, intermediate_size=14336,
            vocab_size=128256,
        ),
        # meta-llama/Llama-3.1-70B(-Instruct) (Llama-3.3-70B has the same shape): 80 layers,
        # d 8192, 64 q / 8 kv heads of 128, MLP 28672, vocab 128256, 70.6e9 params.
        ModelSpec(
            name="llama-3.1-70b", num_params=70.6e9, num_layers=80, hidden_size=8192,
            num_heads=64, num_kv_heads=8, head_dim=128, intermediate_size=28672,
            vocab_size=128256,
        ),
        # meta-llama/Llama-3.1-405B(-Instruct), BF16: 126 layers, d 16384, 128 q / 8 kv heads
        # of 128, MLP 53248, vocab 128256, 405.9e9 params (needs > 8 x 80 GB in BF16).
        ModelSpec(
            name="llama-3.1-405b", num_params=405.9e9, num_layers=126, hidden_size=16384,
            num_heads=128, num_kv_heads=8, head_dim=128, intermediate_size=53248,
            vocab_size=128256,
        ),
    ]
}

# Sources: NVIDIA datasheets (dense = without structured sparsity, i.e. half the headline
# "with sparsity" tensor number). mem_capacity is the total that nvidia-smi / CUDA report
# (slightly below the marketing GB figure), since vLLM's budget is util * that total.
# NVLink bandwidth in the datasheets is bidirectional; we store one direction (half).
HARDWARE_PRESETS: dict[str, HardwareSpec] = {
    h.name: h
    for h in [
        # A100 SXM4 80GB datasheet: BF16 312 TFLOP/s dense, HBM2e 2,039 GB/s, 80 GB
        # (nvidia-smi: 81920 MiB), NVLink 3 600 GB/s bidirectional.
        HardwareSpec(
            name="a100-80gb", peak_flops=312e12, mem_bandwidth=2.039e12,
            mem_capacity=81920 * MIB, interconnect_bandwidth=300e9,
        ),
        # H100 SXM5 datasheet: BF16 1,979 TFLOP/s with sparsity -> 989.4 dense, HBM3 3.35 TB/s,
        # 80 GB (nvidia-smi: 81559 MiB), NVLink 4 900 GB/s bidirectional.
        HardwareSpec(
            name="h100-sxm", peak_flops=989.4e12, mem_bandwidth=3.35e12,
            mem_capacity=81559 * MIB, interconnect_bandwidth=450e9,
        ),
        # H200 SXM datasheet: same compute as H100 SXM (989 TFLOP/s dense BF16), HBM3e
        # 4.8 TB/s, 141 GB (nvidia-smi: 143771 MiB), NVLink 4 900 GB/s bidirectional.
        HardwareSpec(
            name="h200", peak_flops=989.4e12, mem_bandwidth=4.8e12,
            mem_capacity=143771 * MIB, interconnect_bandwidth=450e9,
        ),
        # B200 (HGX/DGX B200) datasheet: BF16 4.5 PFLOP/s with sparsity -> 2.25 dense, HBM3e
        # 8 TB/s (DGX: 64 TB/s for 8), 180 GB (nvidia-smi ~ 183359 MiB), NVLink 5 1.8 TB/s
        # bidirectional. Less certain than the others: B200 SKUs differ in power and clocks.
        HardwareSpec(
            name="b200", peak_flops=2.25e15, mem_bandwidth=8.0e12,
            mem_capacity=183359 * MIB, interconnect_bandwidth=900e9,
        ),
    ]
}


def get_model(name: str) -> ModelSpec:
    """The preset `ModelSpec` called `name`; UnknownNameError (a ValueError) lists the known names."""
    try:
        return MODEL_PRESETS[name]
    except KeyError:
        known = ", ".join(sorted(MODEL_PRESETS))
        raise UnknownNameError(f"unknown model preset {name!r}; known: {known}") from None


def get_hardware(name: str) -> HardwareSpec:
    """The preset `HardwareSpec` called `name`; UnknownNameError (a ValueError) lists the known names."""
    try:
        return HARDWARE_PRESETS[name]
    except KeyError:
        known = ", ".join(sorted(HARDWARE_PRESETS))
        raise UnknownNameError(f"unknown hardware preset {name!r}; known: {known}") from None
