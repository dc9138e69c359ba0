"""deployment_config: a measured ML.ENERGY deployment -> its StepTimeConfig, or a refusal that
names the field."""

from __future__ import annotations

import dataclasses

import pytest

from presched.sim.steptime import NotRepresentableError, deployment_config, load_mlenergy


@pytest.fixture(scope="module")
def records(data_dir):
    return load_mlenergy(data_dir / "mlenergy-leaderboard-llm")


def _one(records, model: str, gpus: int):
    return next(r for r in records if r.model_id.endswith(model) and r.num_gpus == gpus)


def test_expert_parallel_run_maps_to_tp_and_ep(records):
    cfg = deployment_config(_one(records, "Llama-4-Scout-17B-16E-Instruct", 8))
    assert (cfg.model, cfg.hardware, cfg.tp, cfg.ep, cfg.dp) == ("llama-4-scout", "h100-sxm", 8, 8, 1)
    fp8 = deployment_config(_one(records, "Llama-3.1-405B-Instruct-FP8", 4), step_overhead=1e-3)
    assert (fp8.model, fp8.hardware, fp8.tp, fp8.step_overhead) == ("llama-3.1-405b-fp8", "b200",
                                                                     4, 1e-3)


@pytest.mark.parametrize("change,field", [
    (dict(model_id="org/new-model"), "model_id: no preset for 'org/new-model'"),
    (dict(gpu_model="MI300X"), "gpu_model: no hardware preset for 'MI300X'"),
    (dict(num_gpus=1, vllm_tp=1), "num_gpus: model 'llama-3.1-405b' does not fit"),
    (dict(vllm_tp=3, num_gpus=3), "parallelization:"),
])  # fmt: skip
def test_refusals_name_the_field(records, change, field):
    r = dataclasses.replace(_one(records, "Llama-3.1-405B-Instruct", 8), **change)
    with pytest.raises(NotRepresentableError, match=field):
        deployment_config(r)
