"""From a measured ML.ENERGY deployment to the `StepTimeConfig` that describes it.

    cfg = deployment_config(measured, step_overhead=...)   # or NotRepresentableError

The model id goes through `presets.HF_MODEL_IDS`, the GPU through `presets.GPU_NAMES`, and the
parallelism the loader read (mlenergy.py: tp vLLM ran with, ep, dp) into `tp`, `ep`, `dp`; the
weights must leave room for the KV cache (memory.py). Whatever cannot be represented raises
`NotRepresentableError` naming the field (`model_id`, `gpu_model`, `parallelization`, `num_gpus`).
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from presched.config import format_validation_error
from presched.sim.steptime.config import StepTimeConfig
from presched.sim.steptime.memory import KVCacheDoesNotFitError, kv_cache_blocks
from presched.sim.steptime.mlenergy import MeasuredConfig
from presched.sim.steptime.presets import GPU_NAMES, HF_MODEL_IDS


class NotRepresentableError(ValueError):
    """A measured deployment the step-time model cannot describe; the message names the field."""


def deployment_config(m: MeasuredConfig, **knobs: Any) -> StepTimeConfig:
    """The roofline `StepTimeConfig` of measured deployment `m` (`knobs`: roofline knobs)."""
    where = f"{m.source}: {m.model_id} {m.gpu_model} x{m.num_gpus}"
    if m.model_id not in HF_MODEL_IDS:
        raise NotRepresentableError(f"{where}: model_id: no preset for {m.model_id!r}")
    if m.gpu_model not in GPU_NAMES:
        raise NotRepresentableError(f"{where}: gpu_model: no hardware preset for "
                                    f"{m.gpu_model!r}; known: {', '.join(GPU_NAMES)}")  # fmt: skip
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


def representable(m: MeasuredConfig) -> str | None:
    """None if `deployment_config(m)` works, else the reason (naming the field)."""
    try:
        deployment_config(m)
    except NotRepresentableError as e:
        return str(e)
    return None
