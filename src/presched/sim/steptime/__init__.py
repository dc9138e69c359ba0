"""Step-time models: how long one engine step takes (see base.py and docs/steptime.md).

    from presched.sim.steptime import StepTimeConfig, build_step_model
    model = build_step_model(StepTimeConfig(kind="roofline", model="llama-3.1-8b",
                                            hardware="h100-sxm"))
    model.step_time(prefill_tokens, prefill_pairs, prefill_context, num_decode, decode_context)

`STEP_MODELS` maps a config `kind` to a factory taking a `StepTimeConfig`.
"""

from presched.registry import Registry
from presched.sim.steptime.base import StepTimeModel
from presched.sim.steptime.config import (
    StepTimeConfig,
    build_step_model,
    fitted_from_config,
    roofline_from_config,
)
from presched.sim.steptime.fitted import (
    FitResult,
    FittedCoefficients,
    FittedStepModel,
    StepSample,
    typical_shapes,
)
from presched.sim.steptime.deployment import NotRepresentableError, deployment_config
from presched.sim.steptime.dtypes import DTYPE_BYTES, DType
from presched.sim.steptime.hf import HFModelSpec, spec_from_hf_config
from presched.sim.steptime.memory import KVCacheDoesNotFitError, kv_cache_blocks
from presched.sim.steptime.mlenergy import MeasuredConfig, MLEnergyFormatError, load_mlenergy
from presched.sim.steptime.moe import expected_distinct_experts
from presched.sim.steptime.roofline import RooflineStepModel
from presched.sim.steptime.presets import (
    HARDWARE_PRESETS,
    MODEL_PRESETS,
    get_hardware,
    get_model,
)
from presched.sim.steptime.specs import HardwareSpec, ModelSpec

STEP_MODELS: Registry[StepTimeModel] = Registry("step-time model")
STEP_MODELS.register("roofline")(roofline_from_config)
STEP_MODELS.register("fitted")(fitted_from_config)

__all__ = [
    "STEP_MODELS",
    "StepTimeModel",
    "StepTimeConfig",
    "build_step_model",
    "RooflineStepModel",
    "FittedStepModel",
    "FittedCoefficients",
    "FitResult",
    "StepSample",
    "typical_shapes",
    "ModelSpec",
    "HFModelSpec",
    "spec_from_hf_config",
    "expected_distinct_experts",
    "DType",
    "DTYPE_BYTES",
    "HardwareSpec",
    "MODEL_PRESETS",
    "HARDWARE_PRESETS",
    "get_model",
    "get_hardware",
    "kv_cache_blocks",
    "KVCacheDoesNotFitError",
    "load_mlenergy",
    "MeasuredConfig",
    "MLEnergyFormatError",
    "deployment_config",
    "NotRepresentableError",
]
