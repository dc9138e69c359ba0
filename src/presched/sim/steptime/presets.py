"""Named model and hardware presets, and their lookups `get_model` / `get_hardware`.

Models: the Llama-3.x rows are written out as `ModelSpec`s (the step-time defaults were fitted
on them); the others are built by `hf.spec_from_hf_config` from the values of the model's
published Hugging Face `config.json` (quoted next to each; nothing is downloaded). Each preset
states its source; `tests/sim/steptime/` checks the parameter counts against the model cards.
"""

from __future__ import annotations

from presched.registry import UnknownNameError
from presched.sim.steptime.hf import spec_from_hf_config
from presched.sim.steptime.specs import MIB, HardwareSpec, ModelSpec

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
            vocab_size=128256, tie_word_embeddings=True,
        ),
        # meta-llama/Llama-3.2-3B(-Instruct): 28 layers, d 3072, 24 q / 8 kv heads of 128,
        # MLP 8192, vocab 128256, tied embeddings, 3.21e9 params.
        ModelSpec(
            name="llama-3.2-3b", num_params=3.21e9, num_layers=28, hidden_size=3072,
            num_heads=24, num_kv_heads=8, head_dim=128, intermediate_size=8192,
            vocab_size=128256, tie_word_embeddings=True,
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

# From config.json (Hugging Face model repos named in each comment); parameter counts are
# computed from these shapes (hf.py) and agree with the model cards within ~1 %.
_HF_PRESETS: list[tuple[str, dict, dict]] = [
    # meta-llama/Llama-3.1-405B-Instruct-FP8 (FBGEMM FP8 linear weights, BF16 KV cache).
    ("llama-3.1-405b-fp8", dict(num_hidden_layers=126, hidden_size=16384,
     num_attention_heads=128, num_key_value_heads=8, head_dim=128, intermediate_size=53248,
     vocab_size=128256), dict(weight_dtype="fp8")),
    # meta-llama/Llama-4-Scout-17B-16E-Instruct text_config: 48 layers, d 5120, 40 q / 8 kv
    # heads of 128, 16 experts top-1 of width 8192 plus one shared expert, every layer MoE
    # (interleave_moe_layer_step 1), attention_chunk_size 8192, vocab 202048; 109B / 17B active
    # (model card, vision tower included).
    ("llama-4-scout", dict(model_type="llama4_text", num_hidden_layers=48, hidden_size=5120,
     num_attention_heads=40, num_key_value_heads=8, head_dim=128, intermediate_size=8192,
     intermediate_size_mlp=16384, num_local_experts=16, num_experts_per_tok=1,
     interleave_moe_layer_step=1, attention_chunk_size=8192, vocab_size=202048), {}),
    # meta-llama/Llama-4-Maverick-17B-128E-Instruct-FP8 text_config: as Scout but 128 experts,
    # MoE every other layer (interleave_moe_layer_step 2; the others a dense MLP of 16384);
    # 400B / 17B active. FP8 experts; the other weights are taken as BF16 (approximation).
    ("llama-4-maverick-fp8", dict(model_type="llama4_text", num_hidden_layers=48,
     hidden_size=5120, num_attention_heads=40, num_key_value_heads=8, head_dim=128,
     intermediate_size=8192, intermediate_size_mlp=16384, num_local_experts=128,
     num_experts_per_tok=1, interleave_moe_layer_step=2, attention_chunk_size=8192,
     vocab_size=202048), dict(expert_dtype="fp8")),
    # google/gemma-3-12b-it text_config: 48 layers, d 3840, 16 q / 8 kv heads of 256, MLP
    # 15360, sliding_window 1024 on 5 of 6 layers (sliding_window_pattern 6), vocab 262208,
    # tied embeddings; 12.2B with the 0.4B vision tower.
    ("gemma-3-12b", dict(num_hidden_layers=48, hidden_size=3840, num_attention_heads=16,
     num_key_value_heads=8, head_dim=256, intermediate_size=15360, sliding_window=1024,
     sliding_window_pattern=6, vocab_size=262208, tie_word_embeddings=True), {}),
    # google/gemma-3-27b-it text_config: 62 layers, d 5376, 32 q / 16 kv heads of 128, MLP
    # 21504, sliding_window 1024, pattern 6, vocab 262208, tied; 27B.
    ("gemma-3-27b", dict(num_hidden_layers=62, hidden_size=5376, num_attention_heads=32,
     num_key_value_heads=16, head_dim=128, intermediate_size=21504, sliding_window=1024,
     sliding_window_pattern=6, vocab_size=262208, tie_word_embeddings=True), {}),
    # Qwen/Qwen3-8B: 36 layers, d 4096, 32 q / 8 kv heads of 128, MLP 12288, vocab 151936;
    # 8.2B.
    ("qwen3-8b", dict(num_hidden_layers=36, hidden_size=4096, num_attention_heads=32,
     num_key_value_heads=8, head_dim=128, intermediate_size=12288, vocab_size=151936), {}),
    # Qwen/Qwen3-14B: 40 layers, d 5120, 40 q / 8 kv heads of 128, MLP 17408; 14.8B.
    ("qwen3-14b", dict(num_hidden_layers=40, hidden_size=5120, num_attention_heads=40,
     num_key_value_heads=8, head_dim=128, intermediate_size=17408, vocab_size=151936), {}),
    # Qwen/Qwen3-32B: 64 layers, d 5120, 64 q / 8 kv heads of 128, MLP 25600; 32.8B.
    ("qwen3-32b", dict(num_hidden_layers=64, hidden_size=5120, num_attention_heads=64,
     num_key_value_heads=8, head_dim=128, intermediate_size=25600, vocab_size=151936), {}),
    # Qwen/Qwen3-30B-A3B(-Instruct-2507): 48 layers, d 2048, 32 q / 4 kv heads of 128,
    # 128 experts top-8 of width 768 (moe_intermediate_size), all layers MoE; 30.5B / 3.3B.
    ("qwen3-30b-a3b", dict(num_hidden_layers=48, hidden_size=2048, num_attention_heads=32,
     num_key_value_heads=4, head_dim=128, intermediate_size=6144, moe_intermediate_size=768,
     num_experts=128, num_experts_per_tok=8, vocab_size=151936), {}),
    # Qwen/Qwen3-235B-A22B(-Instruct-2507): 94 layers, d 4096, 64 q / 4 kv heads of 128,
    # 128 experts top-8 of width 1536; 235B / 22B active. The -FP8 repo: FP8 weights.
    ("qwen3-235b-a22b", dict(num_hidden_layers=94, hidden_size=4096, num_attention_heads=64,
     num_key_value_heads=4, head_dim=128, intermediate_size=12288, moe_intermediate_size=1536,
     num_experts=128, num_experts_per_tok=8, vocab_size=151936), {}),
    ("qwen3-235b-a22b-fp8", dict(num_hidden_layers=94, hidden_size=4096,
     num_attention_heads=64, num_key_value_heads=4, head_dim=128, intermediate_size=12288,
     moe_intermediate_size=1536, num_experts=128, num_experts_per_tok=8, vocab_size=151936),
     dict(weight_dtype="fp8")),
    # deepseek-ai/DeepSeek-V3 (also V3.1, R1-0528): 61 layers, d 7168, 128 heads, MLA with
    # q_lora_rank 1536, kv_lora_rank 512, qk_nope 128 / qk_rope 64, v_head_dim 128; 256
    # routed experts top-8 of width 2048 + 1 shared, first_k_dense_replace 3 (dense MLP 18432),
    # vocab 129280; FP8 weights (block-scaled); 671B / 37B active (MTP module not counted).
    ("deepseek-v3", dict(num_hidden_layers=61, hidden_size=7168, num_attention_heads=128,
     num_key_value_heads=128, intermediate_size=18432, moe_intermediate_size=2048,
     n_routed_experts=256, n_shared_experts=1, num_experts_per_tok=8, first_k_dense_replace=3,
     q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
     v_head_dim=128, vocab_size=129280), dict(weight_dtype="fp8")),
    # Qwen/Qwen3-Coder-480B-A35B-Instruct: 62 layers, d 6144, 96 q / 8 kv heads of 128, 160
    # experts top-8 of width 2560, all layers MoE, vocab 151936; 480B / 35B active. The -FP8
    # repo: FP8 weights (block-scaled, 128).
    ("qwen3-coder-480b-a35b", dict(num_hidden_layers=62, hidden_size=6144,
     num_attention_heads=96, num_key_value_heads=8, head_dim=128, intermediate_size=8192,
     moe_intermediate_size=2560, num_experts=160, num_experts_per_tok=8, vocab_size=151936),
     {}),
    ("qwen3-coder-480b-a35b-fp8", dict(num_hidden_layers=62, hidden_size=6144,
     num_attention_heads=96, num_key_value_heads=8, head_dim=128, intermediate_size=8192,
     moe_intermediate_size=2560, num_experts=160, num_experts_per_tok=8, vocab_size=151936),
     dict(weight_dtype="fp8")),
    # nvidia/NVIDIA-Nemotron-Nano-9B-v2 (Nemotron-H hybrid): 56 blocks, pattern below (27
    # Mamba-2, 4 attention, 25 ReLU^2 MLP), d 4480, 40 q / 8 kv heads of 128, MLP 15680, Mamba
    # 128 heads of 80, state 128, 8 groups, conv 4, vocab 131072, untied; 8.89B. The SSM state
    # in FP32 (`--mamba-ssm-cache-dtype float32`, NVIDIA's vLLM recipe and ML.ENERGY's runs).
    ("nemotron-nano-9b-v2", dict(num_hidden_layers=56, hidden_size=4480,
     num_attention_heads=40, num_key_value_heads=8, head_dim=128, intermediate_size=15680,
     hybrid_override_pattern="M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-",
     mamba_num_heads=128, mamba_head_dim=80, ssm_state_size=128, n_groups=8, conv_kernel=4,
     vocab_size=131072), dict(ssm_dtype="fp32")),
    # nvidia/NVIDIA-Nemotron-Nano-12B-v2: 62 blocks (28 Mamba-2, 6 attention, 28 MLP), d 5120,
    # MLP 20480, otherwise as 9B; 12.31B.
    ("nemotron-nano-12b-v2", dict(num_hidden_layers=62, hidden_size=5120,
     num_attention_heads=40, num_key_value_heads=8, head_dim=128, intermediate_size=20480,
     hybrid_override_pattern="M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M*-M-M-M-M-",
     mamba_num_heads=128, mamba_head_dim=80, ssm_state_size=128, n_groups=8, conv_kernel=4,
     vocab_size=131072), dict(ssm_dtype="fp32")),
    # openai/gpt-oss-120b: 36 layers, d 2880, 64 q / 8 kv heads of 64, 128 experts top-4 of
    # width 2880, sliding_window 128 on alternate layers (layer_types), vocab 201088; MXFP4
    # experts, BF16 rest; 116.8B / 5.1B active.
    ("gpt-oss-120b", dict(num_hidden_layers=36, hidden_size=2880, num_attention_heads=64,
     num_key_value_heads=8, head_dim=64, intermediate_size=2880, num_local_experts=128,
     num_experts_per_tok=4, sliding_window=128,
     layer_types=["sliding_attention", "full_attention"] * 18, vocab_size=201088),
     dict(expert_dtype="mxfp4")),
    # openai/gpt-oss-20b: 24 layers, 32 experts top-4, otherwise as 120b; 20.9B / 3.6B.
    ("gpt-oss-20b", dict(num_hidden_layers=24, hidden_size=2880, num_attention_heads=64,
     num_key_value_heads=8, head_dim=64, intermediate_size=2880, num_local_experts=32,
     num_experts_per_tok=4, sliding_window=128,
     layer_types=["sliding_attention", "full_attention"] * 12, vocab_size=201088),
     dict(expert_dtype="mxfp4")),
]
for _name, _cfg, _dtypes in _HF_PRESETS:
    MODEL_PRESETS[_name] = spec_from_hf_config(_name, _cfg, **_dtypes)
# meta-llama/Llama-3.3-70B-Instruct: the Llama-3.1-70B architecture (same config.json shapes)
MODEL_PRESETS["llama-3.3-70b"] = MODEL_PRESETS["llama-3.1-70b"].model_copy(
    update={"name": "llama-3.3-70b"})

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
        # H100 SXM5 datasheet: BF16 1,979 TFLOP/s with sparsity -> 989.4 dense (FP8 3,958 ->
        # 1,979 dense), HBM3 3.35 TB/s,
        # 80 GB (nvidia-smi: 81559 MiB), NVLink 4 900 GB/s bidirectional.
        HardwareSpec(
            name="h100-sxm", peak_flops=989.4e12, peak_flops_fp8=1978.9e12, mem_bandwidth=3.35e12,
            mem_capacity=81559 * MIB, interconnect_bandwidth=450e9,
        ),
        # H200 SXM datasheet: same compute as H100 SXM (989 TFLOP/s dense BF16, 1,979 FP8), HBM3e
        # 4.8 TB/s, 141 GB (nvidia-smi: 143771 MiB), NVLink 4 900 GB/s bidirectional.
        HardwareSpec(
            name="h200", peak_flops=989.4e12, peak_flops_fp8=1978.9e12, mem_bandwidth=4.8e12,
            mem_capacity=143771 * MIB, interconnect_bandwidth=450e9,
        ),
        # B200 (HGX/DGX B200) datasheet: BF16 4.5 PFLOP/s with sparsity -> 2.25 dense (FP8 9 ->
        # 4.5, FP4 18 -> 9 dense), HBM3e
        # 8 TB/s (DGX: 64 TB/s for 8), 180 GB (nvidia-smi ~ 183359 MiB), NVLink 5 1.8 TB/s
        # bidirectional. Less certain than the others: B200 SKUs differ in power and clocks.
        HardwareSpec(
            name="b200", peak_flops=2.25e15, peak_flops_fp8=4.5e15, peak_flops_fp4=9e15,
            mem_bandwidth=8.0e12,
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


# Roofline knobs fitted on public measurements, one set per family (`StepTimeConfig.knobs`
# fills in the knobs a config leaves unset). The default knobs were fitted on Llama-3.1-8B on one
# H100 and miss mixture-of-experts deployments by a median 21 % (H100) and 39 % (B200) of
# median ITL on ML.ENERGY's leaderboard (ml-energy/leaderboard 0cd52da, LLM tasks: 306 MoE
# configurations, 7 architectures on H100 and 8 on B200). These are the knobs that
# benchmarks/steptime_vs_mlenergy.py fits on every MoE architecture of one GPU (its
# `family_knobs`, the one-standard-error rule's knob set; run of 2026-12-07, night, with the
# untied input embedding looked up, not read); fitted so on all but one, they miss that one by
# a median 19 % (H100) and 23 % (B200): docs/steptime.md. An empirical calibration of vLLM 0.11's
# MoE serving on those GPUs, not physical constants (B200's memory efficiency 0.46 is what its
# MoE decode steps reach, not what HBM3e can do).
KNOB_PRESETS: dict[str, dict[str, float]] = {
    "mlenergy-moe-h100": dict(step_overhead=2.76e-3, overhead_per_decode=67.2e-6,
                              memory_efficiency=0.985, collective_latency=41.1e-6,
                              compute_efficiency=0.5, overhead_per_layer=0.0),
    "mlenergy-moe-b200": dict(step_overhead=0.189e-3, overhead_per_decode=55.2e-6,
                              memory_efficiency=0.456, collective_latency=28.5e-6,
                              compute_efficiency=0.5, overhead_per_layer=0.0),
}


# Hugging Face model ids (as ML.ENERGY and vLLM name them) -> preset. Fine-tunes and
# instruct/thinking/coder variants share their base model's config.json shape.
HF_MODEL_IDS: dict[str, str] = {
    "meta-llama/Llama-3.2-1B-Instruct": "llama-3.2-1b",
    "meta-llama/Llama-3.2-3B-Instruct": "llama-3.2-3b",
    "meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b",
    "meta-llama/Llama-3.1-70B-Instruct": "llama-3.1-70b",
    "meta-llama/Llama-3.3-70B-Instruct": "llama-3.3-70b",
    "meta-llama/Llama-3.1-405B-Instruct": "llama-3.1-405b",
    "meta-llama/Llama-3.1-405B-Instruct-FP8": "llama-3.1-405b-fp8",
    "meta-llama/Llama-4-Scout-17B-16E-Instruct": "llama-4-scout",
    "meta-llama/Llama-4-Maverick-17B-128E-Instruct-FP8": "llama-4-maverick-fp8",
    "google/gemma-3-12b-it": "gemma-3-12b",
    "google/gemma-3-27b-it": "gemma-3-27b",
    "Qwen/Qwen3-8B": "qwen3-8b",
    "Qwen/Qwen3-14B": "qwen3-14b",
    "Qwen/Qwen3-32B": "qwen3-32b",
    "Qwen/Qwen3-30B-A3B-Instruct-2507": "qwen3-30b-a3b",
    "Qwen/Qwen3-30B-A3B-Thinking-2507": "qwen3-30b-a3b",
    "Qwen/Qwen3-Coder-30B-A3B-Instruct": "qwen3-30b-a3b",
    "Qwen/Qwen3-235B-A22B-Instruct-2507": "qwen3-235b-a22b",
    "Qwen/Qwen3-235B-A22B-Thinking-2507": "qwen3-235b-a22b",
    "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8": "qwen3-235b-a22b-fp8",
    "Qwen/Qwen3-235B-A22B-Thinking-2507-FP8": "qwen3-235b-a22b-fp8",
    "Qwen/Qwen3-Coder-480B-A35B-Instruct": "qwen3-coder-480b-a35b",
    "Qwen/Qwen3-Coder-480B-A35B-Instruct-FP8": "qwen3-coder-480b-a35b-fp8",
    "nvidia/NVIDIA-Nemotron-Nano-9B-v2": "nemotron-nano-9b-v2",
    "nvidia/NVIDIA-Nemotron-Nano-12B-v2": "nemotron-nano-12b-v2",
    "deepseek-ai/DeepSeek-V3": "deepseek-v3",
    "deepseek-ai/DeepSeek-V3.1": "deepseek-v3",
    "deepseek-ai/DeepSeek-R1-0528": "deepseek-v3",
    "openai/gpt-oss-20b": "gpt-oss-20b",
    "openai/gpt-oss-120b": "gpt-oss-120b",
}

# GPU names as ML.ENERGY writes them (gpu_model) -> hardware preset.
GPU_NAMES: dict[str, str] = {"A100": "a100-80gb", "H100": "h100-sxm", "H200": "h200",
                             "B200": "b200"}  # fmt: skip
