"""A `ModelSpec` from a model's Hugging Face `config.json` fields (no download: pass the mapping).

    spec = spec_from_hf_config("qwen3-30b-a3b", {"num_hidden_layers": 48, "hidden_size": 2048,
                                ...}, weight_dtype="bf16")

Fields read (a multimodal config's `text_config` is used when present): num_hidden_layers,
hidden_size, num_attention_heads, num_key_value_heads, head_dim, intermediate_size, vocab_size,
tie_word_embeddings; experts: num_experts | n_routed_experts | num_local_experts,
num_experts_per_tok, moe_intermediate_size (else intermediate_size, as Llama-4 and gpt-oss name
the expert width), n_shared_experts, first_k_dense_replace (DeepSeek), interleave_moe_layer_step
and intermediate_size_mlp (Llama-4, which also has one shared expert per MoE layer),
mlp_only_layers and decoder_sparse_step (Qwen-MoE: layer i has experts when step divides i + 1),
shared_expert_intermediate_size (Qwen2-MoE: one gated shared expert of that width); MLA: kv_lora_rank, q_lora_rank, qk_nope_head_dim, qk_rope_head_dim,
v_head_dim; sliding windows: sliding_window with layer_types (gpt-oss) or sliding_window_pattern
(Gemma-3: every n-th layer global), attention_chunk_size (Llama-4: 3 of 4 layers chunked, taken
as a sliding window of that size); hybrid Mamba-2 / attention models (Nemotron-H, Nemotron Nano
v2): hybrid_override_pattern ('M' Mamba-2, '*' attention, '-' MLP block), mamba_num_heads,
mamba_head_dim, ssm_state_size, n_groups, conv_kernel.

Parameters are counted from the shapes (norms and biases left out, < 0.1 %):

    GQA attention   h*H*d + 2*h*K*d + H*d*h
    MLA attention   h*q_lora + q_lora*H*(nope + rope) + h*(kv_lora + rope)
                    + kv_lora*H*(nope + v) + H*v*h          (q_lora absent: h*H*(nope + rope))
    dense MLP       3*h*intermediate
    MoE block       E*3*h*moe_intermediate + shared experts + router h*E
                    (shared: n*3*h*moe_intermediate, or 3*h*shared_expert_intermediate_size + h)
    embeddings      vocab*h, twice unless tie_word_embeddings (the input table then counts
                    in the parameters and memory, not in a step's reads: specs.lookup_params)
    Mamba-2 block   h*(2*I + 2*G*N + nH) + (I + 2*G*N)*conv + I*h      (I = nH * head dim)
    MLP block '-'   2*h*intermediate                               (Nemotron-H: ReLU^2, no gate)

A hybrid model's layers (`num_layers`) are its mixer blocks, Mamba and attention; its MLP blocks
count in the parameters only (Nemotron Nano 9B v2: 56 residual blocks = 27 Mamba + 4 attention
+ 25 MLP, so 31 layers, about the 28 two-block layers of a Llama of the same depth). One
sequence's state in one Mamba layer is nH * head dim * N elements in `ssm_dtype` (vLLM's
`--mamba-ssm-cache-dtype`; float32 in NVIDIA's recipe) plus (conv - 1) * (I + 2*G*N) of
convolution state in the weights' format.

A missing or inconsistent field raises ValueError naming it (`hf_config.<field>: ...`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic import Field, ValidationError, model_validator

from presched.config import Config, format_validation_error
from presched.sim.steptime.dtypes import DType, dtype_bytes
from presched.sim.steptime.specs import ModelSpec


def _field(cfg: Mapping[str, Any], key: str, default: Any = ..., *, minimum: int = 1) -> Any:
    if key not in cfg or cfg[key] is None:
        if default is ...:
            raise ValueError(f"hf_config.{key}: missing")
        return default
    v = cfg[key]
    if isinstance(v, bool) or not isinstance(v, int) or not minimum <= v <= 10**8:
        raise ValueError(f"hf_config.{key}: got {v!r}, expected an integer in {minimum}..1e8")
    return v


def _tied(cfg: Mapping[str, Any]) -> bool:
    """tie_word_embeddings (default false); ValueError naming it unless true or false."""
    tied = cfg.get("tie_word_embeddings", False)
    if not isinstance(tied, bool):
        raise ValueError(f"hf_config.tie_word_embeddings: expected true or false, got {tied!r}")
    return tied


def spec_from_hf_config(
    name: str,
    hf_config: Mapping[str, Any],
    *,
    weight_dtype: str = "bf16",
    expert_dtype: str | None = None,
    kv_dtype: str = "bf16",
    ssm_dtype: str = "bf16",
) -> ModelSpec:
    """The `ModelSpec` of a model given by its config.json fields (module docstring)."""
    if not isinstance(hf_config, Mapping):
        raise ValueError(f"hf_config: expected a mapping of config.json fields, got "
                         f"{type(hf_config).__name__}")  # fmt: skip
    cfg = hf_config.get("text_config") or hf_config
    if not isinstance(cfg, Mapping):
        raise ValueError(f"hf_config.text_config: expected a mapping of config fields, got "
                         f"{type(cfg).__name__}")  # fmt: skip
    if cfg.get("hybrid_override_pattern") is not None:
        return _hybrid_spec(name, cfg, weight_dtype=weight_dtype, kv_dtype=kv_dtype,
                            ssm_dtype=ssm_dtype, expert_dtype=expert_dtype)  # fmt: skip
    L = _field(cfg, "num_hidden_layers")
    h = _field(cfg, "hidden_size")
    H = _field(cfg, "num_attention_heads")
    K = _field(cfg, "num_key_value_heads", H)
    d = _field(cfg, "head_dim", h // H)
    V = _field(cfg, "vocab_size")
    tied = _tied(cfg)
    inter = _field(cfg, "intermediate_size", None)

    # attention
    kv_lora = _field(cfg, "kv_lora_rank", None)
    out: dict[str, Any] = {}
    if kv_lora is not None:
        rope = _field(cfg, "qk_rope_head_dim")
        nope = _field(cfg, "qk_nope_head_dim")
        v_dim = _field(cfg, "v_head_dim")
        q_lora = _field(cfg, "q_lora_rank", None)
        q = h * q_lora + q_lora * H * (nope + rope) if q_lora else h * H * (nope + rope)
        attn = q + h * (kv_lora + rope) + kv_lora * H * (nope + v_dim) + H * v_dim * h
        out |= dict(attention="mla", kv_lora_rank=kv_lora, qk_rope_head_dim=rope,
                    num_kv_heads=H, head_dim=nope + rope)  # fmt: skip
    else:
        attn = h * H * d + 2 * h * K * d + H * d * h
        out |= dict(num_kv_heads=K, head_dim=d)

    # MLPs and experts
    E = next((cfg[k] for k in ("num_experts", "n_routed_experts", "num_local_experts")
              if cfg.get(k)), 0)  # fmt: skip
    llama4 = str(cfg.get("model_type", "")).startswith("llama4")
    if E:
        E = _field({"num_experts": E}, "num_experts")
        k = _field(cfg, "num_experts_per_tok")
        if k > E:
            raise ValueError(f"hf_config.num_experts_per_tok: {k} exceeds {E} experts")
        moe_inter = _field(cfg, "moe_intermediate_size", None) or inter
        if moe_inter is None:
            raise ValueError("hf_config.moe_intermediate_size: missing (and no intermediate_size)")
        shared = _field(cfg, "n_shared_experts", 1 if llama4 else 0, minimum=0)
        shared_inter = _field(cfg, "shared_expert_intermediate_size", None, minimum=0)
        if shared_inter:  # Qwen2-MoE: one shared expert of its own width, with a sigmoid gate
            shared, shared_block = max(shared, 1), 3 * h * shared_inter + h
        else:
            shared_block = shared * 3 * h * moe_inter
        dense_inter = _field(cfg, "intermediate_size_mlp", None) or inter or moe_inter
        if llama4:
            step = _field(cfg, "interleave_moe_layer_step", 1)
            moe_layers, which = len(range(step - 1, L, step)), "interleave_moe_layer_step"
        else:
            first_dense = _field(cfg, "first_k_dense_replace", 0, minimum=0)
            mlp_only = cfg.get("mlp_only_layers") or []
            if not isinstance(mlp_only, (list, tuple)) or not all(
                    type(i) is int and 0 <= i < L for i in mlp_only):  # fmt: skip
                raise ValueError(f"hf_config.mlp_only_layers: expected a list of layer indices in "
                                 f"0..{L - 1}, got {mlp_only!r}")  # fmt: skip
            step = _field(cfg, "decoder_sparse_step", 1)  # Qwen-MoE: layer i MoE if step | i+1
            dense = set(range(first_dense)) | set(mlp_only) | {
                i for i in range(L) if (i + 1) % step}
            moe_layers = L - len(dense)
            which = ("decoder_sparse_step" if step > 1 else "mlp_only_layers" if mlp_only
                     else "first_k_dense_replace")  # fmt: skip
        if not 0 < moe_layers <= L:
            raise ValueError(f"hf_config.{which}: leaves {moe_layers} MoE layers of {L}")
        moe_block = E * 3 * h * moe_inter + shared_block + h * E
        mlp_total = moe_layers * moe_block + (L - moe_layers) * 3 * h * dense_inter
        out |= dict(num_experts=E, experts_per_token=k, num_shared_experts=shared,
                    moe_intermediate_size=moe_inter, num_moe_layers=moe_layers,
                    expert_dtype=expert_dtype)  # fmt: skip
    else:
        if inter is None:
            raise ValueError("hf_config.intermediate_size: missing")
        if expert_dtype is not None:
            raise ValueError("expert_dtype: set but the config has no experts")
        mlp_total = L * 3 * h * inter

    # sliding-window / chunked layers
    window = _field(cfg, "sliding_window", None)
    sliding = 0
    if window is not None and cfg.get("layer_types"):
        types = cfg["layer_types"]
        if not isinstance(types, (list, tuple)) or len(types) != L:
            raise ValueError(f"hf_config.layer_types: expected a list of {L} layer types "
                             f"(num_hidden_layers), got {types!r:.80}")  # fmt: skip
        sliding = sum(t == "sliding_attention" for t in types)
    elif window is not None and cfg.get("sliding_window_pattern"):
        pattern = _field(cfg, "sliding_window_pattern")
        sliding = L - L // pattern
    elif llama4 and cfg.get("attention_chunk_size"):
        window = _field(cfg, "attention_chunk_size")
        sliding = L - L // 4
    if sliding:
        out |= dict(sliding_window=window, num_sliding_layers=sliding)

    params = L * attn + mlp_total + V * h * (1 if tied else 2)
    try:
        return ModelSpec(
            name=name, num_params=float(params), num_layers=L, hidden_size=h, num_heads=H,
            intermediate_size=inter, vocab_size=V, tie_word_embeddings=tied,
            weight_dtype=weight_dtype, kv_dtype=kv_dtype, **out,
        )  # fmt: skip
    except ValidationError as e:  # the ModelSpec built from the config's fields
        raise ValueError(f"hf_config: {format_validation_error(e)}") from None


def _hybrid_spec(name: str, cfg: Mapping[str, Any], *, weight_dtype: str, kv_dtype: str,
                 ssm_dtype: str, expert_dtype: str | None) -> ModelSpec:  # fmt: skip
    """A Nemotron-H style hybrid: one block per character of hybrid_override_pattern."""
    pattern = cfg["hybrid_override_pattern"]
    L = _field(cfg, "num_hidden_layers")
    if not isinstance(pattern, str) or len(pattern) != L or set(pattern) - set("M*-"):
        raise ValueError(
            f"hf_config.hybrid_override_pattern: expected {L} characters (num_hidden_layers), "
            f"each M (Mamba-2), * (attention) or - (MLP), got {pattern!r}"
        )
    if expert_dtype is not None:
        raise ValueError("expert_dtype: set but the config has no experts")
    h, V = _field(cfg, "hidden_size"), _field(cfg, "vocab_size")
    H = _field(cfg, "num_attention_heads")
    K = _field(cfg, "num_key_value_heads", H)
    d = _field(cfg, "head_dim", h // H)
    inter = _field(cfg, "intermediate_size")
    n_mamba, n_attn, n_mlp = pattern.count("M"), pattern.count("*"), pattern.count("-")
    if not n_attn:  # the KV cache, and so the engine's block count, needs attention layers
        raise ValueError("hf_config.hybrid_override_pattern: no attention block ('*'); a "
                         "pure state-space model is not modelled")  # fmt: skip
    ssm = 0.0
    mamba = 0
    if n_mamba:
        nH, hd = _field(cfg, "mamba_num_heads"), _field(cfg, "mamba_head_dim")
        N, G = _field(cfg, "ssm_state_size"), _field(cfg, "n_groups")
        conv = _field(cfg, "conv_kernel")
        inner, xbc = nH * hd, nH * hd + 2 * G * N
        mamba = h * (inner + xbc + nH) + xbc * conv + inner * h
        ssm = nH * hd * N * dtype_bytes(ssm_dtype) + (conv - 1) * xbc * dtype_bytes(weight_dtype)
    attn = h * H * d + 2 * h * K * d + H * d * h
    tied = _tied(cfg)
    params = (n_mamba * mamba + n_attn * attn + n_mlp * 2 * h * inter
              + V * h * (1 if tied else 2))  # fmt: skip
    try:
        return ModelSpec(
            name=name, num_params=float(params), num_layers=n_mamba + n_attn, hidden_size=h,
            num_heads=H, num_kv_heads=K, head_dim=d, intermediate_size=inter, vocab_size=V,
            tie_word_embeddings=tied, weight_dtype=weight_dtype, kv_dtype=kv_dtype, num_attention_layers=n_attn,
            num_ssm_layers=n_mamba, ssm_state_bytes=ssm,
        )  # fmt: skip
    except ValidationError as e:  # the ModelSpec built from the config's fields
        raise ValueError(f"hf_config: {format_validation_error(e)}") from None


class HFModelSpec(Config):
    """A model given inline by its Hugging Face config.json fields (converted on load)."""

    name: str = Field(description="Model name, used in tables and logs.")
    hf_config: dict[str, Any] = Field(
        description="The config.json mapping (fields read: see presched.sim.steptime.hf); "
        "other keys are ignored."
    )
    weight_dtype: DType = Field(default="bf16", description="Format of the non-expert weights.")
    expert_dtype: DType | None = Field(
        default=None, description="Format of the routed experts (None: weight_dtype)."
    )
    kv_dtype: DType = Field(default="bf16", description="Format of the KV cache.")
    ssm_dtype: DType = Field(
        default="bf16", description="Format of a hybrid model's Mamba state (vLLM's "
        "--mamba-ssm-cache-dtype; fp32 in NVIDIA's Nemotron recipe)."
    )

    @model_validator(mode="after")
    def _converts(self) -> "HFModelSpec":
        self.to_spec()  # a missing or inconsistent field fails here, named
        return self

    def to_spec(self) -> ModelSpec:
        return spec_from_hf_config(self.name, self.hf_config, weight_dtype=self.weight_dtype,
                                   expert_dtype=self.expert_dtype, kv_dtype=self.kv_dtype,
                                   ssm_dtype=self.ssm_dtype)  # fmt: skip
