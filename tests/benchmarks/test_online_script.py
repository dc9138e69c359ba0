"""benchmarks/online.py --quick --gateway end to end on a small slice of CASTILLO: the JSON,
the plot and every figure line the issue names (the figures themselves need the full streams)."""

from __future__ import annotations

import json

from builders import load_benchmark

FIGURES = ("online_tau_gap_after_1000", "online_coverage_err_after_500", "drift_alarm_delay_requests",
           "online_update_us")  # fmt: skip


def test_quick_run_writes_results_and_figure_lines(data_dir, tmp_path, capsys):
    bench = load_benchmark("online.py")
    doc = bench.main(["--quick", "--gateway", "--out", str(tmp_path)])
    out = capsys.readouterr().out
    for name in FIGURES:
        assert f"figure: {name} = " in out
    saved = json.loads((tmp_path / "online.json").read_text())
    assert set(FIGURES) <= set(saved["figures"]) and (tmp_path / "online.png").exists()
    assert [s["shift"] for s in saved["shifts"]][0] == "sources" and len(saved["shifts"]) == 3
    for shift in saved["shifts"]:
        assert set(shift["windows"]) == {"frozen", "online", "retrained"}
        assert shift["status"]["learned"] == shift["n"]
    assert doc["figures"]["online_update_us"] > 0
    g = saved["gateway"]
    assert g["status_200"] == g["requests"] and g["state_saved"]
    assert g["censored_logged"] > 0 and g["counts"]["censored"] == g["censored_logged"]
    assert len(g["versions_logged"]) >= 2  # a refit happened and later rows name the new version
