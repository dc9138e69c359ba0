"""`BenchConfig` built from partial sections (flags, `--set`, an experiment file): every section is
merged into the bench's own default, so the result equals the default config except for the
fields given, and `presched config --dump` writes a file that reproduces the default run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import yaml

from presched.bench.config import BenchConfig
from presched.cli import build_config
from presched.config import set_path

DEFAULT = json.loads(BenchConfig().model_dump_json())


def _default_with(path: str, value) -> dict:
    expected = json.loads(json.dumps(DEFAULT))
    set_path(expected, path, value)
    return expected


@pytest.mark.parametrize(("path", "value"), [
    ("sim.step_time.model", "llama-3.1-8b"),  # the default model: nothing changes
    ("sim.step_time.hardware", DEFAULT["sim"]["step_time"]["hardware"]),
    ("sim.num_instances", 1),
    ("sim.router", "round-robin"),
    ("sim.engine.block_size", 32),
    ("policy_params.mlfq.base_quantum", 64),
    ("policy_params.srpt-oracle.recompute_weight", 0.5),
    ("slo.ttft_ms", 500.0),
    ("slo.tpot_ms", None),
    ("predictions.seed", 3),
    ("workload.seed", 3),
])  # fmt: skip
def test_one_field_given_changes_that_field_only(path, value):
    via_set = build_config(None, {}, [f"{path}={json.dumps(value)}"])
    assert json.loads(via_set.model_dump_json()) == _default_with(path, value)
    if value is not None:  # a flag's None means "not given"
        assert build_config(None, {path: value}, []) == via_set


def test_a_partial_section_in_an_experiment_file_keeps_the_bench_defaults(tmp_path):
    f = tmp_path / "exp.yaml"
    f.write_text("sim: {num_instances: 2}\npolicy_params: {mlfq: {base_quantum: 64}}\nslo: {ttft_ms: 500}\n")
    cfg = build_config(f, {}, [])
    assert cfg.sim.engine.max_num_seqs == 64 and cfg.sim.num_instances == 2
    assert cfg.policy_params["mlfq"] == {"within": "mean", "preempt": True, "recompute_weight": 8, "base_quantum": 64}
    assert (cfg.slo.ttft_ms, cfg.slo.tpot_ms) == (500, 100)


def test_the_dump_reproduces_the_default_run(tmp_path):
    # no hidden bench-only num_requests: 2000 in the dump (2000 is the 'default' source's own size)
    assert DEFAULT["workload"]["num_requests"] is None
    f = tmp_path / "dump.yaml"
    f.write_text(yaml.safe_dump(DEFAULT, sort_keys=False))
    assert build_config(f, {}, []) == BenchConfig()
    # the dump edited to another source runs what `-w azure-conv` runs: all its requests
    data = yaml.safe_load(f.read_text())
    data["workload"]["source"] = "azure-conv"
    f.write_text(yaml.safe_dump(data, sort_keys=False))
    assert build_config(f, {}, []).workload == build_config(None, {"workload.source": "azure-conv"}, []).workload


def _bench(tmp_path, name, *args):
    out = tmp_path / name
    r = subprocess.run([sys.executable, "-m", "presched.cli", "bench", "-q", "--loads", "0.95", "-p", "fcfs",
                        "-o", str(out), *args], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    res = json.loads((out / "bench.json").read_text())
    res.pop("wall_seconds")
    for row in res["rows"]:
        row.pop("sim_wall_s")
    res["config"].pop("out_dir")
    return res


def test_naming_the_default_model_gives_the_default_run(tmp_path):
    plain = _bench(tmp_path, "plain")
    named = _bench(tmp_path, "named", "--model", "llama-3.1-8b")
    assert named == plain
