"""benchmarks/policies_markdown.py: the evidence page's tables from a policies.json, on a small
hand-made result whose figures are known (the real JSON is the benchmark's output)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from builders import load_benchmark

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def md():
    return load_benchmark("policies_markdown.py")


def row(w, load, policy, mean_s, p99_s, inst=1, seed=None, **extra):
    r = {"workload": w, "load": load, "policy": policy, "instances": inst, "mean_e2el_ms": mean_s * 1e3,
         "p99_e2el_ms": p99_s * 1e3, "short_p99_e2el_ms": p99_s * 500, "long_p99_queue_wait_ms": p99_s * 900,
         "mean_ttft_ms": mean_s * 400, "preemptions": 3, **extra}  # fmt: skip
    if seed is not None:
        r["seed"] = seed
    return r


def result():
    rows = [row("code", 0.9, "fcfs", 40, 90), row("code", 0.9, "srpt-oracle", 20, 100), row("code", 0.9, "rank", 30, 99),
            row("code", 0.9, "rank|prompt-oracle", 25, 90),
            row("code", 0.9, "fcfs", 10, 30, inst=4), row("code", 0.9, "srpt-oracle", 10, 30, inst=4),
            row("code", 0.9, "rank", 10, 30, inst=4)]  # fmt: skip
    seed_rows = [row("code", 0.9, "fcfs", 50, 100, seed=1), row("code", 0.9, "srpt-oracle", 30, 100, seed=1),
                 row("code", 0.9, "rank", 45, 120, seed=1)]  # fmt: skip
    return {"meta": {"loads": [0.9]}, "rows": rows, "seed_rows": seed_rows,
            "noise_sweep": [{"workload": "code", "load": 0.9, "sigma": 0.5, "tau": 0.61, "policy": "rank",
                             "mean_e2el_ms": 35_000, "p99_e2el_ms": 1}],
            "pareto": [{"policy": "rank", "knob": "starvation_s", "value": 60, "mean_e2el_ms": 30_000, "p99_e2el_ms": 99_000}],
            "routing": [{"router": "least-work", "policy": "srpt", "mean_e2el_ms": 8_770, "p99_e2el_ms": 34_600,
                         "short_p99_e2el_ms": 18_600}]}  # fmt: skip


def test_gain_capture_and_tail_ratios_are_computed_against_their_own_setting(md):
    text = md.render(result())
    # rank on code, seed 0: (40 - 30) / (40 - 20) = 0.50, P99 99 / 90 = 1.10
    assert "| rank | 30.00 | 99.0 | 49.50 | 89.1 | 12.00 | 3 | 0.50 | 1.10 |" in text
    assert "| rank|prompt-oracle | 25.00 | 90.0 |" in text and "| 0.75 | 1.00 |" in text
    # seeds table: seed 1 against seed 1's own FCFS / oracle: (50 - 45) / (50 - 30) = 0.25; mean 0.375
    assert "| rank | 0.50 (1.10x) | 0.25 (1.20x) | 0.38 |" in text
    # 4 instances: FCFS equals the oracle -> capture is undefined, written n/a
    assert "| rank | 10.00 (n/a) |" in text
    # noise sweep (35 s -> 0.25), knobs, routers
    assert "| code 0.9 | 0.5 | 0.61 | 0.25 |" in text
    assert "| rank | starvation_s=60 | 30.00 | 99.0 | 1.10 | 0.50 |" in text
    assert "| least-work | srpt | 8.77 | 34.6 | 18.60 |" in text
    # a setting without its FCFS / oracle rows is left out, not a crash
    assert "### conv" not in text and "### mooncake" not in text


def test_the_script_reads_a_json_path_and_names_a_missing_one(tmp_path):
    path = tmp_path / "p.json"
    path.write_text(json.dumps(result()))
    script = str(ROOT / "benchmarks" / "policies_markdown.py")
    ok = subprocess.run([sys.executable, script, "--json", str(path)], capture_output=True, text=True, check=True)
    assert ok.stdout.startswith("### code, load 0.90, 1 instance")
    bad = subprocess.run([sys.executable, script, "--json", str(tmp_path / "none.json")], capture_output=True, text=True)
    assert bad.returncode != 0 and "--json" in bad.stderr and "Traceback" not in bad.stderr
