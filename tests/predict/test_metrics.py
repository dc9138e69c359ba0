"""Metrics on hand-made cases with known answers, and against scipy / brute force."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import kendalltau, spearmanr

from presched.predict import LEVELS, LengthEstimate
from presched.predict import metrics as M
from presched.workload.request import Request


def test_point_errors():
    pred, y = np.array([100, 200, 300, 400]), np.array([150, 200, 420, 380])
    assert M.mae(pred, y) == pytest.approx((50 + 0 + 120 + 20) / 4)
    assert M.rmse(pred, y) == pytest.approx(np.sqrt((50**2 + 120**2 + 20**2) / 4))
    assert M.acc_within(pred, y, 50) == 0.75  # |err| <= 50 counts (50 is in)
    assert M.acc_within(pred, y, 100) == 0.75
    assert M.acc_within(pred, y, 120) == 1.0


def test_ssjf_classes_use_training_percentiles():
    train = np.arange(1, 101, dtype=float)  # p25 = 25.75, p50 = 50.5, p75 = 75.25, p99 = 99.01
    edges = M.ssjf_edges(train)
    assert edges == pytest.approx([25.75, 50.5, 75.25, 99.01])
    assert M.length_class([1, 25.75, 50, 80, 99.5, 1e6], edges).tolist() == [0, 1, 1, 3, 4, 4]
    assert M.class_accuracy([10, 60, 90, 200], [20, 40, 95, 150], edges) == 0.75  # 60 vs 40 differ


def test_kendall_and_spearman_match_scipy_with_ties():
    rng = np.random.default_rng(0)
    s = rng.integers(0, 5, 300).astype(float)  # many ties in the score
    y = s + rng.integers(0, 4, 300)  # and in the target
    assert M.kendall_tau_b(s, y) == pytest.approx(kendalltau(s, y, variant="b").statistic)
    assert M.spearman(s, y) == pytest.approx(spearmanr(s, y).statistic)
    assert np.isnan(M.kendall_tau_b(np.ones(5), np.arange(5)))  # constant score: undefined
    # τ-b by hand on a tiny case: x = [1,2,2,3], y = [1,3,2,3]
    # pairs: (0,1)C (0,2)C (0,3)C (1,2) tie x (1,3) tie y (2,3)C -> C=4, D=0, n1=1, n2=1, n0=6
    assert M.kendall_tau_b([1, 2, 2, 3], [1, 3, 2, 3]) == pytest.approx(4 / np.sqrt(5 * 5))


@pytest.mark.parametrize("seed", range(5))
def test_pairwise_accuracy_equals_brute_force(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 80))
    s = rng.integers(0, 6, n).astype(float)
    y = rng.integers(0, 6, n) + 0.5 * s
    assert M.pairwise_accuracy(s, y) == pytest.approx(M.pairwise_accuracy_bruteforce(s, y))


def test_pairwise_accuracy_known_values():
    assert M.pairwise_accuracy([1, 2, 3], [10, 20, 30]) == 1.0
    assert M.pairwise_accuracy([3, 2, 1], [10, 20, 30]) == 0.0
    assert M.pairwise_accuracy([5, 5, 5], [10, 20, 30]) == 0.5  # no ranking ability
    # y = [1, 1, 2]: only pairs (0,2), (1,2) count; s orders (0,2) right, (1,2) tied -> 1.5 / 2
    assert M.pairwise_accuracy([0, 1, 1], [1, 1, 2]) == 0.75
    assert M.pairwise_accuracy_bruteforce([0, 1, 1], [1, 1, 2]) == 0.75


def test_coverage_pinball_and_under_prediction():
    lv = np.asarray(LEVELS)
    q = np.tile(np.arange(1, 12) * 100.0, (4, 1))  # q10 = 100 ... q90 = 900, q95 = 1000, q99 = 1100
    y = np.array([50, 450, 950, 2000])
    cov = M.coverage(q, y)
    # y <= q: 50 under all; 450 from q50 (500) on; 950 from q95 (1000) on; 2000 never
    expect = np.array([1, 1, 1, 1, 2, 2, 2, 2, 2, 3, 3]) / 4
    assert cov == pytest.approx(expect)
    assert M.under_prediction_q90(q, y) == 0.5
    assert M.max_coverage_error_pts(cov) == pytest.approx(100 * np.max(np.abs(expect - lv)[:9]))
    # pinball by hand for one row / one level: y = 2000, q90 = 900 -> 0.9 * 1100
    d = y[:, None] - q
    assert M.pinball_loss(q, y) == pytest.approx(np.mean(np.maximum(lv * d, (lv - 1) * d)))
    assert M.pinball_loss(q[:1, :], [q[0, 4]]) == pytest.approx(
        np.mean([(lv[j] - 1) * (q[0, 4] - q[0, j]) if j > 4 else lv[j] * (q[0, 4] - q[0, j]) for j in range(11)]))
    # against samples: each sample is one event
    cs = M.coverage_samples(q[:2], [np.array([50, 450]), np.array([950])])
    assert cs[0] == pytest.approx(1 / 3) and cs[4] == pytest.approx(2 / 3) and cs[9] == 1.0


def test_perfect_quantiles_are_calibrated():
    rng = np.random.default_rng(3)
    y = rng.exponential(300, 20000)
    q = np.tile(np.quantile(y, LEVELS), (len(y), 1))
    assert M.max_coverage_error_pts(M.coverage(q, y)) < 0.1


def test_score_all_targets_single_samples_and_cap():
    reqs = [
        Request(id="a", prompt_tokens=5, model="m1", output_tokens=100, output_samples=(100, 300)),
        Request(id="b", prompt_tokens=5, model="m1", output_tokens=15000, output_samples=(15000, 400)),
        Request(id="c", prompt_tokens=5, model="m2", output_tokens=900, output_samples=(900, 700)),
        Request(id="d", prompt_tokens=5, model="m2", output_tokens=15001, output_samples=(15001, 15000)),
    ]
    q = np.tile(np.linspace(100, 1100, 11), (4, 1))
    est = LengthEstimate(q, np.array([200.0, 400, 800, 500]), np.array([1.0, 2, 3, 4]))
    s = M.score_all(est, reqs, edges=[150, 350, 600, 1000])
    assert s["n"] == 3 and s["n_unlabelled"] == 1  # d: every sample at the cap
    # targets: a = 200, b = 400 (capped sample left out), c = 800 -> perfect points
    assert s["mae"] == 0 and s["acc50"] == 1 and s["class5_acc"] == 1 and s["kendall_tau_b"] == 1
    # single sample 0: a = 100, b capped (left out), c = 900
    assert s["mae_single"] == pytest.approx((100 + 100) / 2)
    # coverage vs samples: 100, 300, 400, 900, 700 (the capped 15000 left out)
    assert s["coverage_samples"][0] == pytest.approx(1 / 5)
    assert len(s["coverage"]) == len(LEVELS)
    assert s["kendall_tau_b_within_model"] == pytest.approx(1.0)  # m1: a < b; m2: one row -> nan, skipped


def test_coverage_noise_floor_closed_form_and_scaling():
    from presched.predict.metrics import coverage_noise_floor_pts

    # one request: u in a decile (0.1k, 0.1(k+1)) leaves max(0.1k, 0.9 - 0.1k) as the worst
    # level's error, 0.9 in the two outer deciles: E = 0.18 + 0.1 * (0.8+0.7+0.6+0.5)*2 = 0.70
    assert abs(coverage_noise_floor_pts(1, trials=40000) - 70.0) < 0.6
    floors = [coverage_noise_floor_pts(n) for n in (50, 200, 800)]
    assert floors[0] > floors[1] > floors[2]
    assert 1.8 < floors[1] / floors[2] < 2.2  # ~ 1 / sqrt(n)
    assert abs(floors[1] - 4.87) < 0.05  # the figure benchmarks/online.py prints (seed 0)
    with pytest.raises(ValueError, match="^n: expected"):
        coverage_noise_floor_pts(0)
