"""benchmarks/engine_probe_e2e.py's parts without an engine: the three plugin configs (validated by
the plugin's own parser), the workload, the paired figures, the records' taus, and `--report` on
a stored run. The run itself needs SmolLM2 on the engine for ~an hour and is not a test; its
smoke size (`--train 12 --test 6 --repeats 1 --max-tokens 24`, ~4 min) was run by hand."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import numpy as np
import pytest
from builders import BENCHMARKS, load_benchmark, planted_engine_records, printed_figures
from scipy.stats import kendalltau

from presched.engine.plugin.config import parse_plugin_config


@pytest.fixture(scope="module")
def parts():
    return load_benchmark("engine_probe_e2e_parts.py")


def _run(config, repeat, mean_ms, lengths):
    return {"config": config, "repeat": repeat, "summary": {"mean_e2el_ms": mean_ms},
            "lengths": lengths, "e2e_s": {}}  # fmt: skip


def test_plugin_configs_differ_only_in_policy_and_predictors_and_parse(parts, tmp_path):
    preds = {n: tmp_path / f"{n}.npz" for n in ("text-gbm", "probe", "probe-refine")}
    for p in preds.values():
        p.write_bytes(b"")  # the parser checks that the files exist; the engine loads them
    cfgs = {n: parts.plugin_config(n, tmp_path, preds) for n in parts.CONFIGS + ["train"]}
    for name, cfg in cfgs.items():
        parsed = parse_plugin_config(cfg)  # a misspelt field is refused here, not in the engine
        assert parsed.records == tmp_path / f"{name}.sqlite"  # each engine its own records
        assert list(parsed.features.record_steps) == parts.REFINE_AT and parsed.features.steps
    assert cfgs["fcfs"]["policy"] == "fcfs" and "predictor" not in cfgs["fcfs"]
    assert cfgs["train"] | {"records": None, "stats": None} == cfgs["fcfs"] | {"records": None, "stats": None}
    same = {k: v for k, v in cfgs["probe"].items() if k not in ("probe", "refine", "refine_at")}
    assert same | {"records": None, "stats": None} == cfgs["textgbm"] | {"records": None, "stats": None}
    assert cfgs["textgbm"]["policy"] != "fcfs" and cfgs["probe"]["refine"] == str(preds["probe-refine"])
    assert list(parse_plugin_config(cfgs["probe"]).refine_at) == parts.REFINE_AT


def test_prompts_of_one_split_once_in_hash_order_without_very_long_ones(parts, tmp_path):
    rows = [{"prompt_id": f"p{i}", "split": "test" if i % 2 else "train", "prompt_text": f"q{i}"}
            for i in range(20)]  # fmt: skip
    rows += [dict(rows[1]), {"prompt_id": "long", "split": "test", "prompt_text": "x" * (parts.MAX_PROMPT_CHARS + 1)}]
    path = tmp_path / "prompts.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in rows)
    got = [p["prompt_id"] for p in parts.load_prompts(path, "test")]
    assert sorted(got) == sorted(f"p{i}" for i in range(1, 20, 2))  # once each, no long one
    assert got != sorted(got)  # hash order, not file or id order
    assert got == [p["prompt_id"] for p in parts.load_prompts(path, "test")]


def test_poisson_arrivals_are_seeded_and_at_the_rate(parts):
    reqs = parts.requests_of([{"prompt_id": str(i), "prompt_text": "hi"} for i in range(4000)], 64)
    a = [r.arrival for r in parts.poisson(reqs, 2.0, seed=3)]
    assert a[0] == 0.0 and all(x <= y for x, y in zip(a, a[1:]))
    assert a == [r.arrival for r in parts.poisson(reqs, 2.0, seed=3)]
    assert abs(a[-1] / (len(a) - 1) - 0.5) < 0.05  # mean gap 1 / rate
    assert all(r.max_tokens == 64 for r in reqs)


def test_figures_are_medians_of_paired_ratios(parts):
    runs = [_run("fcfs", 0, 100, {"a": 5}), _run("textgbm", 0, 50, {"a": 5}), _run("probe", 0, 40, {"a": 5}),
            _run("fcfs", 1, 90, {"a": 5}), _run("textgbm", 1, 60, {"a": 5}), _run("probe", 1, 60, {"a": 5}),
            _run("fcfs", 2, 80, {"a": 5}), _run("textgbm", 2, 40, {"a": 5})]  # repeat 2: no probe run
    f = parts.figures_of(runs, {"textgbm": {"tau_b": 0.3}, "probe": {"tau_b": float("nan")}})
    assert f["engine_probe_over_textgbm_mean_e2e"] == pytest.approx(np.median([0.8, 1.0]))
    assert (f["engine_probe_over_textgbm_mean_e2e_min"], f["engine_probe_over_textgbm_mean_e2e_max"]) == (0.8, 1.0)
    assert f["engine_fcfs_over_textgbm_mean_e2e"] == pytest.approx(np.median([2.0, 1.5, 2.0]))
    assert f["engine_fcfs_over_probe_mean_e2e"] == pytest.approx(np.median([2.5, 1.5]))
    assert f["engine_final_estimate_tau_textgbm"] == 0.3 and "engine_final_estimate_tau_probe" not in f  # NaN: no figure
    assert f["answers_same_length_fraction"] == 1.0 and "engine_fcfs_over_probe_mean_e2e_same_answers" not in f
    assert f["repeats_complete"] == 3


def test_a_repeat_with_a_failed_request_is_left_out_and_other_answers_are_compared_apart(parts):
    runs = [_run("fcfs", 0, 100, {"a": 5, "b": 9}), _run("probe", 0, 50, {"a": 5, "b": 8}),
            _run("fcfs", 1, 90, {"a": 5, "b": 9}), _run("probe", 1, 10, {"a": 5})]
    runs[3]["summary"]["failed"] = 1  # repeat 1's probe run lost request b: its mean is not comparable
    for r, (ea, eb) in zip(runs, ((2.0, 8.0), (1.0, 4.0), (2.0, 7.0), (1.0, 0.0))):
        r["e2e_s"] = {"a": ea, "b": eb} if "b" in r["lengths"] else {"a": ea}
    f = parts.figures_of(runs, {})
    assert f["repeats_complete"] == 1 and f["engine_fcfs_over_probe_mean_e2e"] == 2.0  # repeat 0 only
    assert f["answers_same_length_fraction"] == 0.5  # b came back 9 and 8 tokens long
    assert f["engine_fcfs_over_probe_mean_e2e_same_answers"] == 2.0  # a alone: 2.0 s / 1.0 s


def test_record_taus_read_the_final_estimates_of_each_engine(parts, tmp_path):
    from presched.engine.plugin.records import RecordWriter

    rng = np.random.default_rng(0)
    pred, lens = rng.uniform(1, 100, 30), rng.integers(1, 200, 30)
    w = RecordWriter(tmp_path / "probe.sqlite")
    for i, (p, n) in enumerate(zip(pred, lens)):
        w.write({"id": f"r{i}", "status": 200, "pred_mean": float(p), "output_tokens": int(n),
                 "pred_source": "refine" if i % 3 else "probe"})  # fmt: skip
    w.write({"id": "gone", "status": 499, "pred_mean": 1.0, "output_tokens": 3, "pred_source": "probe"})
    w.close()
    got = parts.record_taus(tmp_path)
    assert set(got) == {"probe"}  # configurations without a records file are left out
    assert got["probe"]["tau_b"] == pytest.approx(kendalltau(pred, lens).statistic)
    assert got["probe"]["sources"] == {"refine": 20, "probe": 10} and got["probe"]["requests"] == 30


def test_report_recomputes_figures_table_and_plot_from_a_stored_run(tmp_path):
    runs = [_run(c, k, m, {"a": 5}) for k in range(2) for c, m in (("fcfs", 90), ("textgbm", 60), ("probe", 45))]
    for r in runs:
        r["summary"] |= {"median_e2el_ms": 1.0, "p99_e2el_ms": 2.0, "mean_ttft_ms": 0.5, "output_throughput": 9.0}
    stored = {"runs": runs, "taus": {}, "phase1": {"requests": 3}, "rate_per_s": 0.5}
    (tmp_path / "run.json").write_text(json.dumps(stored))
    proc = subprocess.run([sys.executable, str(BENCHMARKS / "engine_probe_e2e.py"), "--report",
                           str(tmp_path / "run.json"), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    figs = printed_figures(proc.stdout)
    assert figs["engine_probe_over_textgbm_mean_e2e"] == pytest.approx(0.75, abs=1e-3)
    assert figs["engine_fcfs_over_probe_mean_e2e"] == pytest.approx(2.0, abs=1e-3)
    assert (tmp_path / "out" / "engine_probe_e2e.png").stat().st_size > 0
    assert json.loads((tmp_path / "out" / "engine_probe_e2e.json").read_text())["figures"] == {
        k: pytest.approx(v, abs=1e-3) for k, v in figs.items()}


def test_ranking_scores_each_predictor_on_the_measured_records_once_per_prompt(parts, tmp_path):
    from presched.serve.train_log import train_from_log

    planted_engine_records(tmp_path / "train.sqlite", 240, 0)
    preds = {n: train_from_log(tmp_path / "train.sqlite", n, tmp_path / f"{n}.npz")[0]
             for n in ("text-gbm", "probe", "probe-refine")}  # fmt: skip
    planted_engine_records(tmp_path / "probe.sqlite", 60, 1, dup=5)
    got = parts.ranking(tmp_path / "probe.sqlite", preds, at=[16, 64, 256])
    assert got["prompts"] == 60  # the 5 repeats of one prompt count once
    assert got["all"]["probe"] > 0.8 and got["all"]["text-gbm"] > 0.5  # the planted laws are found
    from presched.serve.log_read import load_log_requests

    L = np.array([r.output_tokens for r in load_log_requests(tmp_path / "probe.sqlite").requests if r.id[0] == "q"])
    assert got["g16"]["running"] == (L > 16).sum() and got["g64"]["running"] == (L > 64).sum()
    assert got["g16"]["probe-refine"] > 0.8 and got["g64"]["probe-refine"] > 0.8
    assert got["g256"] == {"running": 0}  # no state was recorded there
    figs = parts.figures_of([], {}, got)
    assert figs["records_tau_probe_refine_g64"] == got["g64"]["probe-refine"]
    assert figs["records_tau_text_gbm_all"] == got["all"]["text-gbm"]


def test_training_records_keep_train_and_validate_answers_with_their_features(parts, tmp_path):
    """--train-records: a records file of answers to prompts of every split is cut down to the
    train and validate prompts' answers, each feature table with them, so nothing is learned
    from a measured (test) prompt; the copy trains as a records file does."""
    import sqlite3

    from presched.serve.train_log import train_from_log

    splits = ["train", "validate", "test", "other"]
    prompts = [{"prompt_id": f"c{i}", "split": splits[i % 4], "prompt_text": f"question {i} " + "x" * (i % 7)}
               for i in range(80)]  # fmt: skip
    path = tmp_path / "prompts.jsonl.gz"
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in prompts)
    # the engine's records hold the chat-templated prompt; the user message is the CASTILLO text
    text = lambda i, k: f"system\nYou are a helpful AI assistant\nuser\n{prompts[i]['prompt_text']}\nassistant\n"  # noqa: E731
    rows = planted_engine_records(tmp_path / "all.sqlite", 80, seed=3, text=text)
    got = parts.training_records(tmp_path / "all.sqlite", tmp_path / "train.sqlite", path)
    want = {f"q{i}" for i in range(80) if splits[i % 4] in ("train", "validate")}
    assert got == {"kept": len(want), "dropped": 80 - len(want)}
    with sqlite3.connect(tmp_path / "train.sqlite") as c:
        assert {r for (r,) in c.execute("SELECT id FROM requests")} == want
        assert {r for (r,) in c.execute("SELECT id FROM prompt_features")} == want
        steps = {r for (r,) in c.execute("SELECT id FROM step_features")}
    assert steps == {rid for rid, _, L, _ in rows if rid in want and L > 16}  # step rows kept with them
    with sqlite3.connect(tmp_path / "all.sqlite") as c:  # the source is left as it was
        assert c.execute("SELECT COUNT(*) FROM requests").fetchone()[0] == 80
    _, rep = train_from_log(tmp_path / "train.sqlite", "probe-refine", tmp_path / "refine.npz", keep_censored=True)
    assert rep["fit_requests"] + rep["validation_requests"] == len(want)


def test_train_records_that_is_not_a_file_is_refused_naming_the_option(tmp_path):
    r = subprocess.run([sys.executable, str(BENCHMARKS / "engine_probe_e2e.py"), "--train-records",
                        str(tmp_path / "missing.sqlite")], capture_output=True, text=True)  # fmt: skip
    assert r.returncode == 2 and "--train-records" in r.stderr and "not a file" in r.stderr
    assert "Traceback" not in r.stderr
