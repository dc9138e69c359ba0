"""Fitted (DistServe-form) step model: formula, decode line, fitting, saving."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from pydantic import ValidationError

from presched.sim.steptime import (
    FittedCoefficients,
    FittedStepModel,
    RooflineStepModel,
    StepSample,
    get_hardware,
    get_model,
    typical_shapes,
)
from presched.sim.steptime.fitted import _nnls

TRUE = dict(a_prefill=4e-3, b_prefill=3e-5, c_prefill=1e-9,
            a_decode=7e-3, b_decode=5e-8, c_decode=2e-5)


def test_formula_and_mixed_step_rule():
    m = FittedStepModel(TRUE)
    # decode-only
    assert m.step_time(0, 0, 0, 10, 5000) == pytest.approx(7e-3 + 5e-8 * 5000 + 2e-5 * 10)
    # prefill only: the prefill intercept, not the decode one
    p, pairs = 100, 100 * 101 / 2
    assert m.step_time(p, pairs, p, 0, 0) == pytest.approx(4e-3 + 3e-5 * 100 + 1e-9 * 2 * pairs)
    # mixed: prefill intercept + prefill terms + the decodes' own context and request costs
    assert m.step_time(p, pairs, p, 10, 5000) == pytest.approx(
        4e-3 + 3e-5 * 100 + 1e-9 * 2 * pairs + 5e-8 * 5000 + 2e-5 * 10
    )


def test_decode_line_is_exact_and_unbounded():
    m = FittedStepModel(TRUE)
    t0, slope, valid = m.decode_line(32, 32_000)
    assert valid == math.inf and slope == TRUE["b_decode"]
    assert t0 == m.step_time(0, 0, 0, 32, 32_000)
    for c in (32_000, 50_000, 10**8):
        assert t0 + slope * (c - 32_000) == pytest.approx(m.step_time(0, 0, 0, 32, c), rel=1e-12)


def _random_rows(rng, model, n, noise):
    rows = []
    for _ in range(n):
        kind = rng.integers(3)
        p = int(rng.integers(16, 8192)) if kind else 0
        before = int(rng.integers(0, 8192)) if kind else 0
        pairs = p * (before + (p + 1) / 2)
        b = int(rng.integers(1, 256)) if kind != 1 else 0
        c = b * int(rng.integers(16, 4096))
        t = model.step_time(p, pairs, before + p, b, c) * (1 + noise * rng.standard_normal())
        rows.append(StepSample(p, pairs, before + p, b, c, t))
    return rows


def test_fit_recovers_known_coefficients_from_noisy_rows():
    rng = np.random.default_rng(7)
    rows = _random_rows(rng, FittedStepModel(TRUE), 2000, noise=0.02)
    model, mape = FittedStepModel.fit(rows)
    got = model.coefficients.model_dump()
    for name, true in TRUE.items():
        assert got[name] == pytest.approx(true, rel=0.05), name
    assert 0.01 < mape < 0.025  # ~ mean |N(0, 0.02)| = 0.016


def test_fit_exact_rows_is_exact_and_accepts_mappings():
    rng = np.random.default_rng(1)
    rows = [r._asdict() for r in _random_rows(rng, FittedStepModel(TRUE), 60, noise=0.0)]
    model, mape = FittedStepModel.fit(rows)
    assert mape < 1e-9
    for name, true in TRUE.items():
        assert model.coefficients.model_dump()[name] == pytest.approx(true, rel=1e-6)


def test_fit_clips_to_non_negative():
    # Decode time that *falls* with context: unconstrained least squares would give b_decode < 0.
    rows = [StepSample(0, 0, 0, 8, c, 0.01 - 1e-8 * c) for c in range(1000, 200_000, 20_000)]
    rows += [StepSample(p, p * p / 2, p, 0, 0, 0.01 + 1e-5 * p) for p in (100, 500, 1000, 4000)]
    model, _ = FittedStepModel.fit(rows)
    assert all(v >= 0 for v in model.coefficients.model_dump().values())
    assert model.coefficients.b_decode == 0


def test_nnls_matches_brute_force():
    rng = np.random.default_rng(3)
    for _ in range(50):
        m, n = int(rng.integers(6, 30)), int(rng.integers(1, 6))
        a = rng.normal(size=(m, n)) * rng.choice([1e-6, 1.0, 1e4], size=n)
        y = rng.normal(size=m)
        x = _nnls(a, y)
        assert (x >= 0).all()
        best = math.inf
        for k in range(n + 1):
            for s in itertools.combinations(range(n), k):
                z = np.zeros(n)
                if s:
                    z[list(s)] = np.linalg.lstsq(a[:, list(s)], y, rcond=None)[0]
                if (z >= 0).all():
                    best = min(best, float(np.sum((a @ z - y) ** 2)))
        assert np.sum((a @ x - y) ** 2) <= best * (1 + 1e-8) + 1e-12


def test_fit_to_roofline_over_a_realistic_range():
    for model_name, hw, tp in (("llama-3.1-8b", "h100-sxm", 1), ("llama-3.1-70b", "h100-sxm", 4)):
        roof = RooflineStepModel(get_model(model_name), get_hardware(hw), tp=tp)
        shapes = typical_shapes(max_batch=256, max_prefill_tokens=8192, max_context=4096)
        fitted, mape = FittedStepModel.fit_to(roof, shapes)
        assert mape < 0.08, (model_name, mape)
        assert "fit to roofline" in fitted.source
        # decode at a typical point within a few percent
        t_r, t_f = roof.step_time(0, 0, 0, 64, 64_000), fitted.step_time(0, 0, 0, 64, 64_000)
        assert t_f == pytest.approx(t_r, rel=0.1)


@pytest.mark.parametrize(
    "rows,match",
    [
        ([StepSample(0, 0, 0, 8, 8000 + i, 0.01) for i in range(10)], "no step with prefill"),
        ([StepSample(100, 5050, 100, 0, 0, 0.01 + i) for i in range(10)], "no decode-only step"),
        ([StepSample(0, 0, 0, 8, 8000, 0.01)] * 3, "at least 6"),
        ([(0, 0, 0, 8, 8000)] * 6, r"rows\[0\]: expected 6 values"),
        ([StepSample(0, 0, 0, 8, 8000, 0.0)] * 6, r"rows\[0\]\.seconds"),
        ([StepSample(0, 0, -1, 8, 8000, 0.1)] * 6, r"rows\[0\]\.prefill_context"),
        ([{"prefill_tokens": 1}] * 6, r"rows\[0\]: missing field"),
    ],
)
def test_fit_refuses_bad_rows(rows, match):
    with pytest.raises(ValueError, match=match):
        FittedStepModel.fit(rows)


def test_to_dict_from_dict_round_trip_and_file(tmp_path):
    m = FittedStepModel(TRUE, source="unit test")
    d = m.to_dict(mape=0.03, hardware="h100-sxm")
    json.dumps(d)  # JSON-ready
    assert d["kind"] == "fitted" and d["mape"] == 0.03
    back = FittedStepModel.from_dict(d)
    assert back.coefficients == m.coefficients and back.source == "unit test"
    assert FittedStepModel.from_dict(TRUE).coefficients == m.coefficients  # flat form
    path = tmp_path / "coef.json"
    m.save(path, mape=0.03)
    loaded = FittedStepModel.load(path)
    assert loaded.step_time(10, 55, 10, 3, 300) == m.step_time(10, 55, 10, 3, 300)


def test_from_dict_errors_name_the_field(tmp_path):
    with pytest.raises(ValueError, match=r"coefficients\.coefficients\.b_decode"):
        FittedStepModel.from_dict({"coefficients": {**TRUE, "b_decode": -1}})
    with pytest.raises(ValueError, match=r"coefficients\.coefficients\.c_decode.*Field required"):
        FittedStepModel.from_dict(
            {"coefficients": {k: v for k, v in TRUE.items() if k != "c_decode"}}
        )
    with pytest.raises(ValueError, match=r"kind"):
        FittedStepModel.from_dict({"kind": "roofline", "coefficients": TRUE})
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="bad.json: not valid JSON"):
        FittedStepModel.load(bad)
    with pytest.raises(FileNotFoundError, match="missing.json"):
        FittedStepModel.load(tmp_path / "missing.json")
    with pytest.raises(ValidationError, match="a_prefill"):
        FittedCoefficients(**{**TRUE, "a_prefill": -1})
