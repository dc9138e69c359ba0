"""The core of benchmarks/steptime_vs_mlenergy.py on one small configuration (fast)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from presched.sim.steptime import load_mlenergy

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "steptime_vs_mlenergy.py"


def _load_script():
    name = "steptime_vs_mlenergy_script"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def bench():
    return _load_script()


@pytest.fixture(scope="module")
def config_8b_n8(data_dir):
    configs = load_mlenergy(
        data_dir / "mlenergy-leaderboard-llm",
        model="meta-llama/Llama-3.1-8B-Instruct", gpu="H100", task="lm-arena-chat",
    )
    (c,) = [c for c in configs if c.max_num_seqs == 8]
    return c


@pytest.fixture(scope="module")
def row(bench, config_8b_n8):
    return bench.compare(config_8b_n8, num_requests=300, seed=0)


def test_median_itl_within_band(row):
    meas, sim = row["measured"]["median_itl_ms"], row["simulated"]["median_itl_ms"]
    assert abs(sim - meas) <= 0.35 * meas, (sim, meas)
    assert row["itl_err_pct"] == pytest.approx(100 * (sim - meas) / meas)
    # a saturated engine at N = 8 keeps 8 requests running in the steady state
    assert row["simulated"]["avg_batch_size"] == pytest.approx(8, abs=0.5)


def test_steady_window_excludes_the_ramp_down(row):
    w = row["window"]
    assert 0 < w["start_s"] < w["end_s"] < w["duration_s"]
    # the window closes when num_requests - N - 1 requests are done: no later than the last
    # admission (up to the polling granularity), i.e. before fewer than N requests remain
    assert w["end_s"] <= w["last_admission_s"] + 0.1 + 0.05
    # the drain after it produced gaps that the steady-state figures do not count
    assert w["gaps_after_window"] > 0
    assert w["gaps_in_window"] + w["gaps_after_window"] <= w["gaps_total"]
    assert w["tokens"] < row["num_requests"] * row["mean_output_tokens"]


def test_requests_follow_the_configuration(bench, config_8b_n8):
    reqs = bench.make_requests(config_8b_n8, 2000, bench.PROMPTS["short"], seed=1)
    assert all(r.arrival == 0.0 for r in reqs)
    out = [r.output_tokens for r in reqs]
    lo, hi = config_8b_n8.output_length_bins[0], config_8b_n8.output_length_bins[-1]
    assert lo - 1 <= min(out) and max(out) <= hi
    mean_out = sum(out) / len(out)
    assert mean_out == pytest.approx(config_8b_n8.avg_output_len, rel=0.1)
    prompts = sorted(r.prompt_tokens for r in reqs)
    assert prompts[len(prompts) // 2] == pytest.approx(bench.PROMPTS["short"].median, rel=0.1)
    # same seed, same requests
    assert reqs == bench.make_requests(config_8b_n8, 2000, bench.PROMPTS["short"], seed=1)


def _as(config, **change):
    import dataclasses

    return dataclasses.replace(config, **change)


@pytest.mark.parametrize("change,sent", [
    ({"max_num_seqs": 768}, 1024 * 3),  # lm-arena-chat 8B H100 sweeps.yaml: 768 -> x3
    ({"max_num_seqs": 192}, 1024),
    ({"task": "gpqa", "model_id": "Qwen/Qwen3-14B", "max_num_seqs": 192}, 198 * 2),
    ({"task": "gpqa", "model_id": "Qwen/Qwen3-14B", "max_num_seqs": 64}, 198),
    ({"task": "sourcegraph-fim", "model_id": "Qwen/Qwen3-Coder-30B-A3B-Instruct",
      "num_gpus": 2, "max_num_seqs": 768}, 1024 * 3),
    # not in any sweep file: Scout on 8 H100 at 512 takes its 4-GPU sweep's x2
    ({"model_id": "meta-llama/Llama-4-Scout-17B-16E-Instruct", "num_gpus": 8,
      "max_num_seqs": 512}, 1024 * 2),
])  # fmt: skip
def test_requests_sent_follow_the_sweep_files(bench, config_8b_n8, change, sent):
    assert bench.ml_energy_num_requests(_as(config_8b_n8, **change)) == sent


def test_each_task_has_its_max_tokens_and_prompts(bench, config_8b_n8):
    gpqa = _as(config_8b_n8, task="gpqa", output_length_bins=(1000.0, 30000.0),
               output_length_counts=(1,))  # fmt: skip
    out = [r.output_tokens for r in bench.make_requests(gpqa, 400, bench.TASKS["gpqa"].prompts)]
    assert max(out) > 4096  # thinking outputs are not cut at lm-arena-chat's 4096
    assert max(out) <= 32768
    chat = _as(gpqa, task="lm-arena-chat")
    chat_out = [r.output_tokens for r in bench.make_requests(chat, 400, bench.PROMPTS["short"])]
    assert max(chat_out) == 4096
    fim = bench.TASKS["sourcegraph-fim"]
    assert (fim.num_requests, fim.max_output_tokens) == (1024, 2048)
    assert fim.prompts.cap + fim.max_output_tokens <= 20480  # vLLM's max-model-len


def test_multimodal_tasks_are_refused_naming_the_task(bench, config_8b_n8):
    why = bench.not_expressible(_as(config_8b_n8, task="image-chat"))
    assert "task: 'image-chat' is not modelled" in why
    assert bench.not_expressible(config_8b_n8) is None


def test_twins_share_an_architecture_and_quantizations_do_not(bench, config_8b_n8):
    import steptime_saturated as sat

    arch = {m: sat.architecture(_as(config_8b_n8, model_id=m)) for m in (
        "meta-llama/Llama-3.1-70B-Instruct", "meta-llama/Llama-3.3-70B-Instruct",
        "Qwen/Qwen3-235B-A22B-Instruct-2507", "Qwen/Qwen3-235B-A22B-Thinking-2507",
        "Qwen/Qwen3-235B-A22B-Thinking-2507-FP8", "deepseek-ai/DeepSeek-R1-0528",
        "deepseek-ai/DeepSeek-V3.1")}  # fmt: skip
    assert arch["meta-llama/Llama-3.1-70B-Instruct"] == "llama-3.1-70b = llama-3.3-70b"
    assert arch["meta-llama/Llama-3.3-70B-Instruct"] == "llama-3.1-70b = llama-3.3-70b"
    assert arch["Qwen/Qwen3-235B-A22B-Instruct-2507"] == arch["Qwen/Qwen3-235B-A22B-Thinking-2507"]
    assert arch["Qwen/Qwen3-235B-A22B-Thinking-2507-FP8"] == "qwen3-235b-a22b-fp8"
    assert arch["deepseek-ai/DeepSeek-R1-0528"] == arch["deepseek-ai/DeepSeek-V3.1"]
    assert arch["deepseek-ai/DeepSeek-V3.1"] == "deepseek-v3"


@pytest.mark.parametrize("case", ["nan-bin", "bad-tp", "missing", "no-task"])
def test_bad_data_is_an_error_message_with_exit_code_2(bench, data_dir, tmp_path, capsys, case):
    """A malformed file, a missing folder or a --task nothing has: `error: ...` naming the file or
    field and exit code 2 (main returned through a traceback)."""
    import json

    name = "meta-llama__Llama-3.1-8B-Instruct__lm-arena-chat.json"
    data = json.loads((data_dir / "mlenergy-leaderboard-llm" / "models" / name).read_text())
    if case == "nan-bin":
        data["configurations"][0]["output_length_distribution"]["bins"][1] = float("nan")
    if case == "bad-tp":
        data["configurations"][0]["parallelization"]["tensor_parallel"] = 3
    folder = tmp_path / "data"
    folder.mkdir()
    (folder / name).write_text(json.dumps(data))
    args = ["--data", str(tmp_path / "nowhere" if case == "missing" else folder), "--out", str(tmp_path / "out"),
            "--quick", "--no-calibration"] + (["--task", "no-such-task"] if case == "no-task" else [])  # fmt: skip
    assert bench.main(args) == 2
    err = capsys.readouterr().err
    expected = {"nan-bin": "output_length_distribution.bins", "bad-tp": "parallelization.tensor_parallel",
                "missing": "does not exist", "no-task": "task='no-such-task'"}[case]  # fmt: skip
    assert err.startswith("error: ") and expected in err and not (tmp_path / "out").exists()
