"""Number formats of weights and KV cache, and the bytes one element takes in memory.

    fp32         4 bytes (vLLM's `--mamba-ssm-cache-dtype float32` for hybrid models' SSM state)
    bf16, fp16   2 bytes
    fp8          1 byte (E4M3/E5M2; per-tensor or per-channel scales are negligible)
    mxfp4        4.25 bits = 0.53125 bytes: 4-bit E2M1 values, one 8-bit E8M0 scale per block of
                 32 (OCP Microscaling spec v1.0; gpt-oss ships its MoE experts in it)
    nvfp4        4.5 bits = 0.5625 bytes: 4-bit E2M1 values, one FP8 E4M3 scale per block of 16
                 (NVIDIA Blackwell NVFP4; the per-tensor FP32 scale is negligible)

Activations (what tensor-parallel all-reduces and expert all-to-alls move) are BF16 in every
deployment modelled here: `ACTIVATION_BYTES`.
"""

from __future__ import annotations

from typing import Literal

DType = Literal["fp32", "bf16", "fp16", "fp8", "mxfp4", "nvfp4"]

DTYPE_BYTES: dict[str, float] = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "mxfp4": (4 * 32 + 8) / 32 / 8,  # 0.53125
    "nvfp4": (4 * 16 + 8) / 16 / 8,  # 0.5625
}

ACTIVATION_BYTES = 2.0
"""Bytes per activation element (BF16) moved between GPUs."""


def dtype_bytes(dtype: str) -> float:
    """Bytes per element of `dtype`; ValueError listing the known formats otherwise."""
    try:
        return DTYPE_BYTES[dtype]
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}") from None
