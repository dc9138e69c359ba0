"""From a measured ML.ENERGY deployment to the `StepTimeConfig` that describes it.

    cfg = deployment_config(measured, step_overhead=...)   # or NotRepresentableError

The model id goes through `presets.HF_MODEL_IDS`, the GPU through `presets.GPU_NAMES`, and the
parallelism the loader read (mlenergy.py: tp vLLM ran with, ep, dp) into `tp`, `ep`, `dp`; the
weights must leave room for the KV cache (memory.py). The file's `weight_precision` must be a
format the preset stores weights in (its `weight_dtype`, or the `expert_dtype` of its routed
experts: Llama-4-Maverick-FP8 is "fp8" with FP8 experts and BF16 attention), and its
`architecture` must agree with the preset ("MoE" a model with experts, "Dense ..." one without).
Whatever cannot be represented raises `NotRepresentableError` naming the field (`model_id`,
`gpu_model`, `weight_precision`, `architecture`, `parallelization`, `num_gpus`).
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from presched.config import format_validation_error
from presched.sim.steptime.config import StepTimeConfig
from presched.sim.steptime.memory import KVCacheDoesNotFitError, kv_cache_blocks
from presched.sim.steptime.mlenergy import MeasuredConfig
from presched.sim.steptime.presets import GPU_NAMES, HF_MODEL_IDS, get_model


class NotRepresentableError(ValueError):
    """A measured deployment the step-time model cannot describe; the message names the field."""


PRECISIONS: dict[str, str] = {
    "float32": "fp32", "fp32": "fp32", "bfloat16": "bf16", "bf16": "bf16", "float16": "fp16",
    "fp16": "fp16", "half": "fp16", "fp8": "fp8", "float8": "fp8", "mxfp4": "mxfp4", "nvfp4": "nvfp4",
}  # fmt: skip
"""ML.ENERGY `weight_precision` values (lower case) -> presched's weight formats (dtypes.py)."""


def deployment_config(m: MeasuredConfig, **knobs: Any) -> StepTimeConfig:
    """The roofline `StepTimeConfig` of measured deployment `m` (`knobs`: roofline knobs)."""
    where = f"{m.source}: {m.model_id} {m.gpu_model} x{m.num_gpus}"
    if m.model_id not in HF_MODEL_IDS:
        raise NotRepresentableError(f"{where}: model_id: no preset for {m.model_id!r}")
    if m.gpu_model not in GPU_NAMES:
        raise NotRepresentableError(f"{where}: gpu_model: no hardware preset for "
                                    f"{m.gpu_model!r}; known: {', '.join(GPU_NAMES)}")  # fmt: skip
    _check_model(m, HF_MODEL_IDS[m.model_id], where)
    try:
        cfg = StepTimeConfig(model=HF_MODEL_IDS[m.model_id], hardware=GPU_NAMES[m.gpu_model],
                             tp=m.vllm_tp, ep=m.expert_parallel, dp=m.data_parallel,
                             **knobs)  # fmt: skip
    except ValidationError as e:
        raise NotRepresentableError(
            f"{where}: parallelization: {format_validation_error(e)}"
        ) from None
    try:
        kv_cache_blocks(cfg.model_spec(), cfg.hardware_spec(), tp=cfg.tp, ep=cfg.ep)
    except KVCacheDoesNotFitError as e:
        raise NotRepresentableError(f"{where}: num_gpus: {e}") from None
    return cfg


def _check_model(m: MeasuredConfig, preset: str, where: str) -> None:
    """The file's weight_precision and architecture, where given, agree with `preset`."""
    spec = get_model(preset)
    if m.weight_precision is not None:
        dtype = PRECISIONS.get(m.weight_precision.lower())
        if dtype is None:
            raise NotRepresentableError(f"{where}: weight_precision: unknown format "
                                        f"{m.weight_precision!r}; known: {', '.join(PRECISIONS)}")  # fmt: skip
        held = {spec.weight_dtype, spec.expert_dtype or spec.weight_dtype}
        if dtype not in held:
            raise NotRepresentableError(
                f"{where}: weight_precision: the file says {m.weight_precision!r}, but preset "
                f"{preset!r} holds its weights in {' and '.join(sorted(held))}"
            )
    if m.architecture is not None:
        moe = "moe" in m.architecture.lower()
        dense = "dense" in m.architecture.lower()
        if (moe and not spec.is_moe) or (dense and spec.is_moe):
            raise NotRepresentableError(
                f"{where}: architecture: the file says {m.architecture!r}, but preset {preset!r} "
                f"is {'a mixture of experts' if spec.is_moe else 'dense'}"
            )


def representable(m: MeasuredConfig) -> str | None:
    """None if `deployment_config(m)` works, else the reason (naming the field)."""
    try:
        deployment_config(m)
    except NotRepresentableError as e:
        return str(e)
    return None
