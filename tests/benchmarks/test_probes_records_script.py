"""benchmarks/probes_records.py on planted records (the plugin's own RecordWriter, no engine): records
matched back to their CASTILLO prompt and split by the user message, each prompt once; the three
predictors fitted on train and scored on test; probe-refine scored on the answers still running.
The real records come from scripts/smollm2_records.py (SmolLM2 on the engine, ~1 h; run by hand)."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import numpy as np
import pytest
from builders import BENCHMARKS, load_benchmark, planted_engine_records, printed_figures

SYSTEM = "system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face\nuser\n"


def _templated(i: int, k: int) -> str:
    return SYSTEM + _message(i, k) + "\nassistant\n"


def _message(i: int, k: int) -> str:
    return f"topic {i}: please answer " + "more " * k


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("probes_records.py")


def test_user_text_is_the_message_inside_the_decoded_template(bench):
    assert bench.user_text(SYSTEM + "Say hi.\nassistant\n") == "Say hi."
    assert bench.user_text(SYSTEM + "a\nuser\nb\nassistant\n") == "a\nuser\nb"  # the first user turn opens it
    assert bench.user_text(SYSTEM + "  cut off") == "cut off"  # no assistant turn (truncated)
    assert bench.user_text("system\nno user turn") is None and bench.user_text(None) is None


def _prompts(rows, split_of) -> list[dict]:
    return [{"prompt_id": f"p{rid}", "split": split_of(int(rid[1:])), "prompt_text": _message(int(rid[1:]), k) + "  "}
            for rid, k, _, _ in rows if rid[0] == "q"]  # fmt: skip


def _split(i: int) -> str:
    return ("train", "train", "train", "validate", "test")[i % 5]


def test_records_go_to_their_prompts_split_once_each_and_strangers_are_left_out(bench, tmp_path):
    rows = planted_engine_records(tmp_path / "r.sqlite", 50, 0, dup=3, text=_templated)
    prompts = _prompts(rows, _split)[1:]  # q0 (and its 3 repeats) is not a CASTILLO prompt here
    got = bench.split_records(tmp_path / "r.sqlite", prompts)
    assert {k: len(v) for k, v in got.items()} == {"train": 29, "validate": 10, "test": 10}
    lengths = {r[0]: r[2] for r in rows}
    for split, reqs in got.items():
        assert all(_split(int(r.id[1:])) == split and r.output_tokens == lengths[r.id] for r in reqs)
    prompts = _prompts(rows, _split)  # now q0 is one: its first record only, not d0..d2
    got = bench.split_records(tmp_path / "r.sqlite", prompts)
    assert [r.id for r in got["train"]].count("q0") == 1 and not any(r.id[0] == "d" for v in got.values() for r in v)


def test_evaluate_finds_the_planted_laws_at_step_0_and_while_running(bench, tmp_path):
    rows = planted_engine_records(tmp_path / "r.sqlite", 400, 1, steps=(16, 64, 256), text=_templated)
    res = bench.evaluate(bench.split_records(tmp_path / "r.sqlite", _prompts(rows, _split)))
    assert res["answers"] == {"train": 240, "validate": 80, "test": 80}
    assert res["step0"]["probe"]["tau"] > 0.8 and res["step0"]["text-gbm"]["tau"] > 0.5
    L = {r[0]: r[2] for r in rows if _split(int(r[0][1:])) == "test"}
    for g in (16, 64):
        row = res["steps"][g]
        assert row["test_answers"] == sum(n > g for n in L.values())  # only answers still running
        assert row["refine_tau"] > 0.8  # its state at g carries log(L - g)
        assert row["refine_coverage_err_pts"] < 25
    assert 256 not in res["steps"]  # L <= 12 * 19 + 5 < 256: no answer runs that long
    figs = bench.figures_of(res)
    assert "probe_refine_answer64_tau" not in figs  # records without answer pools
    assert figs["probe_refine64_tau"] == res["steps"][64]["refine_tau"]
    assert figs["probe_refine16_prior_tau"] == res["steps"][16]["probe_prior_tau"]
    assert figs["records_test_answers"] == 80


def test_records_with_answer_pools_score_probe_refine_with_answer_on(bench, tmp_path):
    rows = planted_engine_records(tmp_path / "r.sqlite", 400, 2, steps=(16, 64), text=_templated, answer=True)
    res = bench.evaluate(bench.split_records(tmp_path / "r.sqlite", _prompts(rows, _split)))
    for g in (16, 64):
        row = res["steps"][g]  # only the pool at g carries log(L - g): the plain refine reads its prompt prior
        assert row["refine_answer_tau"] > 0.8 and row["refine_answer_tau"] > row["refine_tau"] + 0.2, row
    figs = bench.figures_of(res)
    assert figs["probe_refine_answer64_tau"] == res["steps"][64]["refine_answer_tau"]
    assert figs["probe_refine_answer64_gain_lo90"] > 0.2  # paired: the pools rank, the plain one cannot


def test_evaluate_refuses_a_split_without_records(bench, tmp_path):
    rows = planted_engine_records(tmp_path / "r.sqlite", 40, 2, text=_templated)
    with pytest.raises(SystemExit, match="validate 0"):
        bench.evaluate(bench.split_records(tmp_path / "r.sqlite", _prompts(rows, lambda i: "test" if i % 2 else "train")))


def test_script_writes_json_plot_and_figures(tmp_path):
    rows = planted_engine_records(tmp_path / "r.sqlite", 200, 3, text=_templated)
    (tmp_path / "castillo").mkdir()
    with gzip.open(tmp_path / "castillo" / "prompts.jsonl.gz", "wt") as f:
        f.writelines(json.dumps(p) + "\n" for p in _prompts(rows, _split))
    out = subprocess.run([sys.executable, str(BENCHMARKS / "probes_records.py"), "--records", str(tmp_path / "r.sqlite"),
                          "--castillo", str(tmp_path / "castillo"), "--out", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=300, check=True).stdout  # fmt: skip
    figs = printed_figures(out)
    assert figs["records_test_answers"] == 40 and figs["probe_refine16_tau"] > 0.7
    res = json.loads((tmp_path / "out" / "probes_records.json").read_text())
    assert res["figures"]["probe_refine64_tau"] == pytest.approx(figs["probe_refine64_tau"], abs=1e-3)
    assert (tmp_path / "out" / "probes_records.png").stat().st_size > 0
    assert np.isfinite(res["coverage_noise_floor_pts"])


def test_paired_gain_brackets_a_real_difference_and_zero_for_twins(bench):
    rng = np.random.default_rng(0)
    y = rng.normal(size=300)
    good, bad = y + 0.3 * rng.normal(size=300), y + 3 * rng.normal(size=300)
    lo, hi = bench.paired_gain(good, bad, y, n=300)
    assert 0 < lo < hi  # good ranks y better on every resample's bulk
    lo, hi = bench.paired_gain(good, good, y, n=50)
    assert lo == hi == 0
