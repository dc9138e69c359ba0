"""What a person reads from `presched`: help that shows flags as flags and the defaults, error
messages that name the option and say how to fix it (without pydantic's noise), progress lines
off a terminal, and a warning when a run is far past capacity. Real subprocesses, stdout and
stderr piped (not a terminal), as in a log or CI."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def presched(*args, cwd=None):
    env = {**os.environ, "COLUMNS": "200"}  # help and messages unwrapped, so phrases can be matched
    return subprocess.run([sys.executable, "-m", "presched.cli", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=300, env=env)  # fmt: skip


def test_help_shows_flags_as_flags_and_the_defaults():
    sim = presched("simulate", "--help").stdout
    assert "--json" in sim and "<bool>" not in sim
    bench = presched("bench", "--help").stdout
    assert (
        "Default: fcfs,mlfq,sjf-oracle,srpt-oracle." in bench
        and "Default: 0.5,0.7,0.8,0.9,0.95." in bench
    )
    assert "Default: 64." in bench and "<bool>" not in bench
    serve = presched("serve", "--help").stdout
    assert "'none' disables it" in serve and "null disables it" not in serve
    assert "Default: presched-requests.sqlite." in serve and "Default: 8080." in serve
    for cmd in ("bench", "simulate", "serve", "train", "eval", "replay"):  # a list option's metavar
        text = presched(cmd, "--help").stdout
        assert "list[str]" not in text and ("PATH=VALUE" in text or "KEY=VALUE" in text), cmd
    train = presched("train", "--help").stdout
    seed = train[train.index("--seed") :].split("\n")[0]
    assert "latency" not in seed and "--quiet" in train


def test_bad_list_option_names_the_option(tmp_path):
    r = presched("bench", "--loads", "0.5,abc", cwd=tmp_path)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "--loads" in r.stderr and "'abc' is not a number" in r.stderr


def test_castillo_without_a_model_says_how_to_give_one(tmp_path):
    r = presched("bench", "-w", "castillo", cwd=tmp_path)
    assert r.returncode == 2 and "--set workload.model=" in r.stderr


def test_validation_errors_lose_pydantics_prefix_and_input_dumps(tmp_path):
    r = presched(
        "bench", "--set", 'workload={"source": "castillo", "num_requests": 5}', cwd=tmp_path
    )
    assert r.returncode == 2 and "model is required" in r.stderr
    assert "Value error" not in r.stderr and "(got {" not in r.stderr
    # replay prints its own errors (not through presched.cli's cleaner): the same clean lines
    r = presched("replay", "--url", "http://127.0.0.1:9", "--set",
                 'workload={"source": "castillo", "num_requests": 5}', cwd=tmp_path)  # fmt: skip
    assert r.returncode == 2 and "workload: model is required by source 'castillo'" in r.stderr
    assert "Value error" not in r.stderr and "(got {" not in r.stderr


def test_garbage_model_file_is_not_a_presched_model_file(tmp_path):
    bad = tmp_path / "bad.npz"
    bad.write_text("not a model")
    r = presched("predict", "-m", str(bad), "-i", str(EXAMPLES / "requests.jsonl"))
    assert r.returncode == 2 and "not a presched model file" in r.stderr
    assert "pickle" not in r.stderr


def test_run_far_past_capacity_warns_before_the_numbers(data_dir):
    r = presched("simulate", "-w", "mooncake-conv", "-n", "2000", "--json")
    assert r.returncode == 0, r.stderr
    assert "warning: offered load is" in r.stderr and json.loads(r.stdout)["completed"] == 2000
    for n in ("200", "300"):  # 200: one long answer near the end made it warn with no queue at all
        ok = presched("simulate", "-n", n, "--json")
        assert ok.returncode == 0 and "warning" not in ok.stderr, (n, ok.stderr)


def test_train_prints_progress_unless_quiet(tmp_path):
    args = (
        "train",
        "-p",
        "model-median",
        "-d",
        str(EXAMPLES / "requests.jsonl"),
        "-o",
        str(tmp_path / "m.npz"),
    )
    r = presched(*args)
    assert r.returncode == 0, r.stderr
    assert "loading" in r.stderr and "fitting model-median on 30 requests" in r.stderr
    q = presched(*args, "--quiet")
    assert q.returncode == 0 and q.stderr == "" and "trained model-median" in q.stdout


def test_eval_prints_progress_lines_off_a_terminal(tmp_path):
    r = presched("eval", "-p", "model-median,linear-prompt", "-d", str(EXAMPLES / "requests.jsonl"),
                 "-o", str(tmp_path / "ev"), "--quiet")  # fmt: skip
    assert r.returncode == 0, r.stderr
    r = presched("eval", "-p", "model-median,linear-prompt", "-d", str(EXAMPLES / "requests.jsonl"),
                 "-o", str(tmp_path / "ev"))  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "[1/2]" in r.stderr and "[2/2]" in r.stderr


@pytest.mark.parametrize("cmd", [("bench", "--help"), ("simulate", "--help")])
def test_help_runs(cmd):
    assert presched(*cmd).returncode == 0


def test_a_dumped_config_loads_back_into_bench(tmp_path):
    """`presched config --dump x.yaml` then `presched bench -c x.yaml` runs (the defaults,
    noisy-oracle predictions and mlfq parameters included, survive the round trip)."""
    assert presched("config", "--dump", "x.yaml", cwd=tmp_path).returncode == 0
    r = presched("bench", "-c", "x.yaml", "-n", "200", "--loads", "0.9", "-o", "out", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "out" / "bench.json").read_text())
    assert doc["config"]["predictions"]["source"] == "noisy-oracle"
    assert [row["policy"] for row in doc["rows"]] == ["fcfs", "mlfq", "sjf-oracle", "srpt-oracle"]


def test_eval_on_castillo_says_it_is_building_the_views(tmp_path, data_dir):
    r = presched("eval", "-p", "model-median", "--quick", "300", "--view", "in-dist",
                 "-o", str(tmp_path / "ev"))  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "building the CASTILLO views: in-dist" in r.stderr and "[1/1] in-dist / model-median" in r.stderr


def test_bench_loads_past_capacity_warn(tmp_path):
    r = presched("bench", "-n", "200", "--loads", "0.9,1.2", "-p", "fcfs", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "warning: loads 1.2 are past capacity" in r.stderr
    ok = presched("bench", "-n", "200", "--loads", "0.9", "-p", "fcfs", cwd=tmp_path)
    assert "warning" not in ok.stderr


def test_config_on_an_80_column_terminal_folds_and_cuts_nothing():
    """`presched config` on a terminal keeps to its width (it printed 140 wide, so an 80-column
    terminal wrapped every line); a dotted path folds onto the next line, never cut."""
    from presched.bench.config import BenchConfig
    from presched.cli import _fields

    env = {**os.environ, "COLUMNS": "80", "TTY_COMPATIBLE": "1", "NO_COLOR": "1"}  # rich: a terminal
    r = subprocess.run([sys.executable, "-m", "presched.cli", "config"], capture_output=True, text=True,
                       timeout=120, env=env)  # fmt: skip
    assert r.returncode == 0, r.stderr
    out = re.sub(r"\x1b\[[0-9;]*m", "", r.stdout)  # bold and italic stay on a terminal
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 80 and "…" not in out
    first = lines[: next(i for i, line in enumerate(lines) if line.startswith("└"))]
    fragments = [line.split("│")[1].strip() for line in first if line.startswith("│")]
    assert "".join(fragments) == "".join(path for path, _d, _m in _fields(BenchConfig()))


@pytest.mark.parametrize(("args", "says"), [
    (["simulate", "--set", "policy_params.mlfq.base_quantum=1"],
     ["policy_params.mlfq.base_quantum", "sim.policy_params.base_quantum"]),
    (["simulate", "--set", "loads=[0.5]"], ["loads", "--rate"]),
    (["bench", "--set", "sim.policy=sjf"], ["sim.policy", "--policies"]),
    (["bench", "--set", "sim.policy_params.base_quantum=64"],
     ["sim.policy_params.base_quantum", "policy_params.mlfq.base_quantum"]),
])  # fmt: skip
def test_a_field_the_command_ignores_is_refused_with_what_to_use(args, says):
    r = presched(*args)
    assert r.returncode == 2 and "does not use" in r.stderr, r.stderr
    for s in says:
        assert s in r.stderr, (s, r.stderr)


def test_a_dumped_config_still_runs_in_both_commands(tmp_path):
    dump = tmp_path / "all.yaml"
    assert presched("config", "--dump", str(dump)).returncode == 0
    r = presched("simulate", "-c", str(dump), "-n", "50", "--json")
    assert r.returncode == 0, r.stderr
    data = yaml_load(dump)
    data["policy_params"] = {"sjf": {"stat": "mean"}}
    dump.write_text(json.dumps(data))
    r = presched("simulate", "-c", str(dump), "-n", "50", "--json")
    assert r.returncode == 2 and "policy_params (in the experiment file)" in r.stderr, r.stderr


def yaml_load(path):
    import yaml

    return yaml.safe_load(path.read_text())


def test_bench_errors_point_at_the_settings_bench_has(tmp_path):
    r = presched("bench", "-p", "sjf", "-n", "50", "--loads", "0.9", "--set", "capacity_requests=50",
                 "--set", "predictions.source=none", "-o", str(tmp_path / "a"))  # fmt: skip
    assert r.returncode == 2 and "--set predictions.source=" in r.stderr, r.stderr
    r = presched("bench", "-w", "generic", "--path", str(EXAMPLES / "requests.jsonl"), "--arrivals",
                 "poisson", "-o", str(tmp_path / "b"))  # fmt: skip
    assert r.returncode == 2 and "--set workload.rate=R" in r.stderr, r.stderr
