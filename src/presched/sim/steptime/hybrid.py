"""The KV cache of a hybrid attention / Mamba model as vLLM 0.32's hybrid KV-cache manager lays it
out, reduced to what the simulator needs: the attention block size, the bytes of one block and
the blocks a running sequence holds for its Mamba state (memory.py sizes the cache with it, the
scheduler admits with it).

vLLM's steps (paths and lines in vLLM 0.32's source):

1. *One page size.* `platforms/interface.py:939` (`_align_hybrid_block_size`, run by
   `update_block_size_for_backend`, :750, because the model is hybrid) takes the bytes of one
   token in one attention layer on one GPU (`attn_page`, 2 * KV heads per GPU * head_dim *
   dtype bytes; MLA one latent) and of one sequence's state in one Mamba layer on one GPU
   (`state`, conv + SSM state, `MambaSpec.page_size_bytes`), then (:1062-1091)

       align      = max(smallest kernel block of the attention backend, block_size)
       block_size = max(block_size, 16 * cdiv(align * cdiv(state, align * attn_page), 16))

   (the kernel block is 16 for FlashAttention on Hopper/Ampere and FlashInfer on Blackwell,
   `MultipleOf(16)` / 16; 128 with MLA, :1082) and pads the Mamba page to `block_size *
   attn_page` (`mamba_page_size_padded`, :1116): every layer's page is then the same size.
2. *Groups.* `v1/core/kv_cache_utils.py:1362` (`_get_kv_cache_groups_uniform_page_size`) splits
   each layer type into groups of `group_size` layers: the smaller type's layer count, or the
   larger's when it is under 1.5 times the smaller (:1467-1470); a type of n layers makes
   cdiv(n, group_size) groups (:1488).
3. *Blocks.* A block is one page in each layer of a group (`_get_kv_cache_bytes_per_block`,
   :1520), so `group_size` pages, and all groups draw block ids from one pool:
   `num_blocks = available_memory // bytes_per_block` (:1627).
4. *Per sequence.* Without prefix caching a Mamba group's block size is `max_model_len`
   (`model_executor/models/config.py:709`), so `MambaManager` (`v1/core/
   single_type_kv_cache_manager.py:1697-1704`, the base class's cdiv(num_tokens, block_size))
   gives a request one block per Mamba group at its first step, keeps it to the end (it only
   needs the last state, :1954-1959, and never skips the one block) and frees it with the
   request's other blocks at finish or preemption. The attention group holds cdiv(tokens,
   block_size) blocks like any full-attention model.

Nemotron Nano 9B v2 (27 Mamba + 4 attention layers, FP32 SSM state) on one GPU: attn_page =
4,096 B, state = 5,316,608 B; block_size = 16 * cdiv(5,316,608, 65,536) = 1,312 tokens, page =
5,373,952 B (the state padded by 1.1 %); group_size = 4: one attention group and 7 Mamba groups
(the last of 3 layers), a block = 4 pages = 21,495,808 B; each running sequence holds 7 blocks
of state (150.5 MB, against the 143.5 MB of state its 27 layers hold) and one block per 1,312
tokens of context.

Approximations (none applies to the presets): attention layers of several kinds (sliding
window) count as one kind; a model with more attention groups than one (attention layers over
1.5 times the Mamba layers) is sized in simulator blocks of `block_size` tokens in every
attention group, with the state groups rounded up to whole simulator blocks; the Mamba state
per GPU is `ssm_state_bytes / tp` (vLLM widens the conv state when tp does not divide
`n_groups`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from presched.sim.steptime.specs import ModelSpec

KERNEL_BLOCK = 16
"""Smallest kernel block of the attention backends vLLM picks for GQA on NVIDIA GPUs
(FlashAttention `MultipleOf(16)`, FlashInfer 16): the alignment of a raised block size."""
MLA_KERNEL_BLOCK = 128
"""The alignment vLLM uses instead for a hybrid model with MLA (`interface.py:1082`)."""


@dataclass(frozen=True)
class HybridKVLayout:
    """The KV-cache layout of a hybrid model on one GPU of a tp group (module doc)."""

    block_size: int
    """Tokens per attention block, raised so that an attention page holds one Mamba state."""
    page_bytes: int
    """Bytes of one page: `block_size` tokens of one attention layer = one padded Mamba state."""
    state_bytes: int
    """Bytes of one sequence's state in one Mamba layer, before padding."""
    group_size: int
    """Layers per KV-cache group."""
    attention_groups: int
    state_groups: int
    """Mamba groups: vLLM's blocks that a running sequence holds for its state."""

    @property
    def pool_block_bytes(self) -> int:
        """vLLM's bytes per block: one page in each layer of a group."""
        return self.group_size * self.page_bytes

    @property
    def block_bytes(self) -> int:
        """Bytes of one simulator block: `block_size` tokens in every attention group (one
        vLLM block when there is one attention group, as in every preset)."""
        return self.attention_groups * self.pool_block_bytes

    @property
    def state_blocks(self) -> int:
        """Simulator blocks a running sequence holds for its state (vLLM's `state_groups`)."""
        return -(-self.state_groups // self.attention_groups)


def hybrid_kv_layout(model: ModelSpec, tp: int = 1, block_size: int = 16) -> HybridKVLayout | None:
    """vLLM's layout for `model` (None when it has no state-space layers) on one GPU of a
    tp-way group, starting from the configured `block_size`; see the module docstring."""
    if not model.num_ssm_layers:
        return None
    attn_page = math.ceil(model.kv_bytes_per_layer / model.kv_shards(tp))
    state = math.ceil(model.ssm_state_bytes / tp)
    kernel = MLA_KERNEL_BLOCK if model.attention == "mla" else KERNEL_BLOCK
    align = max(kernel, block_size)
    raised = align * -(-state // (align * attn_page))
    raised = KERNEL_BLOCK * -(-raised // KERNEL_BLOCK)
    bs = max(block_size, raised)
    n_attn, n_state = model.attention_layers, model.num_ssm_layers
    group_size = min(n_attn, n_state)
    if max(n_attn, n_state) < 1.5 * group_size:
        group_size = max(n_attn, n_state)
    return HybridKVLayout(
        block_size=bs, page_bytes=bs * attn_page, state_bytes=state, group_size=group_size,
        attention_groups=-(-n_attn // group_size), state_groups=-(-n_state // group_size),
    )  # fmt: skip
