"""The KV cache of hybrid attention / Mamba models sized as vLLM 0.32's hybrid KV-cache manager
sizes it (sim/steptime/hybrid.py, memory.py), checked against hand computations of vLLM's
formulas (platforms/interface.py `_align_hybrid_block_size`, v1/core/kv_cache_utils.py
`_get_kv_cache_groups_uniform_page_size`, `get_kv_cache_config_from_groups`)."""

from __future__ import annotations

import math

import pytest

from presched.sim.steptime import KVCacheDoesNotFitError, get_hardware, get_model, kv_cache_blocks
from presched.sim.steptime.hybrid import hybrid_kv_layout
from presched.sim.steptime.memory import DEFAULT_ACTIVATION_RESERVE_BYTES

# one Mamba-2 layer's state for one sequence, Nemotron Nano v2 (128 heads of 80, state 128,
# 8 groups, conv 4): SSM state in fp32 + conv state (3 x (10240 + 2 x 8 x 128)) in bf16
NEMOTRON_STATE = 128 * 80 * 128 * 4 + 3 * (128 * 80 + 2 * 8 * 128) * 2


def vllm_blocks(model, hardware, tp, n_attn, n_mamba, util=0.9):
    """vLLM's steps by hand: (attention block size, layers per group, Mamba groups, num_blocks)."""
    attn_page = 2 * (8 // tp) * 128 * 2  # FullAttentionSpec(block_size=1): K+V, heads/GPU, bf16
    state = NEMOTRON_STATE // tp  # MambaSpec.page_size_bytes: heads and conv channels split tp ways
    block_size = 16 * math.ceil(state / (16 * attn_page))  # kernel block 16 (FlashAttention)
    page = block_size * attn_page  # the Mamba page is padded up to it
    group_size = min(n_attn, n_mamba)  # the larger count is >= 1.5 x the smaller
    bytes_per_block = group_size * page  # one page in each layer of a group
    available = util * hardware.mem_capacity - model.weight_bytes / tp - DEFAULT_ACTIVATION_RESERVE_BYTES
    return block_size, group_size, math.ceil(n_mamba / group_size), int(available // bytes_per_block)


@pytest.mark.parametrize("name,hw,tp,n_attn,n_mamba,expected", [
    ("nemotron-nano-9b-v2", "h100-sxm", 1, 4, 27, (1312, 4, 7, 2653)),
    ("nemotron-nano-9b-v2", "h100-sxm", 2, 4, 27, (1312, 4, 7, 6134)),
    ("nemotron-nano-12b-v2", "h100-sxm", 1, 6, 28, (1312, 6, 5, 1556)),
    ("nemotron-nano-9b-v2", "h200", 1, 4, 27, (1312, 4, 7, 5385)),
])  # fmt: skip
def test_nemotron_block_count_is_vllms_closed_form(name, hw, tp, n_attn, n_mamba, expected):
    m, h = get_model(name), get_hardware(hw)
    assert NEMOTRON_STATE == 5_316_608 == m.ssm_state_bytes
    assert vllm_blocks(m, h, tp, n_attn, n_mamba) == expected
    block_size, group_size, mamba_groups, num_blocks = expected
    layout = hybrid_kv_layout(m, tp)
    assert (layout.block_size, layout.group_size, layout.state_groups, layout.attention_groups,
            layout.state_blocks) == (block_size, group_size, mamba_groups, 1, mamba_groups)  # fmt: skip
    assert layout.page_bytes == block_size * 2 * (8 // tp) * 128 * 2 >= layout.state_bytes
    assert kv_cache_blocks(m, h, tp=tp) == num_blocks
    # the attention KV it holds is what 16-token blocks held (the budget did not change): the
    # state is what the new count sets aside, 7 blocks = 150.5 MB per 9B sequence on one GPU
    assert layout.block_bytes == group_size * layout.page_bytes
    old = math.floor((0.9 * h.mem_capacity - m.weight_bytes / tp - DEFAULT_ACTIVATION_RESERVE_BYTES)
                     / (m.kv_bytes_per_token_per_gpu(tp) * 16))  # fmt: skip
    assert abs(num_blocks * block_size - old * 16) < block_size * group_size


def test_a_block_size_above_the_raise_is_kept_and_the_state_padded_to_its_page():
    m = get_model("nemotron-nano-9b-v2")
    layout = hybrid_kv_layout(m, 1, block_size=2048)
    assert (layout.block_size, layout.page_bytes) == (2048, 2048 * 4096)
    assert hybrid_kv_layout(m, 1, block_size=32).block_size == 1312  # 32 x cdiv(state, 32 x 4096)


def test_dense_models_are_sized_as_before():
    m, h = get_model("llama-3.1-8b"), get_hardware("h100-sxm")
    assert hybrid_kv_layout(m) is None
    assert kv_cache_blocks(m, h) == math.floor(
        (0.9 * h.mem_capacity - m.weight_bytes - DEFAULT_ACTIVATION_RESERVE_BYTES) / (131072 * 16))


def test_a_budget_without_room_for_one_sequences_state_is_refused():
    m, h = get_model("nemotron-nano-9b-v2"), get_hardware("h100-sxm")
    block = hybrid_kv_layout(m).block_bytes
    util = (m.weight_bytes + DEFAULT_ACTIVATION_RESERVE_BYTES + 5.5 * block) / h.mem_capacity
    with pytest.raises(KVCacheDoesNotFitError, match="holds 5 blocks.*needs 7 for its Mamba state"):
        kv_cache_blocks(m, h, gpu_memory_utilization=util)
    util = (m.weight_bytes + DEFAULT_ACTIVATION_RESERVE_BYTES + 8.5 * block) / h.mem_capacity
    assert kv_cache_blocks(m, h, gpu_memory_utilization=util) == 8
