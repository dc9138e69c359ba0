"""The `presched` command as a user runs it (a real subprocess)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import yaml


def presched(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "presched.cli", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=300)  # fmt: skip


# `python -m presched.cli` with every internet socket refused: a run that reaches the network fails
OFFLINE = ("import socket, runpy\n"
           "def refuse(self, *a, **k):\n"
           "    if self.family in (socket.AF_INET, socket.AF_INET6):\n"
           "        raise OSError('network used by an offline run')\n"
           "    return connect(self, *a, **k)\n"
           "connect = socket.socket.connect\n"
           "socket.socket.connect = refuse\n"
           "runpy.run_module('presched.cli', run_name='__main__', alter_sys=True)\n")  # fmt: skip


def test_bench_with_no_arguments_works_offline(tmp_path):
    env = {**os.environ, "PRESCHED_DATA_DIR": str(tmp_path / "no-data")}  # no data either
    r = subprocess.run([sys.executable, "-c", OFFLINE, "bench"], capture_output=True, text=True,
                       cwd=tmp_path, timeout=300, env=env)  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = tmp_path / "presched-results"
    doc = json.loads((out / "bench.json").read_text())
    assert [row["policy"] for row in doc["rows"][:4]] == ["fcfs", "mlfq", "sjf-oracle", "srpt-oracle"]
    assert len(doc["rows"]) == 20 and (out / "bench.png").exists()
    assert "srpt-oracle" in r.stdout and "E2EL" in r.stdout
    assert "noisy oracle, sigma 0.79" in r.stdout and "mlfq-preempt+sjf" in r.stdout
    at = {row["policy"]: row for row in doc["rows"] if row["load"] == 0.95}
    # the point of the project: ordering by predicted length pays on the default workload
    assert at["srpt-oracle"]["mean_e2el_ms"] < at["mlfq"]["mean_e2el_ms"] < 0.85 * at["fcfs"]["mean_e2el_ms"]


def test_experiment_file_and_overrides(tmp_path):
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump({
        "workload": {"num_requests": 300, "seed": 3},
        "sim": {"engine": {"max_num_seqs": 16}, "num_instances": 2, "router": "least-requests"},
        "policies": ["fcfs"], "loads": [0.6], "capacity_requests": 200,
    }))  # fmt: skip
    r = presched("bench", "-c", str(exp), "--set", "slo.ttft_ms=500", "-o", str(tmp_path / "o"), "-q")
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "o" / "bench.json").read_text())
    assert doc["config"]["sim"]["num_instances"] == 2 and doc["config"]["slo"]["ttft_ms"] == 500
    assert doc["rows"][0]["completed"] == 300


def test_bad_input_names_the_field_without_traceback(tmp_path):
    cases = [
        (["bench", "--max-num-seqs", "0"], "sim.engine.max_num_seqs"),
        (["bench", "--set", "sim.engine.block_size=abc"], "sim.engine.block_size"),
        (["bench", "--policies", "fcfs,nope"], "unknown policy 'nope'"),
        (["bench", "--set", "nonsense=1"], "nonsense"),
        # a long path is printed whole (an error wrapped at 80 columns breaks the path it names)
        (["bench", "-w", "azure", "--path", str(tmp_path / ("x" * 90) / "missing.csv")],
         str(tmp_path / ("x" * 90) / "missing.csv")),
        (["bench", "-c", str(tmp_path / "nofile.yaml")], "nofile.yaml"),
    ]
    bad = tmp_path / "bad.csv"
    bad.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,x\n")
    cases.append((["simulate", "-w", "azure", "--path", str(bad)], "line 2"))
    for args, needle in cases:
        r = presched(*args, cwd=tmp_path)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert needle in r.stderr, (args, r.stderr)
        assert "Traceback" not in r.stderr


def test_simulate_prints_json_and_writes_records(tmp_path):
    r = presched("simulate", "-n", "200", "--policy", "sjf-oracle", "--json",
                 "--records", str(tmp_path / "rec.csv"))  # fmt: skip
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["completed"] == 200 and s["mean_e2el_ms"] > 0
    assert (tmp_path / "rec.csv").read_text().count("\n") == 201


def test_config_lists_every_field_with_help():
    r = presched("config")
    assert r.returncode == 0
    for path in ("sim.engine.max_num_batched_tokens", "workload.arrivals", "sim.step_time.hardware", "slo.tpot_ms"):
        assert path in r.stdout


def test_config_lists_fields_of_optional_sub_configs():
    # sim.disaggregated is None by default: its fields are listed all the same (under a null row)
    r = presched("config")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    for path in ("sim.disaggregated.num_prefill", "sim.disaggregated.kv_transfer_gbps",
                 "sim.disaggregated.prefill_engine.max_num_seqs", "predictions.sigma"):  # fmt: skip
        assert any(line.split("│")[1].strip() == path for line in lines if "│" in line), path
    row = next(line for line in lines if "│" in line and line.split("│")[1].strip() == "sim.disaggregated")
    assert row.split("│")[2].strip() == "null"


def test_config_lists_each_policys_parameters():
    r = presched("config", "--policy", "mlfq")
    assert r.returncode == 0, r.stderr
    rows = [[c.strip() for c in line.split("│")[1:-1]] for line in r.stdout.splitlines() if "│" in line]
    by_name = {row[1]: row for row in rows if row[1]}
    assert by_name["base_quantum"][2:4] == ["float (> 0)", "32.0"]
    assert by_name["num_levels"][2:4] == ["int (>= 1, <= 64)", "8"]
    assert by_name["base_quantum"][4].startswith("Quantum of level 0")
    assert "slo.tpot_ms" not in r.stdout  # only the policy's table
    r = presched("config")  # the plain listing ends with every policy's parameters
    assert r.returncode == 0, r.stderr
    assert "headroom" in r.stdout and "starvation_s" in r.stdout and "slo.tpot_ms" in r.stdout
    r = presched("config", "--policy", "nope")
    assert r.returncode == 2 and "unknown policy 'nope'" in r.stderr and "Traceback" not in r.stderr


def test_bad_policy_params_name_the_dotted_path(tmp_path):
    exp = tmp_path / "exp.yaml"
    exp.write_text("sim:\n  policy: kv-admission\n  policy_params: {inner: mlfq, inner_params: {base_quantum: 0}}\n")
    cases = [
        (["simulate", "-n", "10", "--policy", "mlfq", "--set", "sim.policy_params.base_quantum=0"],
         "sim.policy_params.base_quantum: Input should be greater than 0"),
        (["simulate", "-n", "10", "-c", str(exp)],
         "sim.policy_params.inner_params.base_quantum: Input should be greater than 0"),
        (["bench", "--set", "policy_params={mlfq: {num_levels: 0}}"], "policy_params.mlfq.num_levels"),
    ]  # fmt: skip
    for args, needle in cases:
        r = presched(*args, cwd=tmp_path)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert needle in " ".join(r.stderr.split()), (args, r.stderr)
        assert "Traceback" not in r.stderr
