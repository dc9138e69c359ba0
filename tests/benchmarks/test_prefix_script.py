"""benchmarks/prefix.py end to end on the first 400 Mooncake requests (the full run is the
script itself): every router runs, and the figures it prints are the ones the JSON holds."""

from __future__ import annotations

import json
import subprocess
import sys

from builders import BENCHMARKS, printed_figures


def test_prefix_benchmark_prints_its_figures(tmp_path, data_dir):
    out = subprocess.run([sys.executable, str(BENCHMARKS / "prefix.py"), "--limit", "400",
                          "--seeds", "1", "--synthetic-requests", "300", "--out", str(tmp_path)],
                         capture_output=True, text=True, timeout=300, check=True).stdout  # fmt: skip
    figs = printed_figures(out)
    assert list(figs) == ["prefix_hit_rate_best", "rr_over_prefix_work_mean_e2e",
                          "prefix_work_over_prefix_only_mean_e2e",
                          "prefix_work_over_prefix_load_mean_e2e",
                          "prefix_work_over_prefix_load_mean_e2e_synthetic"]  # fmt: skip
    saved = json.loads((tmp_path / "prefix.json").read_text())
    assert {k: round(v, 3) for k, v in saved["figures"].items()} == figs
    rows = {r["case"]: r for r in saved["rows"]}
    assert rows["round-robin, no cache"]["hit_rate"] == 0
    assert 0 < figs["prefix_hit_rate_best"] < 1
    assert rows["prefix-sticky"]["requests_per_instance"][1:] == [0, 0, 0]  # all on one
    assert [r["case"] for r in saved["synthetic"]] == ["round-robin", "least-work", "prefix-only",
                                                       "prefix-load", "prefix-work"]  # fmt: skip
    assert (tmp_path / "prefix.png").stat().st_size > 0
