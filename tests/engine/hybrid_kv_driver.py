"""Run in the engine venv (vLLM 0.32 importable) by test_hybrid_kv_vs_vllm.py: vLLM's own code
lays out the KV cache of a Nemotron-H model and admits requests into it, without a model or a
GPU. Prints one JSON line; argv: a JSON list of cases {pattern, tp, available, lengths}.

What runs is vLLM's: `Platform._align_hybrid_block_size` (the attention block size and the
padded Mamba page, with FlashAttention's kernel blocks and NemotronHForCausalLM's state shapes),
`kv_cache_utils.get_kv_cache_groups` and `get_kv_cache_config_from_groups` (groups and
num_blocks for `available` bytes), and `KVCacheManager.allocate_slots` (how many requests of
each length are admitted with the whole sequence reserved, and that freeing them returns every
block). Stubbed: the model registry lookup (to NemotronHForCausalLM) and the backend lookup (to
FlashAttention), which need a loaded model; the configs are namespaces with the fields read.
"""

from __future__ import annotations

import json
import math
import sys
from types import SimpleNamespace as NS

import torch

from vllm.model_executor.models import ModelRegistry
from vllm.model_executor.models.nemotron_h import NemotronHForCausalLM
from vllm.platforms.interface import Platform
from vllm.sampling_params import SamplingParams
from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend
from vllm.v1.core import kv_cache_utils
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec
from vllm.v1.kv_cache_layout import KVCacheLayout
from vllm.v1.request import Request

MAX_LEN = 131072  # max_model_len: the Mamba groups' block size without prefix caching


def nemotron_hf(pattern: str) -> NS:  # Nemotron Nano v2's mixer shapes (9B and 12B alike)
    return NS(mamba_num_heads=128, mamba_head_dim=80, ssm_state_size=128, n_groups=8,
              conv_kernel=4, num_key_value_heads=8, head_dim=128,
              hybrid_override_pattern=pattern)  # fmt: skip


def vllm_config(pattern: str, tp: int) -> NS:
    cache = NS(cache_dtype="auto", block_size=16, user_specified_block_size=False,
               mamba_cache_mode="none", mamba_block_size=MAX_LEN, mamba_page_size_padded=None,
               mamba_cache_dtype="auto", mamba_ssm_cache_dtype="float32", use_replayssm=False,
               kv_cache_dtype_skip_layers=None, num_gpu_blocks_override=None,
               prefix_cache_retention_interval=None, enable_prefix_caching=False,
               get_resolved_kv_cache_layout=lambda: KVCacheLayout.BLHNC)  # fmt: skip
    model = NS(dtype=torch.bfloat16, use_mla=False, is_hybrid=True, max_model_len=MAX_LEN,
               architecture="NemotronHForCausalLM", hf_config=nemotron_hf(pattern),
               get_num_kv_heads=lambda pc: 8 // tp, get_head_size=lambda: 128)  # fmt: skip
    return NS(cache_config=cache, model_config=model, parallel_config=NS(tensor_parallel_size=tp),
              scheduler_config=NS(disable_hybrid_kv_cache_manager=False), speculative_config=None,
              attention_config=NS(hisparse_config=None), num_speculative_tokens=0)  # fmt: skip


def run(case: dict) -> dict:
    pattern, tp = case["pattern"], case["tp"]
    vc = vllm_config(pattern, tp)
    Platform._align_hybrid_block_size(vc, FlashAttentionBackend)
    bs, padded = vc.cache_config.block_size, vc.cache_config.mamba_page_size_padded
    shapes = NemotronHForCausalLM.get_mamba_state_shape_from_config(vc)
    dtypes = NemotronHForCausalLM.get_mamba_state_dtype_from_config(vc)
    specs = {}
    for i, kind in enumerate(pattern):
        if kind == "M":
            specs[f"layers.{i}.mixer"] = MambaSpec(shapes=shapes, dtypes=dtypes, block_size=MAX_LEN,
                                                   page_size_padded=padded)  # fmt: skip
        elif kind == "*":
            specs[f"layers.{i}.mixer.attn"] = FullAttentionSpec(
                block_size=bs, num_kv_heads=8 // tp, head_size=128, dtype=torch.bfloat16)
    groups = kv_cache_utils.get_kv_cache_groups(vc, specs)
    config = kv_cache_utils.get_kv_cache_config_from_groups(vc, groups, case["available"])
    admitted, returned = {}, True
    for length in case["lengths"]:
        sbs = math.lcm(*(g.kv_cache_spec.block_size for g in groups))
        km = KVCacheManager(config, max_model_len=MAX_LEN, scheduler_block_size=sbs,
                            hash_block_size=sbs, enable_caching=False)  # fmt: skip
        free = km.block_pool.get_num_free_blocks()
        reqs = []
        while True:
            r = Request(f"r{len(reqs)}", list(range(length)), SamplingParams(max_tokens=1), None)
            if km.allocate_slots(r, length, full_sequence_must_fit=True) is None:
                break
            reqs.append(r)
        admitted[str(length)] = len(reqs)
        for r in reqs:
            km.free(r)
        returned &= km.block_pool.get_num_free_blocks() == free
    return dict(block_size=bs, page_bytes=padded, num_blocks=config.num_blocks,
                groups=[[type(g.kv_cache_spec).__name__, len(g.layer_names)] for g in groups],
                admitted=admitted, returned=returned)  # fmt: skip


def main() -> None:
    ModelRegistry.resolve_model_cls = lambda *a, **k: (NemotronHForCausalLM, "NemotronHForCausalLM")
    Platform._find_non_ssm_backends = classmethod(lambda cls, vc: [FlashAttentionBackend])
    print(json.dumps([run(case) for case in json.loads(sys.argv[1])]))


if __name__ == "__main__":
    main()
