"""Model families: presets from config.json values against the model cards, dtypes, MLA, MoE
parameter split, the inline config.json path and its refusals (each naming the field)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from presched.config import format_validation_error
from presched.sim.steptime import MODEL_PRESETS, StepTimeConfig, get_model
from presched.sim.steptime.hf import spec_from_hf_config
from presched.sim.steptime.specs import ModelSpec

LLAMA_8B_CONFIG = dict(num_hidden_layers=32, hidden_size=4096, num_attention_heads=32,
                       num_key_value_heads=8, head_dim=128, intermediate_size=14336,
                       vocab_size=128256)  # fmt: skip


# (preset, total params, active params) from the model cards; rel tolerance
@pytest.mark.parametrize("name,total,active,rel", [
    ("qwen3-8b", 8.2e9, 8.2e9, 0.01),
    ("qwen3-14b", 14.8e9, 14.8e9, 0.01),
    ("qwen3-32b", 32.8e9, 32.8e9, 0.01),
    ("qwen3-30b-a3b", 30.5e9, 3.3e9, 0.02),
    ("qwen3-235b-a22b", 235e9, 22e9, 0.01),
    ("deepseek-v3", 671e9, 37e9, 0.02),
    ("gpt-oss-20b", 20.9e9, 3.6e9, 0.17),  # card's active count leaves out one embedding
    ("gpt-oss-120b", 116.8e9, 5.1e9, 0.12),
    ("llama-4-scout", 109e9, 17e9, 0.02),  # cards include the ~1 B vision tower
    ("llama-4-maverick-fp8", 400e9, 17e9, 0.02),
    ("gemma-3-12b", 12.2e9, 12.2e9, 0.04),  # card includes the 0.4 B vision tower
    ("gemma-3-27b", 27e9, 27e9, 0.02),
    ("qwen3-coder-480b-a35b", 480e9, 35e9, 0.02),
    ("nemotron-nano-9b-v2", 8.89e9, 8.89e9, 0.002),
    ("nemotron-nano-12b-v2", 12.31e9, 12.31e9, 0.002),
])  # fmt: skip
def test_presets_match_the_model_cards(name, total, active, rel):
    m = get_model(name)
    assert m.num_params == pytest.approx(total, rel=rel)
    assert m.active_params == pytest.approx(active, rel=rel)
    assert m.is_moe == (total != active)


def test_hf_converter_reproduces_the_llama_preset():
    m = spec_from_hf_config("x", LLAMA_8B_CONFIG)
    ref = get_model("llama-3.1-8b")
    assert m.num_params == pytest.approx(ref.num_params, rel=1e-3)
    assert m.kv_bytes_per_token == ref.kv_bytes_per_token == 131072
    assert m.active_params == m.num_params and m.routed_params == 0


def test_fp8_halves_weight_bytes():
    bf16 = spec_from_hf_config("405b", dict(
        num_hidden_layers=126, hidden_size=16384, num_attention_heads=128, num_key_value_heads=8,
        head_dim=128, intermediate_size=53248, vocab_size=128256))  # fmt: skip
    fp8 = get_model("llama-3.1-405b-fp8")
    assert fp8.weight_bytes == pytest.approx(0.5 * bf16.weight_bytes, rel=1e-12)
    assert fp8.kv_bytes_per_token == bf16.kv_bytes_per_token  # KV stays BF16
    assert get_model("qwen3-235b-a22b-fp8").weight_bytes == pytest.approx(
        0.5 * get_model("qwen3-235b-a22b").weight_bytes, rel=1e-12)


def test_mxfp4_experts_and_bf16_rest():
    m = get_model("gpt-oss-120b")
    assert m.expert_dtype == "mxfp4" and m.weight_dtype == "bf16"
    assert m.weight_bytes == pytest.approx(m.dense_params * 2 + m.routed_params * 4.25 / 8)
    assert 60e9 < m.weight_bytes < 68e9  # the published checkpoint is ~65 GB
    assert m.routed_expert_params == 3 * 2880 * 2880


def test_nvfp4_and_fp8_kv_dtypes():
    m = spec_from_hf_config("x", LLAMA_8B_CONFIG, weight_dtype="nvfp4", kv_dtype="fp8")
    assert m.weight_bytes == pytest.approx(m.num_params * 4.5 / 8)
    assert m.kv_bytes_per_token == 131072 / 2


def test_mla_kv_bytes_from_the_latent():
    m = get_model("deepseek-v3")
    assert m.attention == "mla"
    assert m.kv_bytes_per_layer == (512 + 64) * 2
    assert m.kv_bytes_per_token == 61 * 576 * 2  # 70,272 B, ~1/7 of a GQA-8 Llama-70B token
    assert m.kv_shards(8) == 1 and m.kv_bytes_per_token_per_gpu(8) == m.kv_bytes_per_token
    assert m.moe_layers == 58 and m.num_shared_experts == 1


def test_sliding_layers_counted_from_the_pattern():
    assert get_model("gemma-3-27b").num_sliding_layers == 62 - 10
    assert get_model("gemma-3-12b").num_sliding_layers == 40
    assert get_model("gpt-oss-120b").num_sliding_layers == 18
    assert get_model("llama-4-scout").sliding_window == 8192


PATTERN_9B = "M-M-M-MM-M-M-M*-M-M-M*-M-M-M-M*-M-M-M-M*-M-MM-M-M-M-M-M-"
NEMOTRON_9B = dict(num_hidden_layers=56, hidden_size=4480, num_attention_heads=40,
                   num_key_value_heads=8, head_dim=128, intermediate_size=15680,
                   hybrid_override_pattern=PATTERN_9B, mamba_num_heads=128, mamba_head_dim=80,
                   ssm_state_size=128, n_groups=8, conv_kernel=4, vocab_size=131072)  # fmt: skip


def test_hybrid_blocks_state_and_kv_from_the_pattern():
    m = spec_from_hf_config("n9", NEMOTRON_9B, ssm_dtype="fp32")
    assert (m.num_ssm_layers, m.attention_layers, m.num_layers) == (27, 4, 31)  # mixers
    # per sequence and Mamba layer: 128 heads x 80 x state 128 in fp32, conv (4 - 1) x
    # (10240 + 2 x 8 x 128) in bf16
    assert m.ssm_state_bytes == 128 * 80 * 128 * 4 + 3 * (10240 + 2048) * 2
    assert m.kv_bytes_per_token == 4 * 2 * 8 * 128 * 2  # only the 4 attention layers
    bf16 = spec_from_hf_config("n9", NEMOTRON_9B)
    assert bf16.ssm_state_bytes == 128 * 80 * 128 * 2 + 3 * (10240 + 2048) * 2
    assert bf16.num_params == m.num_params == get_model("nemotron-nano-9b-v2").num_params
    assert get_model("nemotron-nano-9b-v2").ssm_state_bytes == m.ssm_state_bytes  # the preset


@pytest.mark.parametrize("pattern,why", [
    ("M-*", "expected 56 characters"),
    (PATTERN_9B.replace("-", "E", 1), "expected 56 characters"),  # MoE blocks: not modelled
    (PATTERN_9B.replace("*", "M"), "no attention block"),
])  # fmt: skip
def test_hybrid_pattern_refused_naming_the_field(pattern, why):
    with pytest.raises(ValueError, match=f"hf_config.hybrid_override_pattern: {why}"):
        spec_from_hf_config("n9", {**NEMOTRON_9B, "hybrid_override_pattern": pattern})


def test_mlp_only_layers_counts_distinct_layers_beyond_the_first_dense_ones():
    cfg = {**LLAMA_8B_CONFIG, "num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 1024}
    assert spec_from_hf_config("x", {**cfg, "mlp_only_layers": [0, 0, 5]}).num_moe_layers == 30
    assert spec_from_hf_config("x", {**cfg, "first_k_dense_replace": 2, "mlp_only_layers": [1, 5]}).num_moe_layers == 29


QWEN15_MOE = dict(num_hidden_layers=24, hidden_size=2048, num_attention_heads=16,
                  num_key_value_heads=16, intermediate_size=5632, moe_intermediate_size=1408,
                  shared_expert_intermediate_size=5632, num_experts=60, num_experts_per_tok=4,
                  decoder_sparse_step=1, vocab_size=151936)  # Qwen/Qwen1.5-MoE-A2.7B  # fmt: skip


def test_qwen2_moe_shared_expert_width_and_sparse_step():
    """Qwen1.5-MoE-A2.7B's card: 14.3B total, 2.7B active; its shared expert (width 5632, 0.83B
    over 24 layers) counts; decoder_sparse_step 2 leaves experts in layers 1, 3, ..., 23 only."""
    m = spec_from_hf_config("qwen1.5-moe", QWEN15_MOE)
    assert m.num_params == pytest.approx(14.3e9, rel=0.01)
    assert m.active_params == pytest.approx(2.7e9, rel=0.01)
    half = spec_from_hf_config("half", QWEN15_MOE | {"decoder_sparse_step": 2})
    assert half.moe_layers == 12
    dense_mlp, moe_block = 3 * 2048 * 5632, 60 * 3 * 2048 * 1408 + 3 * 2048 * 5632 + 2048 + 2048 * 60
    assert m.num_params - half.num_params == 12 * (moe_block - dense_mlp)
    assert spec_from_hf_config("q", QWEN15_MOE | {"mlp_only_layers": [1]}).moe_layers == 23
    with pytest.raises(ValueError, match="^hf_config.decoder_sparse_step: leaves 0 MoE"):
        spec_from_hf_config("q", QWEN15_MOE | {"decoder_sparse_step": 25})


def test_gpt_oss_streamed_active_parameters_are_the_cards():
    """The cards' active counts (5.1B, 3.6B) leave out the untied input table, which a step
    only looks up (specs.lookup_params)."""
    for name, card in (("gpt-oss-120b", 5.1e9), ("gpt-oss-20b", 3.6e9)):
        m = get_model(name)
        assert m.active_params - m.lookup_params == pytest.approx(card, rel=0.01)


def test_moe_split_adds_up():
    m = get_model("qwen3-30b-a3b")
    assert m.routed_params == 48 * 128 * 3 * 2048 * 768
    assert m.dense_params + m.routed_params == m.num_params
    assert m.active_params == m.dense_params + 48 * 8 * 3 * 2048 * 768
    assert m.weight_bytes_per_gpu(tp=1, ep=4) == pytest.approx(
        m.dense_params * 2 + m.routed_params * 2 / 4)


@pytest.mark.parametrize("change,field", [
    ({"num_hidden_layers": None}, "hf_config.num_hidden_layers: missing"),
    ({"hidden_size": "big"}, "hf_config.hidden_size: got 'big'"),
    ({"num_experts": 8, "num_experts_per_tok": 9}, "hf_config.num_experts_per_tok: 9 exceeds"),
    ({"num_experts": 8}, "hf_config.num_experts_per_tok: missing"),
    ({"num_attention_heads": 30}, "hf_config: num_kv_heads=8 must divide num_heads=30"),  # (not ": num_kv...")
    ({"kv_lora_rank": 512}, "hf_config.qk_rope_head_dim: missing"),
    ({"text_config": "x"}, "hf_config.text_config: expected a mapping"),
    ({"tie_word_embeddings": "false"}, "hf_config.tie_word_embeddings: expected true or false"),
    # a reviewer's: a crash (int), and a silent 44 MoE layers for [0, 0, 0, 999] (one real index)
    ({"num_experts": 8, "num_experts_per_tok": 2, "mlp_only_layers": 3}, "hf_config.mlp_only_layers: expected"),
    ({"num_experts": 8, "num_experts_per_tok": 2, "mlp_only_layers": [0, 0, 0, 999]},
     "hf_config.mlp_only_layers: expected a list of layer indices in 0..31"),
    ({"sliding_window": 128, "layer_types": ["sliding_attention", "full_attention"]},
     "hf_config.layer_types: expected a list of 32"),
])  # fmt: skip
def test_hf_config_refusals_name_the_field(change, field):
    cfg = {k: v for k, v in {**LLAMA_8B_CONFIG, **change}.items() if v is not None}
    with pytest.raises(ValueError) as e:
        spec_from_hf_config("x", cfg)
    assert field in str(e.value)


BASE = dict(name="m", num_params=10e9, num_layers=8, hidden_size=1024, num_heads=8,
            num_kv_heads=8, head_dim=128, vocab_size=1000)  # fmt: skip


@pytest.mark.parametrize("change,field", [
    (dict(num_experts=8, experts_per_token=2), "moe_intermediate_size: missing"),
    (dict(num_experts=8, experts_per_token=0, moe_intermediate_size=64), "experts_per_token: got 0"),
    (dict(num_experts=64, experts_per_token=2, moe_intermediate_size=8192), "num_params:"),
    (dict(experts_per_token=2), "experts_per_token: set but num_experts is 0"),
    (dict(expert_dtype="fp8"), "expert_dtype: set but num_experts is 0"),
    (dict(attention="mla", kv_lora_rank=512), "qk_rope_head_dim: missing"),
    (dict(kv_lora_rank=512), "kv_lora_rank: set but attention is 'gqa'"),
    (dict(num_sliding_layers=2), "sliding_window: missing"),
    (dict(num_sliding_layers=9, sliding_window=4), "num_sliding_layers: got 9"),
    (dict(num_ssm_layers=4), "ssm_state_bytes: missing"),
    (dict(num_ssm_layers=4, ssm_state_bytes=1e6, num_attention_layers=6), "num_attention_layers:"),
    (dict(weight_dtype="int3"), "weight_dtype"),
    (dict(num_attention_layers=0), "num_attention_layers: 0"),  # (a ZeroDivisionError in memory.py)
])  # fmt: skip
def test_inconsistent_model_spec_refused_naming_the_field(change, field):
    with pytest.raises(ValidationError) as e:
        ModelSpec(**{**BASE, **change})
    assert field in str(e.value)


def test_inline_hf_config_in_the_step_time_config():
    cfg = StepTimeConfig.model_validate(
        {"model": {"name": "my-llama", "hf_config": {**LLAMA_8B_CONFIG, "rope_theta": 5e5}},
         "hardware": "b200"})  # fmt: skip
    assert cfg.model_spec().num_params == pytest.approx(8.03e9, rel=1e-3)
    bad = {**LLAMA_8B_CONFIG}
    del bad["vocab_size"]
    with pytest.raises(ValidationError) as e:
        StepTimeConfig.model_validate({"model": {"name": "x", "hf_config": bad}})
    msg = format_validation_error(e.value, "steptime")
    assert msg.startswith("steptime.model: hf_config.vocab_size: missing")  # no pydantic prefix
    assert len(msg.splitlines()) == 1  # one problem, one line (not one per union member)
    with pytest.raises(ValidationError) as e:  # an inline ModelSpec: its own field named
        StepTimeConfig.model_validate({"model": {**BASE, "num_experts": 4}})
    assert "steptime.model: experts_per_token: got 0" in format_validation_error(
        e.value, "steptime")


@pytest.mark.parametrize("kw,field", [
    (dict(model="llama-3.1-8b", ep=2, dp=2), "ep: 2 > 1 but model 'llama-3.1-8b' has no experts"),
    (dict(model="qwen3-30b-a3b", ep=3, dp=3), "ep: 3 does not divide num_experts=128"),
    (dict(model="qwen3-30b-a3b", tp=2, ep=8), "ep: 8 != tp * dp = 2"),
    (dict(model="qwen3-30b-a3b", ep=0), "ep"),
    # vLLM shards the experts over tp * dp ranks then; the model split them tp ways (2x the bytes)
    (dict(model="qwen3-30b-a3b", tp=1, dp=2), "dp: 2 > 1 without expert parallelism"),
])  # fmt: skip
def test_parallelism_refusals_name_the_field(kw, field):
    with pytest.raises(ValidationError) as e:
        StepTimeConfig(**kw)
    assert field in str(e.value)
    StepTimeConfig(model="qwen3-30b-a3b", tp=2, ep=8, dp=4)  # a consistent one
    StepTimeConfig(model="llama-3.1-8b", dp=2)  # dense: dp replicas are fine


def test_every_preset_builds_a_step_model():
    for name in MODEL_PRESETS:
        cfg = StepTimeConfig(model=name)
        assert cfg.model_spec().name == name


def test_a_hardware_rate_that_is_a_unit_slip_is_refused_naming_it():
    from presched.sim.steptime.specs import HardwareSpec

    ok = dict(name="g", peak_flops=1e15, mem_bandwidth=3e12, mem_capacity=80e9, interconnect_bandwidth=4.5e11)
    HardwareSpec(**ok)
    for field, v in (("peak_flops", 1e-300), ("mem_bandwidth", 3.35), ("interconnect_bandwidth", 0.0)):
        with pytest.raises(ValidationError, match=field):
            HardwareSpec(**{**ok, field: v})
