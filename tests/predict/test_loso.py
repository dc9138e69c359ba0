"""The leave-one-source-out view: each fold keeps its source out of training and calibration and
tests on exactly that source's CASTILLO test rows; the summary averages per source, the
coverage figure takes the worst fold; `presched eval --view loso --quick` runs in seconds."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from builders import prompt_keys

from presched.predict.evaluate import Evaluation, castillo_view
from presched.predict.loso import (
    PREFIX,
    SOURCES,
    evaluate_loso,
    loso_cells,
    loso_figures,
    loso_markdown,
    loso_splits,
    loso_summary,
    merge,
)


@pytest.fixture(scope="module")
def folds(data_dir):
    return loso_splits()


def test_each_source_is_held_out_once_and_only_tested(folds):
    assert [f.view for f in folds] == [PREFIX + s for s in SOURCES]
    ind = castillo_view("in-dist")
    for f, src in zip(folds, SOURCES):
        assert {r.metadata["dataset"] for r in f.test} == {src}
        seen = {r.metadata["dataset"] for r in f.train + f.calibration}
        assert src not in seen and len(seen) == 6, f.view
        # test = that source's rows of the in-dist test split; training = in-dist minus the source
        assert sorted(r.id for r in f.test) == sorted(r.id for r in ind.test if r.metadata["dataset"] == src)
        assert len(f.train) == sum(r.metadata["dataset"] != src for r in ind.train)
        assert not prompt_keys(f.train) & prompt_keys(f.test) and not prompt_keys(f.calibration) & prompt_keys(f.test)
    # every in-dist test row is scored by exactly one fold
    assert sum(len(f.test) for f in folds) == len(ind.test)


def test_unknown_source_is_refused(data_dir):
    with pytest.raises(ValueError, match="sources: 'Reddit'"):
        loso_splits(sources=["Reddit"])


def _row(view, name, tau, mae, cov, status="ok"):
    return {"view": view, "predictor": name, "status": status, "n": 10,
            "kendall_tau_b": tau, "mae": mae, "max_coverage_error_pts": cov}  # fmt: skip


def test_summary_is_unweighted_mean_and_worst_coverage():
    res = Evaluation()
    res.splits = {"in-dist": {}, "loso-A": {}, "loso-B": {}}
    res.rows = [_row("in-dist", "text-gbm", 0.9, 1.0, 0.0),  # not a fold: left out
                _row("loso-A", "text-gbm", 0.2, 100.0, 3.0),
                _row("loso-B", "text-gbm", 0.4, 200.0, 7.0),
                _row("loso-A", "other", -1.0, 0.0, 99.0)]  # fmt: skip
    s = loso_summary(res, "text-gbm")
    assert s["folds"] == s["of"] == 2 and set(s["per_source"]) == {"A", "B"} and s["failed"] == {}
    assert s["mean_kendall_tau_b"] == pytest.approx(0.3) and s["mean_mae"] == pytest.approx(150.0)
    assert s["max_coverage_error_pts"] == 7.0 and s["mean_coverage_error_pts"] == 5.0
    assert loso_figures(res) == {"loso_mean_tau": pytest.approx(0.3), "loso_max_coverage_error_pts": 7.0}
    assert all(math.isnan(v) for v in loso_figures(res, "absent").values())
    assert loso_summary(res, "absent")["of"] == 0


def test_a_failed_fold_is_reported_and_leaves_no_mean_over_the_others():
    """The mean over the folds that succeeded (0.3) read better than any mean over all three:
    the failed fold, often the hardest source, was dropped silently."""
    res = Evaluation()
    res.splits = {"loso-A": {}, "loso-B": {}, "loso-C": {}}
    res.rows = [_row("loso-A", "text-gbm", 0.2, 100.0, 3.0),
                _row("loso-B", "text-gbm", 0.4, 200.0, 7.0),
                {**_row("loso-C", "text-gbm", None, None, None, status="error"), "error": "ValueError: boom"}]  # fmt: skip
    s = loso_summary(res, "text-gbm")
    assert s["folds"] == 2 and s["of"] == 3 and s["failed"] == {"C": "ValueError: boom"}
    assert set(s["per_source"]) == {"A", "B"}  # the folds that succeeded are kept, per source
    for k in ("mean_kendall_tau_b", "mean_mae", "mean_coverage_error_pts", "max_coverage_error_pts"):
        assert math.isnan(s[k]), k
    assert all(math.isnan(v) for v in loso_figures(res).values())
    heads, rows = loso_cells(res)
    cells = dict(zip(heads, rows[0]))
    assert cells["A"] == "0.200" and cells["C"] == "failed"
    assert cells["mean τ-b"] == cells["mean MAE"] == cells["max cov-err pts"] == "— (2/3 folds)"
    assert "| failed |" in loso_markdown(res) and "— (2/3 folds)" in loso_markdown(res)


def test_quick_folds_fit_and_score(data_dir):
    folds = loso_splits(quick=150, sources=["Apps", "ShareGPT"])
    res = merge(Evaluation(), evaluate_loso(["linear-prompt"], folds))
    rows = {r["view"]: r for r in res.rows}
    assert set(rows) == {"loso-Apps", "loso-ShareGPT"} and all(r["status"] == "ok" for r in rows.values())
    assert all(r["single_calls"] == 0 for r in rows.values())  # not timed
    s = loso_summary(res, "linear-prompt")
    assert s["folds"] == 2 and math.isfinite(s["mean_kendall_tau_b"])


def test_eval_cli_view_loso_quick(tmp_path, data_dir):
    r = subprocess.run([sys.executable, "-m", "presched.cli", "eval", "-p", "model-median,linear-prompt", "--view",
                        "loso", "--quick", "150", "-o", str(tmp_path)], capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "leave-one-source-out" in r.stdout
    doc = json.loads((tmp_path / "predictors.json").read_text())
    assert {row["view"] for row in doc["rows"]} == {PREFIX + s for s in SOURCES}
    assert set(doc["loso"]) == {"model-median", "linear-prompt"}
    assert set(doc["loso"]["linear-prompt"]["per_source"]) == set(SOURCES)
    assert (tmp_path / "predictors-loso.png").exists()
    assert not list(tmp_path.glob("predictors-calibration-loso-*.png"))  # one chart, not 7 pairs


def test_the_loso_table_keeps_every_number_whole_at_80_columns_and_piped():
    """It was printed at the console's width (80 when piped) without folding: '0.…' for 0.291."""
    import io
    import re

    from rich.console import Console

    from presched.predict.report import full_width, render_table

    res = Evaluation()
    res.splits = {f"loso-{s}": {} for s in SOURCES}
    res.rows = [_row(f"loso-{s}", name, 0.1 + 0.0123 * i + k / 10, 111.1 * (i + 1), 2.5 + i)
                for k, name in enumerate(("text-gbm", "stack-of-two")) for i, s in enumerate(SOURCES)]  # fmt: skip
    for width in (80, full_width(res)):
        buf = io.StringIO()
        render_table(res, Console(width=width, file=buf, force_terminal=True, color_system=None))
        lines = buf.getvalue().splitlines()
        assert max(len(line) for line in lines) <= width
        table = "\n".join(line for line in lines if line[:1] in "┏┃┡│└")
        assert "…" not in table
        tokens = set(re.split(r"[\s│┃]+", table))
        for row in res.rows:
            assert f"{row['kendall_tau_b']:.3f}" in tokens, (width, row)
    assert full_width(res) > 80
