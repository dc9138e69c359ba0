"""benchmarks/predictors.py end to end on a quick slice: its figure lines, the LOSO ones beside
the others, and its JSON (the full run is the script itself)."""

from __future__ import annotations

import json
import math

from builders import load_benchmark, printed_figures

from presched.predict.loso import PREFIX, SOURCES


def test_quick_run_prints_loso_figures(tmp_path, capsys, data_dir):
    bench = load_benchmark("predictors.py")
    rc = bench.main(["--quick", "150", "--views", "in-dist,loso", "--predictors", "text-gbm,model-median",
                     "--loso-predictors", "text-gbm", "--out", str(tmp_path)])  # fmt: skip
    assert rc == 0
    fig = printed_figures(capsys.readouterr().out)
    assert list(fig)[-2:] == ["loso_mean_tau", "loso_max_coverage_error_pts"]
    assert list(fig)[0] == "default_kendall_tau" and math.isfinite(fig["default_kendall_tau"])
    doc = json.loads((tmp_path / "predictors.json").read_text())
    loso = doc["loso"]["text-gbm"]
    assert set(loso["per_source"]) == set(SOURCES) and set(doc["loso"]) == {"text-gbm"}  # model-median: in-dist only
    assert abs(fig["loso_mean_tau"] - loso["mean_kendall_tau_b"]) < 1e-3
    assert abs(fig["loso_max_coverage_error_pts"] - loso["max_coverage_error_pts"]) < 0.05
    assert {r["view"] for r in doc["rows"]} == {"in-dist", *(PREFIX + s for s in SOURCES)}
