"""benchmarks/engine_e2e.py end to end in its --quick mode against the real vLLM CPU engine (tiny
random Llama, four real `presched serve` gateways, real HTTP), plus its figure arithmetic.

The quick run needs the engine venv (scripts/engine/install.sh): without it the test is SKIPPED,
in CI (CI set) it FAILS, as in tests/engine."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
from builders import BENCHMARKS, load_benchmark, printed_figures, require_engine

SCRIPT = BENCHMARKS / "engine_e2e.py"
CONFIGS = ("direct-fcfs", "passthrough", "gateway-sjf", "gateway-oracle", "gateway-fcfs")


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("engine_e2e.py")


@pytest.mark.engine
def test_quick_run_replays_every_configuration_and_compares_with_the_simulator(tmp_path):
    require_engine()
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--out", str(tmp_path)],
                          check=False, capture_output=True, text=True, timeout=420)  # fmt: skip
    # the timeout catches a hang (~65 s on 2 busy cores); how fast it ran is not asserted
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    figures = printed_figures(proc.stdout)
    names = list(figures)
    assert names[:2] == ["engine_fcfs_over_sjf_mean_e2e", "sim_vs_engine_mean_e2e_error_pct"]
    assert figures["engine_fcfs_over_sjf_mean_e2e"] > 0
    assert all(math.isfinite(v) for v in figures.values())

    res = json.loads((tmp_path / "engine_e2e.json").read_text())
    assert (tmp_path / "engine_e2e.png").stat().st_size > 10_000
    meta = res["meta"]
    assert meta["quick"] and meta["requests"] == 16 and meta["repeats"] == 1
    # the engine core had a CPU of its own (where there are two to split)
    assert meta["cpus"]["pinned"] == (len(os.sched_getaffinity(0)) >= 2)
    assert res["figures"] == pytest.approx(figures, rel=1e-3)
    assert list(res["summary"]) == list(CONFIGS)
    assert len(res["runs"]) == 5 and {r["config"] for r in res["runs"]} == set(CONFIGS)
    # the headline error is |sim / engine - 1| on mean E2E of the one direct-fcfs run
    (direct,) = [r for r in res["runs"] if r["config"] == "direct-fcfs"]
    err = abs(100 * (direct["sim"]["mean_e2el_ms"] / direct["summary"]["mean_e2el_ms"] - 1))
    assert figures["sim_vs_engine_mean_e2e_error_pct"] == pytest.approx(err, rel=1e-3, abs=1e-3)
    for run in res["runs"]:
        # every request answered, each with exactly its forced length, through every gateway
        assert run["summary"]["completed"] == 16 and run["summary"]["failed"] == 0, run["errors_by_status"]
        assert run["output_tokens"] == meta["total_output_tokens"]
        assert run["engine_decode_s_per_token"] > 0 and run["cpu_s"]["engine"] > 0
        # the simulator replayed the same requests at the times they were actually sent
        assert run["sim"]["completed"] == 16 and run["sim"]["output_tokens"] == meta["total_output_tokens"]
        assert len(run["e2e_s"]) == 16 and None not in run["e2e_s"] and None not in run["sent_s"]
        # the speed fitted to the run makes the simulator's decode seconds per token the engine's
        assert run["speed_factor"] > 0 and run["sim_a_priori"]["factor"] == 1.0
        assert abs(run["sim"]["decode_s_per_token"] / run["engine_decode_s_per_token"] - 1) < 0.05
    # the engine counted the prompts as the tiny Llama's tokenizer does (the simulator uses them)
    assert meta["prompt_counts_differing_from_tokenizer"] == 0
    assert len(meta["request_ids"]) == len(meta["prompt_tokens_engine"]) == 16
    (sim,) = res["sim"]
    assert set(sim) == {"fcfs", "sjf", "sjf-oracle"}
    assert all(s["output_tokens"] == meta["total_output_tokens"] and s["completed"] == 16 for s in sim.values())
    (cal,) = res["calibrations"]
    assert cal["model"]["kind"] == "fitted" and cal["mape"] < 1.0
    assert meta["capacity_tok_s"] > 0 and meta["rate_req_s"] > 0


def test_sim_error_is_the_median_over_repeats_of_the_relative_error_on_mean_e2e(bench):
    # direct-fcfs twice: engine 100 ms / sim 110 ms (+10 %), engine 200 ms / sim 190 ms (-5 %)
    def run(k, engine, sim):
        figs = {"mean_e2el_ms": engine, "p99_e2el_ms": 0, "short_p99_e2el_ms": 0,
                "output_throughput": 0, "mean_ttft_ms": 0, "failed": 0}  # fmt: skip
        return {"config": "direct-fcfs", "repeat": k, "summary": figs,
                "sim": {"mean_e2el_ms": sim}, "sim_a_priori": {"mean_e2el_ms": 2 * engine},
                "sim_slower": {"mean_e2el_ms": 1.05 * sim}, "speed_factor": 1.0,
                "engine_decode_s_per_token": 0.01, "others_cores": 0.0}  # fmt: skip

    s = bench.summarize_runs([run(0, 100.0, 110.0), run(1, 200.0, 190.0)])["direct-fcfs"]
    assert s["sim_mean_e2e_error_pct_each"] == pytest.approx([10.0, -5.0])
    assert s["sim_mean_e2e_error_pct"] == pytest.approx(2.5)  # signed: errors of both signs cancel
    assert s["sim_mean_e2e_abs_error_pct"] == pytest.approx(7.5)  # the figure: they do not
    assert s["sim_a_priori_mean_e2e_abs_error_pct"] == pytest.approx(100.0)


def test_paired_ratios_are_medians_of_per_repeat_ratios(bench):
    runs = [{"config": c, "repeat": k, "summary": {"mean_e2el_ms": v}}
            for k, (a, b) in enumerate([(10, 5), (9, 3), (8, 8)])
            for c, v in (("direct-fcfs", a), ("gateway-sjf", b))]  # fmt: skip
    assert bench.paired_ratio(runs, "direct-fcfs", "gateway-sjf") == 2.0  # ratios 2, 3, 1
    assert math.isnan(bench.paired_ratio(runs, "direct-fcfs", "gateway-oracle"))  # not run


def test_inengine_figures_per_repeat_and_medians(bench):
    # per repeat: stock FCFS, plugin fcfs, default, no-preempt mlfq, oracle (mean E2E ms, tok/s)
    table = [(100, 100, 80, 90, 60, 1000, 990), (120, 110, 100, 100, 70, 900, 950), (90, 95, 95, 85, 50, 1100, 1100)]
    runs = []
    for k, (f, pf, d, n, o, tf, tp) in enumerate(table):
        for c, e2e, tok in (("direct-fcfs", f, tf), ("plugin-fcfs", pf, tp), ("plugin-default", d, 1),
                            ("plugin-mlfq-np", n, 1), ("plugin-oracle", o, 1)):
            runs.append({"config": c, "repeat": k, "summary": {"mean_e2el_ms": e2e, "p99_e2el_ms": 2 * e2e,
                                                               "output_throughput": tok}})
    summary = {c: {"sim_mean_e2e_abs_error_pct": e} for c, e in (("plugin-fcfs", 1.0), ("plugin-default", 5.0),
                                                                ("plugin-mlfq-np", 2.0), ("plugin-oracle", 9.0))}
    spread = bench.inengine_spreads(runs, "azure-code")
    # capture = (FCFS - policy) / (FCFS - oracle), each repeat: 20/40, 20/50, -5/40
    assert spread["engine_gain_capture_code"] == pytest.approx([0.5, 0.4, -0.125])
    assert spread["engine_gain_capture_mlfq_np_code"] == pytest.approx([0.25, 0.4, 0.125])
    # overhead on output tok/s: stock over plugin, - 1
    assert spread["engine_plugin_overhead_pct"] == pytest.approx([100 * (1000 / 990 - 1), 100 * (900 / 950 - 1), 0.0])
    figs = bench.inengine_figures(runs, summary, "azure-code")
    assert figs["engine_gain_capture_code"] == pytest.approx(0.4)
    assert figs["engine_fcfs_over_default_mean_e2e_code"] == pytest.approx(1.2)  # median of 1.25, 1.2, 0.947
    assert figs["engine_default_p99_vs_fcfs_code"] == pytest.approx(100 / 120)
    assert figs["engine_inengine_sim_error_pct"] == pytest.approx(3.5)  # median of 1, 5, 2, 9


def _decode_model(per_factor, jumps=()):
    """A stand-in for the simulator's decode s/token as a function of the speed factor: linear,
    plus steps where batches regroup (the jumps a 16-request run shows)."""
    calls = []

    def simulate(f):
        calls.append(f)
        return {"factor": f, "decode_s_per_token": per_factor * f * (1 + sum(d for x, d in jumps if f > x))}

    return simulate, calls


@pytest.mark.parametrize("target", [0.5, 1.0, 1.37, 3.0])
def test_fit_speed_reaches_the_engine_speed_on_a_smooth_response(bench, target):
    sim, calls = _decode_model(0.9, [(1.2, -0.03)])
    got = bench.fit_speed(sim, target, sim(1.0))
    assert abs(got["decode_s_per_token"] / target - 1) < 0.005 and len(calls) <= 8


def test_fit_speed_brackets_a_jump_instead_of_oscillating_across_it(bench):
    # nothing lands within tolerance: just above f=1.1 batches regroup and per-token time jumps
    # 10 %, so s/token skips from 1.10 to 1.21 and 1.15 is never simulated; fixed-point steps
    # alone bounce across the gap, the fit must bisect the bracket, stop, and return the nearest
    sim, calls = _decode_model(1.0, [(1.1, 0.10)])
    got = bench.fit_speed(sim, 1.15, sim(1.0))
    assert got["factor"] == pytest.approx(1.1, rel=0.01) and len(calls) <= 13
    assert abs(got["decode_s_per_token"] / 1.15 - 1) < 0.045
