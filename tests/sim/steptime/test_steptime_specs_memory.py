"""Presets, lookups and the vLLM-style KV-cache sizing."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from presched.registry import UnknownNameError
from presched.sim.steptime import (
    HARDWARE_PRESETS,
    MODEL_PRESETS,
    KVCacheDoesNotFitError,
    ModelSpec,
    get_hardware,
    get_model,
    kv_cache_blocks,
)
from presched.sim.steptime.memory import DEFAULT_ACTIVATION_RESERVE_BYTES
from presched.sim.steptime.specs import GIB


def test_llama_presets_match_their_configs():
    m8 = get_model("llama-3.1-8b")
    assert (m8.num_layers, m8.hidden_size, m8.num_heads, m8.num_kv_heads, m8.head_dim) == (
        32, 4096, 32, 8, 128,
    )
    assert m8.vocab_size == 128256 and m8.num_params == 8.03e9
    assert m8.kv_bytes_per_token == 131072  # 2 * 32 * 8 * 128 * 2
    assert m8.weight_bytes == pytest.approx(16.06e9)
    m70 = get_model("llama-3.1-70b")
    assert (m70.num_layers, m70.hidden_size, m70.num_heads, m70.num_kv_heads) == (80, 8192, 64, 8)
    assert m70.num_params == 70.6e9
    assert m70.kv_bytes_per_token == 2 * 80 * 8 * 128 * 2


def test_hardware_presets_are_plausible():
    assert {"a100-80gb", "h100-sxm", "h200"} <= set(HARDWARE_PRESETS)
    h100 = get_hardware("h100-sxm")
    assert h100.peak_flops == pytest.approx(989.4e12)
    assert h100.mem_bandwidth == 3.35e12
    assert 79 * GIB < h100.mem_capacity <= 80 * GIB
    assert get_hardware("h200").mem_bandwidth > h100.mem_bandwidth
    for h in HARDWARE_PRESETS.values():
        assert h.interconnect_bandwidth > 0 and h.peak_flops / h.mem_bandwidth > 100


@pytest.mark.parametrize("lookup,kind", [(get_model, "model"), (get_hardware, "hardware")])
def test_unknown_preset_lists_known_names(lookup, kind):
    with pytest.raises(UnknownNameError) as e:
        lookup("gpt-9")
    msg = str(e.value)
    assert f"unknown {kind} preset 'gpt-9'" in msg
    known = MODEL_PRESETS if kind == "model" else HARDWARE_PRESETS
    assert all(name in msg for name in known)


def test_model_spec_refuses_kv_heads_not_dividing_heads():
    with pytest.raises(ValidationError, match="num_kv_heads=5 must divide num_heads=32"):
        ModelSpec(name="x", num_params=1e9, num_layers=2, hidden_size=64, num_heads=32,
                  num_kv_heads=5, head_dim=2, vocab_size=10)


def test_check_tp_names_the_field():
    m = get_model("llama-3.1-8b")
    m.check_tp(8)
    m.check_tp(16)  # 16 divides 32 heads; KV heads replicated
    with pytest.raises(ValueError, match=r"^tp: 3 does not divide num_heads=32"):
        m.check_tp(3)
    with pytest.raises(ValueError, match=r"^tp: got 0"):
        m.check_tp(0)


def test_kv_blocks_llama8b_h100_like_vllm():
    m, h = get_model("llama-3.1-8b"), get_hardware("h100-sxm")
    blocks = kv_cache_blocks(m, h, tp=1, gpu_memory_utilization=0.9, block_size=16)
    expected = math.floor(
        (0.9 * h.mem_capacity - m.weight_bytes - DEFAULT_ACTIVATION_RESERVE_BYTES) / (131072 * 16)
    )
    assert blocks == expected
    # vLLM logs ~28-30k blocks of 16 tokens (~450k tokens) for this deployment.
    assert 27_000 <= blocks <= 30_000
    # Back-of-envelope (0.9 * 80 GB - 16 GB) / (131072 B * 16): 26.7k with GB = 1e9,
    # 29.2k with GB = 2^30; ours sits between, less the activation reserve.
    assert (0.9 * 80e9 - 16e9) / (131072 * 16) < blocks < (0.9 * 80 * GIB - 16e9) / (131072 * 16)


def test_kv_blocks_scale_with_tp_and_memory():
    m70, h = get_model("llama-3.1-70b"), get_hardware("h100-sxm")
    r = DEFAULT_ACTIVATION_RESERVE_BYTES
    b4 = kv_cache_blocks(m70, h, tp=4)
    # tp <= num_kv_heads: (util * cap * tp - weights - tp * reserve) / (kv_bytes * block)
    budget = 0.9 * h.mem_capacity * 4 - m70.weight_bytes - 4 * r
    assert b4 == math.floor(budget / (m70.kv_bytes_per_token * 16))
    assert kv_cache_blocks(m70, h, tp=8) > 2 * b4
    m8 = get_model("llama-3.1-8b")
    assert kv_cache_blocks(m8, get_hardware("h200")) > kv_cache_blocks(m8, h)
    assert kv_cache_blocks(m8, h, gpu_memory_utilization=0.95) > kv_cache_blocks(m8, h)
    assert kv_cache_blocks(m8, h, block_size=32) == pytest.approx(kv_cache_blocks(m8, h) / 2, abs=1)


def test_kv_blocks_refuse_what_does_not_fit():
    with pytest.raises(KVCacheDoesNotFitError, match="llama-3.1-70b.*does not fit on 1 x h100-sxm"):
        kv_cache_blocks(get_model("llama-3.1-70b"), get_hardware("h100-sxm"), tp=1)


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"gpu_memory_utilization": 0}, "gpu_memory_utilization"),
        ({"block_size": 0}, "block_size"),
        ({"activation_reserve_bytes": -1}, "activation_reserve_bytes"),
        ({"tp": 5}, "tp"),
    ],
)
def test_kv_blocks_bad_arguments_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"^{field}:"):
        kv_cache_blocks(get_model("llama-3.1-8b"), get_hardware("h100-sxm"), **kwargs)
