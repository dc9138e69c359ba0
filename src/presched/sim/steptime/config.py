"""`StepTimeConfig`: which step-time model the simulator uses, and `build_step_model`.

    kind: roofline                # or: fitted
    model: llama-3.1-8b           # preset name (presets.MODEL_PRESETS), an inline ModelSpec,
                                  # or {name: x, hf_config: {<config.json fields>}}
    hardware: h100-sxm            # preset name (presets.HARDWARE_PRESETS) or an inline HardwareSpec
    tp: 1                         # tensor parallel; ep (expert parallel), dp (DP attention ranks)
    compute_efficiency: 0.5       # roofline knobs (ignored by kind: fitted); or a named set
    memory_efficiency: 0.8        # of them for what is unset: knobs: mlenergy-moe-h100
    step_overhead: 0.00104
    overhead_per_decode: 4.9e-5

    kind: fitted
    coefficients_file: calib/h100-8b.json   # written by FittedStepModel.save / to_dict
    # or inline:
    coefficients: {a_prefill: 0.004, b_prefill: 2.6e-5, c_prefill: 1.1e-9,
                   a_decode: 0.007, b_decode: 4.7e-8, c_decode: 1.9e-5}

`model`, `hardware`, `tp`, `ep` and `dp` describe the deployment for both kinds (the engine also uses them
to size the KV cache, see memory.py); a fitted model's time comes from its coefficients only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError, ValidationInfo, field_validator, model_validator

from presched.config import Config
from presched.sim.steptime.base import StepTimeModel
from presched.sim.steptime.fitted import FittedCoefficients, FittedStepModel
from presched.sim.steptime.roofline import (
    DEFAULT_COMPUTE_EFFICIENCY,
    DEFAULT_MEMORY_EFFICIENCY,
    DEFAULT_OVERHEAD_PER_DECODE,
    DEFAULT_OVERHEAD_PER_PREFILL_TOKEN,
    DEFAULT_STEP_OVERHEAD,
    RooflineStepModel,
)
from presched.sim.steptime.hf import HFModelSpec
from presched.sim.steptime.presets import (
    HARDWARE_PRESETS,
    KNOB_PRESETS,
    MODEL_PRESETS,
    get_hardware,
    get_model,
)
from presched.sim.steptime.specs import HardwareSpec, ModelSpec


def _validate_spec(kind: type[Config], v: dict) -> Config:
    """`kind` built from `v`; a ValueError listing `field: problem` for each problem."""
    try:
        return kind.model_validate(v)
    except ValidationError as e:
        problems = []
        for err in e.errors():
            where = ".".join(str(p) for p in err["loc"])
            msg = err["msg"].removeprefix("Value error, ")
            problems.append(f"{where}: {msg}" if where else msg)
        raise ValueError("; ".join(problems)) from None


def _resolve_model(model: str | ModelSpec | HFModelSpec) -> ModelSpec:
    if isinstance(model, str):
        return get_model(model)
    return model.to_spec() if isinstance(model, HFModelSpec) else model


class StepTimeConfig(Config):
    """Step-time model of one engine (replica)."""

    kind: Literal["roofline", "fitted"] = Field(
        default="roofline",
        description="Step-time model: 'roofline' (analytical, from model and hardware specs) or "
        "'fitted' (closed form a + b*tokens + c*tokens^2 / a + b*context + c*batch with "
        "calibrated coefficients).",
    )
    model: str | ModelSpec | HFModelSpec = Field(
        default="llama-3.1-8b",
        description="Served model: a preset name (" + ", ".join(sorted(MODEL_PRESETS)) + "), "
        "an inline model spec, or {name, hf_config: <config.json fields>, weight_dtype, "
        "expert_dtype, kv_dtype}.",
    )
    hardware: str | HardwareSpec = Field(
        default="h100-sxm",
        description="GPU type: a preset name (" + ", ".join(sorted(HARDWARE_PRESETS)) + ") "
        "or an inline hardware spec.",
    )
    tp: int = Field(
        default=1,
        ge=1,
        le=4096,
        description="Tensor-parallel GPUs per replica; must divide the model's attention heads.",
    )
    ep: int = Field(
        default=1,
        ge=1,
        le=4096,
        description="Expert-parallel GPUs (MoE only): routed experts are split whole over ep "
        "GPUs, with an all-to-all per MoE layer; as in vLLM, ep > 1 must equal tp * dp.",
    )
    dp: int = Field(
        default=1,
        ge=1,
        le=4096,
        description="Data-parallel attention ranks sharing one expert-parallel group; the "
        "simulated engine is one rank, and its MoE layers see dp times its tokens (ranks "
        "balanced). Without experts, run dp independent instances instead.",
    )
    knobs: str | None = Field(
        default=None,
        description="Roofline: a named set of knobs fitted on public measurements ("
        + ", ".join(sorted(KNOB_PRESETS)) + "; presets.KNOB_PRESETS) for the knobs this "
        "config leaves unset; None: the defaults (fitted on Llama-3.1-8B, one H100).",
    )
    compute_efficiency: float = Field(
        default=DEFAULT_COMPUTE_EFFICIENCY,
        gt=0,
        le=1,
        description="Roofline: fraction of dense peak FLOP/s reached (MFU), in (0, 1].",
    )
    memory_efficiency: float = Field(
        default=DEFAULT_MEMORY_EFFICIENCY,
        gt=0,
        le=1,
        description="Roofline: fraction of HBM bandwidth reached, in (0, 1].",
    )
    step_overhead: float = Field(
        default=DEFAULT_STEP_OVERHEAD,
        ge=0,
        le=60.0,
        description="Roofline: fixed seconds per step (scheduler, launches, sampling).",
    )
    overhead_per_decode: float = Field(
        default=DEFAULT_OVERHEAD_PER_DECODE,
        ge=0,
        le=60.0,
        description="Roofline: seconds per decoding request per step (per-sequence CPU work).",
    )
    overhead_per_prefill_token: float = Field(
        default=DEFAULT_OVERHEAD_PER_PREFILL_TOKEN,
        ge=0,
        le=60.0,
        description="Roofline: seconds per prefill token outside the roofline.",
    )
    collective_latency: float | None = Field(
        default=None,
        ge=0,
        le=1.0,
        description="Roofline: seconds of fixed latency per all-reduce / all-to-all (None: the "
        "hardware's interconnect_latency).",
    )
    overhead_per_layer: float = Field(
        default=0.0,
        ge=0,
        le=1e-3,
        description="Roofline: seconds per transformer layer per step outside the roofline "
        "(kernel launches, synchronisation); 0 by default.",
    )
    coefficients: FittedCoefficients | None = Field(
        default=None,
        description="Fitted: the six coefficients inline (seconds; see docs/steptime.md).",
    )
    coefficients_file: Path | None = Field(
        default=None,
        description="Fitted: JSON file with the coefficients, as written by "
        "FittedStepModel.save / to_dict.",
    )

    @model_validator(mode="before")
    @classmethod
    def _fill_knobs(cls, data: object) -> object:
        """`knobs`: the preset's values for every knob the config does not set itself."""
        if not isinstance(data, dict) or data.get("knobs") is None:
            return data
        name = data["knobs"]
        if name not in KNOB_PRESETS:
            raise ValueError(f"knobs: unknown preset {name!r}; known: "
                             f"{', '.join(sorted(KNOB_PRESETS))}")  # fmt: skip
        return KNOB_PRESETS[name] | data

    @field_validator("model", mode="before")
    @classmethod
    def _pick_model_kind(cls, v: object) -> object:
        """A mapping with `hf_config` is config.json fields, any other mapping a ModelSpec; one
        error per problem, naming the field inside `model` (not one per union member)."""
        if not isinstance(v, dict):
            return v
        return _validate_spec(HFModelSpec if "hf_config" in v else ModelSpec, v)

    @field_validator("hardware", mode="before")
    @classmethod
    def _pick_hardware_kind(cls, v: object) -> object:
        """A mapping is a HardwareSpec: its errors name the field inside `hardware` (not one per
        union member, `hardware.str: Input should be a valid string` first)."""
        return _validate_spec(HardwareSpec, v) if isinstance(v, dict) else v

    @field_validator("model")
    @classmethod
    def _known_model(cls, v: str | ModelSpec) -> str | ModelSpec:
        if isinstance(v, str) and v not in MODEL_PRESETS:
            raise ValueError(
                f"unknown model preset {v!r}; known: {', '.join(sorted(MODEL_PRESETS))}"
            )
        return v

    @field_validator("hardware")
    @classmethod
    def _known_hardware(cls, v: str | HardwareSpec) -> str | HardwareSpec:
        if isinstance(v, str) and v not in HARDWARE_PRESETS:
            raise ValueError(
                f"unknown hardware preset {v!r}; known: {', '.join(sorted(HARDWARE_PRESETS))}"
            )
        return v

    @field_validator("tp")
    @classmethod
    def _tp_shards_model(cls, v: int, info: ValidationInfo) -> int:
        model = info.data.get("model")
        if model is not None:  # None: `model` itself failed and is reported on its own
            try:
                _resolve_model(model).check_tp(v)
            except ValueError as e:
                raise ValueError(str(e).removeprefix("tp: ")) from None
        return v

    @model_validator(mode="after")
    def _parallel_fits_model(self) -> "StepTimeConfig":
        try:
            self.model_spec().check_parallel(self.tp, self.ep, self.dp)
        except ValueError as e:
            raise ValueError(str(e)) from None  # message starts with the field (ep: / dp:)
        return self

    @model_validator(mode="after")
    def _coefficients_match_kind(self) -> "StepTimeConfig":
        given = [n for n in ("coefficients", "coefficients_file") if getattr(self, n) is not None]
        if self.kind == "fitted" and len(given) != 1:
            raise ValueError(
                "kind 'fitted' needs exactly one of coefficients, coefficients_file"
                + (" (both are set)" if given else " (neither is set)")
            )
        if self.kind == "roofline" and given:
            raise ValueError(f"{given[0]} is set but kind is 'roofline'; use kind: fitted")
        return self

    def model_spec(self) -> ModelSpec:
        """The resolved `ModelSpec` (preset looked up by name, HF config fields converted)."""
        return _resolve_model(self.model)

    def hardware_spec(self) -> HardwareSpec:
        """The resolved `HardwareSpec` (preset looked up by name)."""
        return get_hardware(self.hardware) if isinstance(self.hardware, str) else self.hardware


