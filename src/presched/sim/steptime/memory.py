"""How many KV-cache blocks an engine gets, computed the way vLLM sizes its cache.

vLLM (V1, `gpu_memory_utilization` mode) gives each GPU of a tp-way group the budget

    budget_per_gpu = gpu_memory_utilization * mem_capacity          (bytes)
                     - weight_bytes_per_gpu(tp, ep)                  (its weight shard)
                     - activation_reserve_bytes                      (profiled peak activations,
                                                                      CUDA graphs, non-torch)

(routed experts split ep ways under expert parallelism, else tp ways) and fills it with KV
blocks of `block_size` tokens, each token taking
`kv_bytes_per_token / min(tp, num_kv_heads)` bytes on that GPU. Every GPU holds the same block
ids, so the engine's block count is the per-GPU count:

    num_blocks = floor(budget_per_gpu / (kv_bytes_per_token_per_gpu * block_size))

For tp <= num_kv_heads this is (util * capacity * tp - weights - tp * reserve)
/ (kv_bytes_per_token * block_size). The real engine logs its own `num_gpu_blocks`; when it is
known, configure that number directly instead (this is an estimate).

A hybrid model (state-space layers, `num_ssm_layers > 0`) is sized as vLLM 0.32's hybrid
allocator sizes it (`hybrid_kv_layout`): every layer's page (one block of one layer) has one
size, the attention block size is raised until an attention page holds a Mamba state, the
layers are split into KV-cache groups of `group_size` layers, and a block is one page in each of
`group_size` layers, shared by every group:

    num_blocks = floor(budget_per_gpu / (group_size * page_bytes))

A running sequence holds one block per Mamba group (`state_blocks`) besides its attention
blocks of `block_size` tokens.
"""

from __future__ import annotations

import math

from presched.sim.steptime.hybrid import hybrid_kv_layout
from presched.sim.steptime.specs import GIB, HardwareSpec, ModelSpec

DEFAULT_ACTIVATION_RESERVE_BYTES = 2 * GIB
"""Per-GPU memory vLLM does not give to the KV cache besides weights: peak activations of a
profiling forward pass at max_num_batched_tokens, CUDA-graph pools and non-torch allocations.
About 1.5-3 GiB for 1B-70B models in vLLM's start-up logs; 2 GiB is a middle value."""


class KVCacheDoesNotFitError(ValueError):
    """The weights (plus reserve) leave no memory for a single KV block."""


def kv_cache_blocks(
    model: ModelSpec,
    hardware: HardwareSpec,
    tp: int = 1,
    gpu_memory_utilization: float = 0.9,
    block_size: int = 16,
    activation_reserve_bytes: float = DEFAULT_ACTIVATION_RESERVE_BYTES,
    ep: int = 1,
) -> int:
    """Number of KV blocks (of `block_size` tokens) the engine gets; see the module docstring.
    For a hybrid model, blocks of the raised `hybrid_kv_layout(model, tp, block_size).block_size`
    tokens, `state_blocks` of them held by each running sequence.

    Raises ValueError naming the argument for a bad value, and KVCacheDoesNotFitError when the
    weight shard and reserve exceed `gpu_memory_utilization * mem_capacity` on one GPU.
    """
    if ep == 1:
        model.check_tp(tp)
    else:  # the expert group spans tp * dp GPUs; the KV cache is per attention rank
        model.check_parallel(tp, ep, ep // tp if ep % tp == 0 else 1)
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(
            f"gpu_memory_utilization: got {gpu_memory_utilization!r}, expected a number in (0, 1]"
        )
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"block_size: got {block_size!r}, expected an integer >= 1")
    if not activation_reserve_bytes >= 0:
        raise ValueError(
            f"activation_reserve_bytes: got {activation_reserve_bytes!r}, expected >= 0"
        )
    usable = gpu_memory_utilization * hardware.mem_capacity
    weights = model.weight_bytes_per_gpu(tp, ep)
    budget = usable - weights - activation_reserve_bytes
    if not math.isfinite(budget):  # specs built outside a config (theirs refuse inf and NaN)
        raise ValueError(f"mem_capacity: the KV budget of {hardware.name!r} is not finite "
                         f"({hardware.mem_capacity!r} bytes); expected a finite size")  # fmt: skip
    hybrid = hybrid_kv_layout(model, tp, block_size)
    if hybrid is None:
        block_bytes = model.kv_bytes_per_token_per_gpu(tp) * block_size
    else:
        block_bytes = hybrid.block_bytes
    if budget < block_bytes:
        raise KVCacheDoesNotFitError(
            f"model {model.name!r} does not fit on {tp} x {hardware.name}: per GPU, weights "
            f"{weights / GIB:.2f} GiB + reserve {activation_reserve_bytes / GIB:.2f} GiB exceed "
            f"gpu_memory_utilization {gpu_memory_utilization} x {hardware.mem_capacity / GIB:.2f}"
            f" GiB = {usable / GIB:.2f} GiB (less one KV block); use a larger tp, more memory "
            f"or a higher gpu_memory_utilization"
        )
    blocks = math.floor(budget / block_bytes)
    if hybrid is not None and blocks <= hybrid.state_blocks:
        raise KVCacheDoesNotFitError(
            f"model {model.name!r} does not fit on {tp} x {hardware.name}: its KV budget of "
            f"{budget / GIB:.2f} GiB per GPU holds {blocks} blocks of {block_bytes / GIB:.3f} "
            f"GiB, and one sequence needs {hybrid.state_blocks} for its Mamba state plus one; "
            f"use a larger tp, more memory or a higher gpu_memory_utilization"
        )
    return blocks
