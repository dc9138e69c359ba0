"""benchmarks/probe_ceiling.py: the leave-one-out oracle and the Gaussian-copula prompt-level
ceiling on planted answer lengths with known answers (closed forms), bad input, and the script
end to end. The real data is the committed 4-sample SmolLM2 dataset (seconds to run)."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest
from builders import BENCHMARKS, load_benchmark, printed_figures

from presched.predict.metrics import kendall_tau_b


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("probe_ceiling.py")


def _write(path, rows, cap=512):
    lines = [json.dumps({"config": {"model": "m", "max_tokens": cap, "samples": 4}})]
    lines += [json.dumps({"prompt_id": f"p{i}", "split": split, "lengths": ls}) for i, (split, ls) in enumerate(rows)]
    path.write_text("\n".join(lines) + "\n")
    return path


def test_loo_oracle_keeps_answers_still_running_and_predicts_their_siblings_mean(bench):
    # at g = 50 only the two 100s, the 80 and the 100 run (an answer of exactly 50 has ended)
    pred, target = bench.loo_oracle([[10, 100, 100, 50], [80, 20, 100, 30], [60, 1, 2, 3]], 50)
    assert target.tolist() == [50, 50, 30, 50]
    assert pred.tolist() == [50, 50, 50, 30]  # the third prompt has one running answer: left out
    p0, t0 = bench.loo_oracle([[1, 2, 3]], 0)
    assert t0.tolist() == [1, 2, 3] and p0.tolist() == [2.5, 2.0, 1.5]


def test_answers_without_noise_rank_perfectly(bench):
    lengths = [[10 * i + 1] * 4 for i in range(30)]  # one length per prompt
    pred, target = bench.loo_oracle(lengths)
    assert kendall_tau_b(pred, target) == pytest.approx(1.0)
    assert bench.prompt_ceiling(lengths) == pytest.approx((1.0, 1.0))


def test_the_ceiling_matches_the_exact_prompt_effect_on_a_gaussian_copula(bench):
    # answer = prompt effect + noise of the same variance: rho = 1/2, ceiling (2/pi) asin(sqrt(1/2)) = 0.5
    rng = np.random.default_rng(0)
    mu = rng.normal(size=3000)
    ls = np.exp(mu[:, None] + rng.normal(size=(3000, 4)))
    lengths = [[int(1000 * v) + 1 for v in row] for row in ls]
    rho, ceiling = bench.prompt_ceiling(lengths)
    assert rho == pytest.approx(0.5, abs=0.03) and ceiling == pytest.approx(0.5, abs=0.02)
    # what it models: the exact prompt effect against one answer
    exact = kendall_tau_b(np.repeat(mu, 4), np.asarray(lengths, float).ravel())
    assert ceiling == pytest.approx(exact, abs=0.02)
    # and the leave-one-out oracle's tau-b with 3 siblings, measured vs predicted
    pred, target = bench.loo_oracle(lengths)
    assert kendall_tau_b(pred, target) == pytest.approx(bench.model_loo_tau(rho, 3), abs=0.02)
    assert bench.model_loo_tau(0.0, 3) != bench.model_loo_tau(0.0, 3)  # nan: no prompt effect
    # against the mean of the 4 answers: the prompt effect keeps 4 rho / (1 + 3 rho) = 0.8 of its variance
    mean4 = kendall_tau_b(mu, np.asarray(lengths, float).mean(axis=1))
    assert bench.mean_ceiling(rho, 4) == pytest.approx(mean4, abs=0.03)
    assert bench.mean_ceiling(0.5, 4) == pytest.approx(2 / math.pi * math.asin(math.sqrt(0.8)))
    assert bench.mean_ceiling(0.5, 1) == pytest.approx(0.5)  # one answer: the single-answer ceiling


def test_answers_unrelated_to_their_prompt_have_no_ceiling(bench):
    rng = np.random.default_rng(1)
    lengths = rng.integers(1, 10_000, size=(2000, 4)).tolist()
    rho, ceiling = bench.prompt_ceiling(lengths)
    assert ceiling < 0.12 and rho < 0.03  # clipped at 0 when the sample agreement is negative


def test_load_clips_at_the_cap_keeps_the_split_and_refuses_bad_rows(bench, tmp_path):
    f = _write(tmp_path / "l.jsonl", [("test", [600, 3]), ("train", [5, 5]), ("test", [7, 512])], cap=512)
    assert bench.load_lengths(f, "test") == ([[512, 3], [7, 512]], 512)
    assert len(bench.load_lengths(f, "all")[0]) == 3
    assert bench.load_lengths(f, "test", cap=100) == ([[100, 3], [7, 100]], 100)
    with pytest.raises(SystemExit, match="--cap: expected 1..512"):
        bench.load_lengths(f, "test", cap=513)
    with pytest.raises(SystemExit, match="--split"):
        bench.load_lengths(f, "dev")
    with pytest.raises(SystemExit, match="--lengths: no such file"):
        bench.load_lengths(tmp_path / "none.jsonl")
    bad = _write(tmp_path / "b.jsonl", [("test", [3, 0])])
    with pytest.raises(SystemExit, match="line 2: field 'lengths'"):
        bench.load_lengths(bad)
    (tmp_path / "n.jsonl").write_text('{"prompt_id": "x", "lengths": [1]}\n')
    with pytest.raises(SystemExit, match="config line"):
        bench.load_lengths(tmp_path / "n.jsonl")


def test_script_prints_its_figures_and_writes_json_and_plot(tmp_path):
    rng = np.random.default_rng(2)
    rows = [("test", [int(v) for v in np.clip(np.exp(5 + m + rng.normal(0, 0.5, 4)), 1, 900)])
            for m in rng.normal(size=80)]
    f = _write(tmp_path / "l.jsonl", rows, cap=900)
    out = subprocess.run([sys.executable, str(BENCHMARKS / "probe_ceiling.py"), "--lengths", str(f),
                          "--records-json", str(tmp_path / "absent.json"), "--out", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=120, check=True).stdout  # fmt: skip
    figs = printed_figures(out)
    assert figs["ceiling_prompts"] == 80 and figs["prompt_oracle_refine64_answers"] > 100
    assert figs["prompt_ceiling_step0_tau"] > figs["prompt_oracle_step0_tau"] > 0.4  # a strong prompt effect
    res = json.loads((tmp_path / "out" / "probe_ceiling.json").read_text())
    assert res["figures"]["prompt_oracle_refine64_tau"] == pytest.approx(figs["prompt_oracle_refine64_tau"], abs=1e-3)
    assert res["measured"] == {} and (tmp_path / "out" / "probe_ceiling.png").stat().st_size > 1000
    assert not math.isnan(figs["prompt_ceiling_refine256_tau"])
