from __future__ import annotations

import json

import numpy as np
import pytest
from builders import make_requests

from presched.bench import BenchConfig, run_bench
from presched.bench.capacity import saturated_throughput
from presched.bench.report import write_files
from presched.bench.runner import arrivals_at_load
from presched.sim.config import EngineConfig
from presched.sim.setup import SimConfig


def test_arrivals_at_load_offer_the_target_token_rate():
    reqs = make_requests(n=3000, seed=0, rate=5.0)
    loaded = arrivals_at_load(reqs, 0.5, capacity_tok_s=2000.0)
    span = loaded[-1].arrival - loaded[0].arrival
    offered = sum(r.target_tokens for r in loaded) / span
    assert offered == pytest.approx(1000.0, rel=0.01)
    assert [r.id for r in loaded] == [r.id for r in reqs]  # same order, same requests


def test_capacity_is_above_any_sustained_rate_and_grows_with_slots():
    reqs = make_requests(n=600, seed=1)
    small = saturated_throughput(reqs, SimConfig(engine=EngineConfig(max_num_seqs=8)))
    big = saturated_throughput(reqs, SimConfig(engine=EngineConfig(max_num_seqs=64)))
    assert 0 < small < big


def test_bench_runs_every_pair_and_writes_files(tmp_path):
    cfg = BenchConfig(policies=["fcfs", "srpt-oracle"], loads=[0.5, 0.95], out_dir=tmp_path,
                      capacity_requests=300)  # fmt: skip
    result = run_bench(cfg, requests=make_requests(n=600, seed=2))
    assert [(r["load"], r["policy"]) for r in result.rows] == [
        (0.5, "fcfs"), (0.5, "srpt-oracle"), (0.95, "fcfs"), (0.95, "srpt-oracle")]
    assert all(r["completed"] == 600 for r in result.rows)
    lo, hi = result.rows[0], result.rows[2]
    assert hi["request_throughput"] > 1.5 * lo["request_throughput"]
    assert hi["mean_e2el_ms"] > lo["mean_e2el_ms"]  # more load, more latency
    paths = write_files(result, tmp_path)
    doc = json.loads(paths["json"].read_text())
    assert doc["capacity_output_tok_s"] > 0 and len(doc["rows"]) == 4
    assert paths["png"].read_bytes()[:4] == b"\x89PNG"
    assert paths["csv"].read_text().count("\n") == 5


def test_bad_loads_are_refused_naming_the_field():
    with pytest.raises(ValueError, match="loads"):
        BenchConfig(loads=[0.0])
    with pytest.raises(ValueError, match="policies"):
        BenchConfig(policies=["nope"])


def test_untimed_source_gets_poisson_arrivals_in_a_bench(data_dir):
    cfg = BenchConfig.model_validate({"workload": {"source": "castillo", "model": "llama-3.1-8b",
                                                   "split": "test", "num_requests": 300}})  # fmt: skip
    assert cfg.workload.arrivals == "poisson" and cfg.workload.rate == 1.0
    with pytest.raises(ValueError, match="arrivals='trace' is impossible"):
        BenchConfig.model_validate({"workload": {"source": "castillo", "model": "llama-3.1-8b", "arrivals": "trace"}})


def test_predictions_config_names_the_missing_or_stray_field():
    from pydantic import ValidationError

    from presched.predict.source import PredictionsConfig

    with pytest.raises(ValidationError, match="path is required"):
        PredictionsConfig(source="model")
    with pytest.raises(ValidationError, match="path is only used"):
        PredictionsConfig(source="noisy-oracle", path="x.npz")
    with pytest.raises(ValidationError, match="sigma"):
        PredictionsConfig(source="noisy-oracle", sigma=-1)


def test_noisy_oracle_predictions_reach_the_policy_in_request_order():
    from presched.predict.source import PredictionsConfig, predictions_for

    reqs = make_requests(n=200, seed=3)
    exact = predictions_for(reqs, PredictionsConfig(source="noisy-oracle", sigma=0.0))
    assert [float(p) for p in exact.point] == [float(r.target_tokens) for r in reqs]
    noisy = predictions_for(reqs, PredictionsConfig(source="noisy-oracle", sigma=1.0, seed=1))
    ratio = np.log(noisy.point / np.array([r.target_tokens for r in reqs]))
    assert 0.8 < ratio.std() < 1.2  # log-scale error sigma
    assert predictions_for(reqs, PredictionsConfig()) is None


def test_prompt_oracle_predictions_read_the_other_samples_and_refuse_a_workload_without_them():
    from presched.predict.source import PredictionsConfig, predictions_for
    from presched.workload.request import Request

    reqs = [Request(id="a", prompt_tokens=5, arrival=0.0, output_tokens=10, output_samples=(10, 20, 40)),
            Request(id="b", prompt_tokens=5, arrival=1.0, output_tokens=7, output_samples=(7, 7))]  # fmt: skip
    est = predictions_for(reqs, PredictionsConfig(source="prompt-oracle"))
    assert est.point.tolist() == [30.0, 7.0]  # the served sample left out once
    with pytest.raises(ValueError, match="'b'.*output_samples"):
        predictions_for(reqs[1:] + [Request(id="b", prompt_tokens=5, arrival=1.0, output_tokens=7)],
                        PredictionsConfig(source="prompt-oracle"))  # fmt: skip
