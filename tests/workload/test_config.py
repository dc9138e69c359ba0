"""WorkloadConfig validation and build_workload end to end on the shared data."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from presched.config import Config
from presched.workload import WorkloadConfig, build_workload, default_workload, mean_rate, trace
from presched.workload.loaders import save_generic


def test_every_field_has_a_description():
    assert issubclass(WorkloadConfig, Config)
    for name, field in WorkloadConfig.model_fields.items():
        assert field.description, name


def test_default_source():
    reqs = build_workload(WorkloadConfig())
    assert reqs == default_workload()
    reqs = build_workload(WorkloadConfig(num_requests=300, rate=50.0, max_tokens=100, seed=4))
    assert len(reqs) == 300 and all(r.max_tokens == 100 for r in reqs)
    assert mean_rate(trace(reqs)) == pytest.approx(50.0)
    # a given rate is met by the requests kept, as for any trace: the README's `presched replay
    # -n 30 --rate 1` drew 30 gaps spanning 115 s (0.25 req/s), the gaps' CV being ~12
    few = build_workload(WorkloadConfig(num_requests=30, rate=1.0))
    assert mean_rate(trace(few)) == pytest.approx(1.0) and few[0].arrival == 0.0
    drawn = default_workload(30, seed=0)  # the same requests, the same burst shape
    assert [r.output_tokens for r in few] == [r.output_tokens for r in drawn]
    assert np.allclose(np.diff(trace(few)), np.diff(trace(drawn)) * mean_rate(trace(drawn)))


def test_trace_rescaled_and_capped():
    reqs = build_workload(WorkloadConfig(source="azure-conv", rate=10.0, num_requests=1000))
    assert (
        len(reqs) == 1000
        and reqs[0].id == "azure-conv-000000"
        and reqs[-1].id == "azure-conv-000999"
    )
    assert reqs[0].arrival == 0.0 and mean_rate(trace(reqs)) == pytest.approx(10.0)
    full = build_workload(WorkloadConfig(source="azure-code"))
    assert len(full) == 8_819 and np.all(np.diff(trace(full)) >= 0)


def test_castillo_with_gamma_arrivals():
    cfg = WorkloadConfig(source="castillo", model="llama-3.1-8b", split="test", arrivals="gamma", rate=4.0, cv=2.0,
                         sample="mean", seed=1)  # fmt: skip
    reqs = build_workload(cfg)
    assert len(reqs) == 1110
    gaps = np.diff(trace(reqs))
    assert mean_rate(trace(reqs)) == pytest.approx(4.0, rel=0.15)
    assert np.std(gaps) / np.mean(gaps) == pytest.approx(2.0, rel=0.25)
    # shuffled before timing: the first requests are not all from the first data set of the file
    assert len({r.metadata["dataset"] for r in reqs[:50]}) > 2
    assert build_workload(cfg) == reqs


def test_compose_azure_timing_with_castillo_lengths():
    cfg = WorkloadConfig(source="azure-conv", num_requests=500, lengths_from="castillo",
                         lengths_model="llama-3.1-8b", lengths_split="test", max_tokens=2048)  # fmt: skip
    reqs = build_workload(cfg)
    azure = build_workload(WorkloadConfig(source="azure-conv", num_requests=500))
    assert [r.arrival for r in reqs] == [r.arrival for r in azure]
    assert all(r.prompt is not None and r.model.endswith("Llama-3.1-8B-Instruct") for r in reqs)
    assert all(r.max_tokens == 2048 for r in reqs)
    other = build_workload(cfg.model_copy(update={"seed": 1}))
    assert [r.prompt for r in other] != [r.prompt for r in reqs]


def test_poisson_keeps_source_rate_when_no_rate():
    reqs = build_workload(
        WorkloadConfig(source="mooncake-conv", arrivals="poisson", num_requests=5000)
    )
    src = build_workload(WorkloadConfig(source="mooncake-conv", num_requests=5000))
    assert mean_rate(trace(reqs)) == pytest.approx(mean_rate(trace(src)), rel=0.05)


def test_generic_file_without_timestamps(tmp_path):
    path = save_generic(default_workload(20, seed=2), tmp_path / "log.jsonl")
    untimed = tmp_path / "untimed.csv"
    untimed.write_text("prompt_tokens,output_tokens\n5,6\n7,8\n")
    assert len(build_workload(WorkloadConfig(source="generic", path=path))) == 20
    with pytest.raises(ValueError, match="no timestamps.*poisson"):
        build_workload(WorkloadConfig(source="generic", path=untimed))
    with pytest.raises(ValueError, match="rate is required"):
        build_workload(WorkloadConfig(source="generic", path=untimed, arrivals="poisson"))
    reqs = build_workload(
        WorkloadConfig(source="generic", path=untimed, arrivals="poisson", rate=1.0)
    )
    assert len(reqs) == 2 and reqs[0].arrival == 0.0


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (
            {"source": "castillo", "model": "llama-3.1-8b"},
            "no timestamps.*choose arrivals='poisson' or 'gamma'",
        ),
        ({"source": "sharegpt", "path": "x.json", "arrivals": "poisson"}, "rate is required"),
        ({"source": "castillo", "arrivals": "poisson", "rate": 1.0}, "model is required"),
        ({"source": "azure"}, "path is required by source 'azure'"),
        ({"source": "azure-conv", "model": "x"}, "model is not used by source 'azure-conv'"),
        ({"path": "x.csv"}, "path is not used by source 'default'"),
        ({"source": "nope"}, "unknown source 'nope'; known: default, azure"),
        ({"lengths_model": "x"}, "lengths_model given without lengths_from"),
        ({"cv": 2.0}, "cv is only used with arrivals='gamma'"),
        ({"rate": 0}, "greater than 0"),
        ({"arrivals": "uniform"}, "trace"),
        ({"sample": 10}, "sample"),
        ({"colour": "red"}, "colour"),
    ],
)
def test_invalid_configs(kwargs, message):
    with pytest.raises(ValidationError, match=message):
        WorkloadConfig(**kwargs)


def test_frozen():
    cfg = WorkloadConfig()
    with pytest.raises(ValidationError):
        cfg.rate = 3.0  # type: ignore[misc]


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"source": "azure-conv", "arrivals": "gamma", "cv": 2.0},
     {"source": "castillo", "model": "llama-3.1-8b", "arrivals": "poisson", "rate": 2.0}],
)  # fmt: skip
def test_a_dumped_config_loads_back(kwargs):
    # a dump writes every field, defaults included (`path: null`, `sample: 0`): loading it back
    # must give the same config, not "path is not used by source 'default'"
    cfg = WorkloadConfig(**kwargs)
    again = WorkloadConfig(**cfg.model_dump())
    assert again == cfg


def test_a_non_default_option_the_source_does_not_take_is_still_refused():
    with pytest.raises(ValidationError, match="sample is not used by source 'default'"):
        WorkloadConfig(**{**WorkloadConfig().model_dump(), "sample": 3})
