"""StepTimeConfig validation and build_step_model through the STEP_MODELS registry."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from presched.config import format_validation_error
from presched.registry import UnknownNameError
from presched.sim.steptime import (
    STEP_MODELS,
    FittedStepModel,
    RooflineStepModel,
    StepTimeConfig,
    build_step_model,
    get_hardware,
    get_model,
)

COEF = dict(a_prefill=4e-3, b_prefill=3e-5, c_prefill=1e-9,
            a_decode=7e-3, b_decode=5e-8, c_decode=2e-5)
SHAPE = (512, 512 * 513 / 2, 512, 32, 32 * 900)


def test_registry_has_both_kinds():
    assert STEP_MODELS.names() == ["fitted", "roofline"]
    msg = "unknown step-time model 'table'; known: fitted, roofline"
    with pytest.raises(UnknownNameError, match=msg):
        STEP_MODELS.get("table")


def test_every_field_is_described():
    for name, field in StepTimeConfig.model_fields.items():
        assert field.description, name


def test_default_builds_the_h100_8b_roofline():
    m = build_step_model(StepTimeConfig())
    assert isinstance(m, RooflineStepModel)
    ref = RooflineStepModel(get_model("llama-3.1-8b"), get_hardware("h100-sxm"))
    assert m.step_time(*SHAPE) == ref.step_time(*SHAPE)


def test_roofline_knobs_and_inline_specs_are_used():
    cfg = StepTimeConfig.model_validate({
        "model": {**get_model("llama-3.1-8b").model_dump(), "name": "my-8b"},
        "hardware": "h200",
        "tp": 2,
        "compute_efficiency": 0.6,
        "memory_efficiency": 0.7,
        "step_overhead": 0.002,
        "overhead_per_decode": 0.0,
    })
    m = build_step_model(cfg)
    ref = RooflineStepModel(get_model("llama-3.1-8b"), get_hardware("h200"), tp=2,
                            compute_efficiency=0.6, memory_efficiency=0.7, step_overhead=0.002,
                            overhead_per_decode=0.0)
    assert m.step_time(*SHAPE) == ref.step_time(*SHAPE)
    assert "my-8b" in m.describe()


def test_fitted_inline_and_from_file(tmp_path):
    m = build_step_model(StepTimeConfig(kind="fitted", coefficients=COEF))
    assert isinstance(m, FittedStepModel)
    path = tmp_path / "h100-8b.json"
    m.save(path, mape=0.04)
    from_file = build_step_model(StepTimeConfig(kind="fitted", coefficients_file=path))
    assert from_file.step_time(*SHAPE) == m.step_time(*SHAPE)
    with pytest.raises(FileNotFoundError, match="nope.json"):
        build_step_model(StepTimeConfig(kind="fitted", coefficients_file=tmp_path / "nope.json"))


@pytest.mark.parametrize(
    "data,path,text",
    [
        ({"model": "llama-9"}, "steptime.model",
         "unknown model preset 'llama-9'; known: deepseek-v3, gemma-3-12b"),
        ({"hardware": "tpu"}, "steptime.hardware",
         "unknown hardware preset 'tpu'; known: a100-80gb"),
        ({"tp": 3}, "steptime.tp", "3 does not divide num_heads=32"),
        ({"tp": 0}, "steptime.tp", "greater than or equal to 1"),
        ({"compute_efficiency": -0.5}, "steptime.compute_efficiency", "greater than 0"),
        ({"memory_efficiency": 1.2}, "steptime.memory_efficiency", "less than or equal to 1"),
        ({"step_overhead": -1}, "steptime.step_overhead", "greater than or equal to 0"),
        ({"kind": "table"}, "steptime.kind", "'roofline' or 'fitted'"),
        ({"colour": "red"}, "steptime.colour", "Extra inputs are not permitted"),
        ({"kind": "fitted"}, "steptime", "needs exactly one of coefficients, coefficients_file"),
        ({"coefficients": COEF}, "steptime", "coefficients is set but kind is 'roofline'"),
        ({"kind": "fitted", "coefficients": {**COEF, "b_decode": -1}},
         "steptime.coefficients.b_decode", "greater than or equal to 0"),
    ],
)
def test_bad_configs_name_the_field(data, path, text):
    with pytest.raises(ValidationError) as e:
        StepTimeConfig.model_validate(data)
    msg = format_validation_error(e.value, "steptime")
    assert any(line.startswith(f"{path}:") and text in line for line in msg.splitlines()), msg


def test_knob_preset_fills_the_unset_knobs_and_reaches_the_model():
    from presched.sim.steptime.presets import KNOB_PRESETS

    preset = KNOB_PRESETS["mlenergy-moe-b200"]
    cfg = StepTimeConfig(model="qwen3-30b-a3b", hardware="b200", knobs="mlenergy-moe-b200",
                         step_overhead=1e-3)  # fmt: skip
    assert cfg.step_overhead == 1e-3  # set by the config: kept
    assert {k: getattr(cfg, k) for k in preset if k != "step_overhead"} == {
        k: v for k, v in preset.items() if k != "step_overhead"}
    ref = RooflineStepModel(get_model("qwen3-30b-a3b"), get_hardware("b200"),
                            **(preset | {"step_overhead": 1e-3}))  # fmt: skip
    assert build_step_model(cfg).step_time(*SHAPE) == ref.step_time(*SHAPE)
    plain = StepTimeConfig(model="qwen3-30b-a3b", hardware="b200")  # no preset: the defaults
    assert plain.memory_efficiency == 0.8 and plain.overhead_per_layer == 0.0


def test_unknown_knob_preset_is_refused_naming_the_field():
    with pytest.raises(ValidationError) as e:
        StepTimeConfig.model_validate({"knobs": "moe"})
    assert "knobs: unknown preset 'moe'; known: mlenergy-moe-b200, mlenergy-moe-h100" in str(e.value)
