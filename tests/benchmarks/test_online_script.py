"""benchmarks/online.py --quick --gateway end to end on a small slice of CASTILLO: the JSON,
the plot and every figure line the issue names (the figures themselves need the full streams)."""

from __future__ import annotations

import json

import numpy as np
from builders import load_benchmark

from presched.predict.metrics import coverage
from presched.workload.request import Request

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
    assert "figure: calibrated_coverage_err_after_500 = " in out
    assert [s["shift"] for s in saved["shifts"]][0] == "sources" and len(saved["shifts"]) == 3
    for shift in saved["shifts"]:
        assert set(shift["windows"]) == {"frozen", "online", "retrained"}
        assert shift["status"]["learned"] == shift["n"]
    assert doc["figures"]["online_update_us"] > 0
    g = saved["gateway"]
    assert g["status_200"] == g["requests"] and g["state_saved"]
    assert g["censored_logged"] > 0 and g["counts"]["censored"] == g["censored_logged"]
    assert len(g["versions_logged"]) >= 2  # a refit happened and later rows name the new version


def test_the_calibrated_reference_covers_each_level_exactly():
    # answers with 10 exchangeable samples, integer lengths with many ties (a third of the
    # prompts answer the same length every time): the reference's q_k covers k/10 of the answers
    streams = load_benchmark("online_streams.py")
    rng = np.random.default_rng(0)
    n = 20_000
    med = rng.lognormal(5, 1, n)
    samples = np.maximum(1, np.round(med[:, None] * rng.lognormal(0, 0.5, (n, 10)))).astype(int)
    samples[: n // 3] = samples[: n // 3, :1]  # all ten equal
    stream = [Request(id=str(i), prompt_tokens=5, output_tokens=int(s[0])) for i, s in enumerate(samples)]
    shift = streams.Shift("synthetic", [], [], stream, others=[tuple(int(v) for v in s[1:]) for s in samples])
    est, y = streams.calibrated_reference(shift)
    cov = coverage(est.quantiles, y)[:9]
    assert np.abs(cov - np.arange(1, 10) / 10).max() < 0.012  # 3.4 standard errors at q50
