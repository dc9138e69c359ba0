"""benchmarks/steptime_vs_mlenergy.py --quick on an ML.ENERGY-format folder (real files plus one
model without a preset), and the leave-one-model-out fitter of benchmarks/steptime_lomo.py."""

from __future__ import annotations

import copy
import importlib.util
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from presched.sim.steptime import load_mlenergy

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
FILES = [
    "meta-llama__Llama-3.1-8B-Instruct__lm-arena-chat.json",
    "google__gemma-3-12b-it__lm-arena-chat.json",
    "meta-llama__Llama-4-Scout-17B-16E-Instruct__lm-arena-chat.json",
    "meta-llama__Llama-4-Maverick-17B-128E-Instruct-FP8__lm-arena-chat.json",
]


def _load(name: str):
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def folder(data_dir, tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("mlenergy")
    for f in FILES:
        shutil.copy(data_dir / "mlenergy-leaderboard-llm" / "models" / f, root / f)
    unknown = json.loads((root / FILES[0]).read_text())
    unknown["model_id"] = "org/unknown-model"
    unknown["configurations"] = copy.deepcopy(unknown["configurations"][:2])
    (root / "org__unknown-model__lm-arena-chat.json").write_text(json.dumps(unknown))
    return root


@pytest.fixture(scope="module")
def quick_run(folder, tmp_path_factory):
    import io
    from contextlib import redirect_stdout

    out = tmp_path_factory.mktemp("out")
    buf = io.StringIO()
    with redirect_stdout(buf):
        assert _load("steptime_vs_mlenergy").main(["--quick", "--data", str(folder),
                                                   "--out", str(out)]) == 0  # fmt: skip
    text = buf.getvalue()
    return text, json.loads((out / "steptime_vs_mlenergy_quick.json").read_text())


def test_figures_printed_last_and_fraction_counts_the_refused(quick_run, folder):
    text, payload = quick_run
    total = len(load_mlenergy(folder))
    figures = dict(line.removeprefix("figure: ").split(" = ")
                   for line in text.splitlines() if line.startswith("figure: "))  # fmt: skip
    assert float(figures["steptime_expressible_fraction"]) == pytest.approx((total - 2) / total,
                                                                             abs=1e-3)
    for name in ("dense", "moe", "b200"):
        assert float(figures[f"steptime_median_itl_err_pct_{name}"]) >= 0
    assert "itl_mape_8b_h100" in figures  # the existing figures stay
    assert text.strip().splitlines()[-1].startswith("figure: ")
    assert "model_id: no preset for 'org/unknown-model'" in text
    assert len(payload["expressible"]["refused"]) == 2


def test_out_of_sample_folds_never_train_on_the_held_out_model(quick_run):
    _, payload = quick_run
    folds = [f for f in payload["lomo_folds"] if f["knobs"] is not None]
    assert {f["family"] for f in folds} == {"dense-h100", "dense-b200", "moe-h100"}
    for f in folds:
        assert f["held_out"] not in f["trained_on"] and f["trained_on"]
    lomo = [r for r in payload["rows"] if r["variant"] == "lomo"]
    fold_knobs = {(f["family"], f["held_out"]): f["knobs"] for f in folds}
    for r in lomo:
        assert r["fold_knobs"] == fold_knobs[(r["family"], r["architecture"])]
    # every expressible configuration of a family with >= 2 models is scored out of sample
    default = [r for r in payload["rows"] if r["variant"] == "default"]
    assert len(lomo) == len(default)


def test_family_knobs_are_fitted_on_every_architecture_of_the_family(quick_run):
    _, payload = quick_run
    lomo = _load("steptime_lomo")
    default = [r for r in payload["rows"] if r["variant"] == "default"]
    fams = payload["family_knobs"]
    assert set(fams) == {r["family"] for r in default}
    for fam, fit in fams.items():
        rows = [r for r in default if r["family"] == fam]
        assert fit["architectures"] == sorted({r["architecture"] for r in rows})
        assert fit["configurations"] == len(rows)
        for k, (unit, lo, hi) in lomo.KNOB_RANGES.items():
            assert lo - 1e-9 <= fit["knobs"][k] / unit <= hi + 1e-9, (fam, k)


def test_context_per_request_is_length_biased():
    lomo = _load("steptime_lomo")

    class C:  # a histogram: half the outputs 0-10 tokens, half 90-100
        output_length_bins = (0.0, 10.0, 90.0, 100.0)
        output_length_counts = (1, 0, 1)

    # E[L] = 50, E[L^2] = (100/3 + 27100/3) / 2 = 4533.3 -> 45.3 generated on average
    assert lomo.context_per_request(C, 100.0) == pytest.approx(100 + 4533.333 / 100, rel=1e-4)


def test_fit_recovers_knobs_that_generated_the_measurements(data_dir):
    lomo = _load("steptime_lomo")
    configs = [c for c in load_mlenergy(data_dir / "mlenergy-leaderboard-llm",
                                        model="Llama-3.1-70B-Instruct")]  # fmt: skip
    truth = {"step_overhead": 1.5e-3, "overhead_per_decode": 30e-6, "memory_efficiency": 0.6,
             "collective_latency": 20e-6}  # fmt: skip
    by_key, rows = {}, []
    for i, c in enumerate(configs):
        by_key[i] = c
        rows.append({"key": i,
                     "simulated": {"median_itl_ms": 1e3 * lomo.decode_surrogate(
                         c, lomo.default_knobs(), 250.0)},
                     "measured": {"median_itl_ms": 1e3 * lomo.decode_surrogate(c, truth, 250.0)}})
    got = lomo.fit_knobs(rows, by_key, 250.0)
    pred = np.array([lomo.decode_surrogate(c, got, 250.0) for c in configs])
    want = np.array([lomo.decode_surrogate(c, truth, 250.0) for c in configs])
    assert np.max(np.abs(pred / want - 1)) < 1e-3  # the fitted knobs reproduce the data
    assert got["memory_efficiency"] == pytest.approx(0.6, rel=0.05)


def test_one_se_rule_keeps_the_fewest_knobs_within_one_standard_error_of_the_best():
    lomo = _load("steptime_lomo")
    # best: +compute, mean 11, se = 2 / sqrt(3) = 1.155 -> bound 12.155; base (mean 12) is inside
    assert lomo.one_se_choice({"base": [10.0, 12.0, 14.0], "+compute": [9.0, 11.0, 13.0],
                               "+compute+layer": [11.0, 12.0, 13.0]}) == "base"  # fmt: skip
    # best: +compute+layer, mean 6, se 0.577 -> bound 6.577; neither simpler set is inside
    assert lomo.one_se_choice({"base": [10.0, 12.0, 14.0], "+compute": [9.0, 11.0, 13.0],
                               "+compute+layer": [5.0, 6.0, 7.0]}) == "+compute+layer"  # fmt: skip
    # the bound is the best set's own standard error, not a wider one's
    assert lomo.one_se_choice({"base": [7.0, 7.0, 7.0], "+compute": [1.0, 11.0, 12.0],
                               "+compute+layer": [6.0, 6.5, 7.0]}) == "+compute+layer"  # fmt: skip
