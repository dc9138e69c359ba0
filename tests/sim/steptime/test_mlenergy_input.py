"""ML.ENERGY loader and deployment on input that used to pass or crash: a file that is not UTF-8
(or gzip-compressed), NaN histogram edges, all-zero counts, and a weight_precision or architecture
that contradicts the preset (ignored, so an FP8 file was simulated with BF16 weights). Copies of
the real 8B file, modified; the real folder must still load and express all its 146
configurations."""

from __future__ import annotations

import copy
import gzip
import json
import math
from pathlib import Path

import pytest

from presched.sim.steptime import MLEnergyFormatError, load_mlenergy
from presched.sim.steptime.deployment import NotRepresentableError, deployment_config, representable

NAME_8B = "meta-llama__Llama-3.1-8B-Instruct__lm-arena-chat.json"
NAME_MAVERICK = "meta-llama__Llama-4-Maverick-17B-128E-Instruct-FP8__lm-arena-chat.json"


@pytest.fixture
def models(data_dir: Path) -> Path:
    return data_dir / "mlenergy-leaderboard-llm" / "models"


def copy_of(models: Path, tmp_path: Path, mutate=None, name: str = NAME_8B) -> Path:
    data = json.loads((models / name).read_text())
    if mutate is not None:
        mutate(data)
    out = tmp_path / name
    out.write_text(json.dumps(data))  # NaN is written as NaN, which json.loads reads back
    return out


def test_non_utf8_and_gzip_files_are_format_errors_naming_the_file(models, tmp_path):
    text = (models / NAME_8B).read_text()
    latin = tmp_path / NAME_8B
    latin.write_bytes(text.replace('"task"', '"t\u00e9sk_note": 1, "task"').encode("latin-1"))
    with pytest.raises(MLEnergyFormatError, match="not UTF-8 text") as e:  # was UnicodeDecodeError
        load_mlenergy(latin)
    assert str(latin) in str(e.value)
    latin.write_bytes(gzip.compress(text.encode()))
    with pytest.raises(MLEnergyFormatError, match="gzip-compressed") as e:
        load_mlenergy(tmp_path)
    assert str(latin) in str(e.value)


@pytest.mark.parametrize("mutate,field", [
    (lambda d: d["configurations"][0]["output_length_distribution"]["bins"].__setitem__(1, math.nan),
     r"configurations\[0\]\.output_length_distribution\.bins: expected strictly increasing finite"),
    (lambda d: d["configurations"][2]["output_length_distribution"]["bins"].__setitem__(-1, math.inf),
     r"configurations\[2\]\.output_length_distribution\.bins"),
    (lambda d: d["configurations"][1]["output_length_distribution"]["bins"].__setitem__(0, -5.0),
     r"configurations\[1\]\.output_length_distribution\.bins: the first edge is -5.0"),
    (lambda d: d["configurations"][0]["output_length_distribution"].update(counts=[0] * 50),
     r"configurations\[0\]\.output_length_distribution\.counts: all 0"),
    (lambda d: d.update(weight_precision=16), r"field weight_precision: got int"),
])  # fmt: skip
def test_bad_histograms_and_fields_name_file_and_field(models, tmp_path, mutate, field):
    path = copy_of(models, tmp_path, mutate)
    with pytest.raises(MLEnergyFormatError, match=field) as e:
        load_mlenergy(path)
    assert str(path) in str(e.value)


@pytest.mark.parametrize("mutate,message", [
    (lambda d: d.update(weight_precision="fp8"),
     "weight_precision: the file says 'fp8', but preset 'llama-3.1-8b' holds its weights in bf16"),
    (lambda d: d.update(weight_precision="int4-awq"), "weight_precision: unknown format 'int4-awq'"),
    (lambda d: d.update(architecture="MoE"), "architecture: the file says 'MoE', but preset 'llama-3.1-8b' is dense"),
])  # fmt: skip
def test_a_file_that_contradicts_its_preset_is_not_representable(models, tmp_path, mutate, message):
    (c, *_) = load_mlenergy(copy_of(models, tmp_path, mutate))
    with pytest.raises(NotRepresentableError, match=message):
        deployment_config(c)


def test_the_real_files_hold_what_their_presets_model(models):
    every = load_mlenergy(models)
    assert len(every) == 146 and all(representable(c) is None for c in every)
    assert {(c.weight_precision, c.architecture) for c in every} == {
        ("bfloat16", "Dense Transformer"), ("bfloat16", "MoE"), ("fp8", "Dense Transformer"), ("fp8", "MoE")}
    # Maverick-FP8: "fp8" is its routed experts' format (attention and shared weights stay BF16)
    (mav, *_) = load_mlenergy(models / NAME_MAVERICK)
    assert mav.weight_precision == "fp8" and deployment_config(mav).model_spec().expert_dtype == "fp8"


def test_a_bf16_label_on_a_quantized_model_is_refused(models, tmp_path):
    def relabel(d):
        d["weight_precision"] = "bfloat16"
        d["configurations"] = [copy.deepcopy(c) for c in d["configurations"][:1]]
    (c,) = load_mlenergy(copy_of(models, tmp_path, relabel, "meta-llama__Llama-3.1-405B-Instruct-FP8__lm-arena-chat.json"))
    with pytest.raises(NotRepresentableError, match="weight_precision: the file says 'bfloat16'.*holds its weights in fp8"):
        deployment_config(c)
