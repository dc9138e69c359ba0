"""`BenchConfig`: one experiment — a workload replayed through a simulated deployment under
several policies and loads. An experiment file (YAML or JSON) sets any of these fields:

    workload: {source: azure-conv, num_requests: 4000}
    sim: {num_instances: 1, engine: {max_num_seqs: 64}, step_time: {hardware: h100-sxm}}
    policies: [fcfs, sjf-oracle, srpt-oracle, sjf]
    predictions: {source: model, path: text-gbm.npz}
    loads: [0.5, 0.8, 0.9, 0.95]
    slo: {ttft_ms: 2000, tpot_ms: 100}
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from pydantic import Field, field_validator, model_validator

from presched.config import Config, deep_merge
from presched.metrics.summary import GoodputSLO
from presched.predict.source import PredictionsConfig
from presched.schedule import POLICIES
from presched.schedule.params import validate_each
from presched.sim.config import EngineConfig
from presched.sim.setup import SimConfig
from presched.workload.config import WorkloadConfig
from presched.workload.default import default_table
from presched.workload.loaders import UNTIMED

RECOMMENDED = "mlfq"
RECOMMENDED_PARAMS = {"within": "mean", "preempt": True, "recompute_weight": 8, "base_quantum": 128}
"""The recommended predictive policy, `mlfq-preempt+sjf` (docs/policies.md, "Choosing a policy")."""


def _default_predictions() -> PredictionsConfig:
    """The noisy oracle at text-gbm's measured accuracy on the default workload's lengths."""
    return PredictionsConfig(source="noisy-oracle", sigma=default_table().text_gbm_sigma)


def _bench_defaults() -> dict[str, Any]:
    """The bench's own defaults of its sections, as mappings of only what they set beyond the
    section's model defaults: {'sim': {'engine': {'max_num_seqs': 64}}, 'slo': {...}, ...}."""
    out: dict[str, Any] = {}
    for name, field in BenchConfig.model_fields.items():
        if field.default_factory is None:
            continue
        value = field.default_factory()
        if isinstance(value, Config):
            out[name] = value.model_dump(exclude_unset=True)
        elif isinstance(value, dict):
            out[name] = copy.deepcopy(value)
    return out


class BenchConfig(Config):
    workload: WorkloadConfig = Field(
        default_factory=WorkloadConfig,
        description="The requests to replay (lengths and arrival shape).",
    )
    sim: SimConfig = Field(
        default_factory=lambda: SimConfig(engine=EngineConfig(max_num_seqs=64)),
        description="The simulated deployment. The bench default caps the batch at 64 requests so "
        "that requests queue near capacity: with vLLM's 256 slots one H100 batches most of the "
        "default workload's bursts (at 95 % load the SRPT oracle gains 8 % mean E2E over FCFS, "
        "vs 38 % with 64).",
    )
    predictions: PredictionsConfig = Field(
        default_factory=_default_predictions,
        description="Length predictions given to every run (needed by length-aware policies). The "
        "bench default is the noisy oracle at text-gbm's measured accuracy: the sigma whose Kendall "
        "tau-b on the default workload's lengths equals text-gbm's on CASTILLO test prompts (0.434); "
        "the default workload has no prompt text for a real predictor to read.",
    )
    policies: list[str] = Field(
        default_factory=lambda: ["fcfs", RECOMMENDED, "sjf-oracle", "srpt-oracle"],
        min_length=1, description="Scheduling policies to compare: " + ", ".join(POLICIES.names()) + ".",
    )  # fmt: skip
    policy_params: dict[str, dict[str, Any]] = Field(
        default_factory=lambda: {RECOMMENDED: dict(RECOMMENDED_PARAMS)},
        description="Parameters per policy name, e.g. {srpt-oracle: {recompute_weight: 0.5}}, checked by each "
        "policy's model (`presched config --policy NAME`). The default makes mlfq the recommended predictive "
        "policy, mlfq-preempt+sjf (docs/policies.md).",
    )
    loads: list[float] = Field(
        default_factory=lambda: [0.5, 0.7, 0.8, 0.9, 0.95],
        min_length=1,
        description="Offered loads as fractions of capacity: offered output-token rate / the deployment's "
        "maximum output-token throughput (measured by a saturated FCFS run of the same requests). "
        "The workload's arrival times are rescaled to each load, keeping their shape.",
    )
    capacity_requests: int = Field(
        2000, ge=10, description="Requests used for the saturated capacity run (a prefix of the workload)."
    )
    slo: GoodputSLO = Field(
        default_factory=lambda: GoodputSLO(ttft_ms=2000, tpot_ms=100),
        description="Objectives for request goodput (vLLM bench serve --goodput).",
    )
    out_dir: Path = Field(Path("presched-results"), description="Folder for bench.json, bench.csv and bench.png.")

    @model_validator(mode="before")
    @classmethod
    def _merge_defaults_then_untimed_rate(cls, data):
        """A section given as a mapping (an experiment file's, `--set sim.x=...`) is merged into
        the bench's own default for it, so it changes only the fields it names: `sim: {step_time:
        {model: ...}}` keeps the bench's 64 slots, `policy_params: {mlfq: {base_quantum: 64}}`
        keeps the recommended mlfq's other parameters, `slo: {ttft_ms: 500}` keeps tpot_ms. A
        section given as a config object is taken as it is.

        Then: the bench rescales arrivals to each load, so a source without timestamps (CASTILLO,
        ShareGPT) gets Poisson arrivals unless told otherwise, and a placeholder rate of 1 req/s
        (the shape is what matters) instead of an error."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for name, default in _bench_defaults().items():
            if isinstance(data.get(name), dict):
                data[name] = deep_merge(default, data[name])
        w = data.get("workload")
        if isinstance(w, dict) and w.get("source") in UNTIMED:
            w = {"arrivals": "poisson", **w}
            if w["arrivals"] != "trace" and w.get("rate") is None:
                w["rate"] = 1.0
            data = {**data, "workload": w}
        return data

    @field_validator("policies")
    @classmethod
    def _known(cls, v: list[str]) -> list[str]:
        for name in v:
            POLICIES.get(name)
        return v

    @field_validator("policy_params")
    @classmethod
    def _params_valid(cls, v: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        validate_each(v)  # errors nest: policy_params.mlfq.base_quantum
        return v

    @field_validator("loads")
    @classmethod
    def _loads_positive(cls, v: list[float]) -> list[float]:
        for x in v:
            if not 0 < x <= 2:
                raise ValueError(f"each load must be in (0, 2], got {x}")
        return sorted(v)