def roofline_from_config(cfg: StepTimeConfig) -> RooflineStepModel:
    """The `RooflineStepModel` that `cfg` describes."""
    return RooflineStepModel(
        cfg.model_spec(),
        cfg.hardware_spec(),
        tp=cfg.tp,
        ep=cfg.ep,
        dp=cfg.dp,
        compute_efficiency=cfg.compute_efficiency,
        memory_efficiency=cfg.memory_efficiency,
        step_overhead=cfg.step_overhead,
        overhead_per_decode=cfg.overhead_per_decode,
        overhead_per_prefill_token=cfg.overhead_per_prefill_token,
        collective_latency=cfg.collective_latency,
        overhead_per_layer=cfg.overhead_per_layer,
    )


def fitted_from_config(cfg: StepTimeConfig) -> FittedStepModel:
    """The `FittedStepModel` that `cfg` describes (inline coefficients or the JSON file)."""
    if cfg.coefficients is not None:
        return FittedStepModel(cfg.coefficients, source="config")
    if cfg.coefficients_file is None:
        raise ValueError("kind 'fitted' needs coefficients or coefficients_file")
    return FittedStepModel.load(cfg.coefficients_file)


def build_step_model(cfg: StepTimeConfig) -> StepTimeModel:
    """Make the step-time model named by `cfg.kind` through the `STEP_MODELS` registry."""
    from presched.sim.steptime import STEP_MODELS  # the registry lives in the package

    return STEP_MODELS.create(cfg.kind, cfg)
