"""presched.engine.calibrate: step times measured on the real vLLM CPU engine (tiny random Llama)
and the simulator's fitted step-time model on them; the histogram reader on real Prometheus
text; a clear error from a server that is not vLLM (the stub upstream, a test double)."""

from __future__ import annotations

from collections import Counter

import pytest

from presched.engine.calibrate import (
    DECODE,
    PREFILL,
    CalibrationError,
    calibrate,
    default_batches,
    parse_histograms,
)


def test_histograms_are_summed_over_label_sets_from_real_exposition_text():
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    reg = CollectorRegistry()
    h = Histogram(DECODE, "decode time", ["engine", "model_name"], registry=reg)
    h.labels("0", "a").observe(0.25)
    h.labels("0", "a").observe(0.5)
    h.labels("1", "b").observe(1.0)
    got = parse_histograms(generate_latest(reg).decode())
    assert got[DECODE] == pytest.approx((1.75, 3))
    assert got[PREFILL] == (0.0, 0.0)  # absent: nothing measured


def test_default_batches_double_up_to_max_num_seqs():
    assert default_batches(8) == [1, 2, 4, 8]
    assert default_batches(6) == [1, 2, 4, 6]
    assert default_batches(1) == [1]


def test_a_server_without_vllm_metrics_is_refused_before_any_probe(stub_server):
    url, _ = stub_server()  # the stub upstream (test double): no /metrics
    with pytest.raises(CalibrationError, match="not a vLLM server"):
        calibrate(url, "stub", 2, 2048)


def test_calibration_measures_the_engine_and_the_fit_predicts_its_decode_speed(tiny_engine):
    cal = calibrate(tiny_engine.url, "tiny", 4, 2048, batches=[1, 4], decode_prompts=(32,),
                    decode_tokens=64, prefill_lengths=(16, 256, 1024), mixed_lengths=(256,),
                    repeats=1)  # fmt: skip
    kinds = Counter(p.kind for p in cal.probes)
    assert kinds["decode"] == 2 and kinds["prefill"] == 3 and kinds["mixed"] <= 1
    for p in cal.probes:
        # engine-side time of one step is positive and below what the client saw of the request
        assert 0 < p.step_s < p.client_s, p
    for p in (p for p in cal.probes if p.kind == "decode"):
        assert p.step_s * 63 < p.client_s  # 63 decode steps happen inside the client's time
    pre = {p.prefill_tokens: p.step_s for p in cal.probes if p.kind == "prefill"}
    assert pre[1024] > 3 * pre[16]  # ~50 ms vs ~5 ms measured on 2 cores
    assert cal.mape < 0.5
    # the fitted model, evaluated at a probe's shape, is that probe's engine time within 2x, and
    # times 63 steps it stays below the client's whole request
    for p in (p for p in cal.probes if p.kind == "decode"):
        pred = cal.model.step_time(0, 0, 0, p.num_decode, p.decode_context)
        assert 0.5 < pred / p.step_s < 2.0
    assert cal.decode_tok_s(4) > cal.decode_tok_s(1) > 0  # batching raises throughput
    assert 0 < cal.client_overhead_s < 1.0
    d = cal.to_dict()
    assert d["model"]["kind"] == "fitted" and len(d["probes"]) == len(cal.probes)
