"""`stack`: the blend weight is the calibration set's best ranker, the quantiles are calibrated,
bad parameters are refused naming them, and a saved stack predicts as the fitted one. Members
here are the cheap baselines on planted lengths (the text-gbm + ssjf default is measured in
benchmarks/predictors.py and docs/predictors/stack.md)."""

from __future__ import annotations

import numpy as np
import pytest

from presched.predict import LEVELS, PREDICTORS, load_predictor
from presched.predict.base import reads_text
from presched.predict.metrics import kendall_tau_b
from presched.predict.stack import grid_points, simplex
from presched.workload.request import Request

MEMBERS = dict(members=["model-median", "linear-prompt"], member_params={})


def planted(n, seed, noise=0.3):
    """Length = 3 x prompt tokens x log-normal noise; two models whose medians differ 4x, so
    the per-model median ranks by model only and the prompt-length line ranks within too."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        p = int(rng.integers(10, 500))  # lengths stay under CAP (capped ones are no labels)
        model = "big" if i % 2 else "small"
        y = 3 * p * (4 if model == "big" else 1) * np.exp(noise * rng.normal())
        out.append(Request(id=f"s{seed}-{i}", prompt=f"p{i}", prompt_tokens=p, model=model,
                           output_tokens=max(1, int(y))))  # fmt: skip
    return out


def test_simplex_weights_sum_to_one_first_member_heaviest_first():
    grid = simplex(3, 4)
    assert len(grid) == 15 and grid[0] == (1.0, 0.0, 0.0)
    assert all(abs(sum(w) - 1) < 1e-12 and min(w) >= 0 for w in grid)
    assert simplex(2, 2) == [(1.0, 0.0), (0.5, 0.5), (0.0, 1.0)]
    # the same order as filtering every tuple, without building (steps + 1)^n of them
    import itertools

    want = [c for c in itertools.product(range(6, -1, -1), repeat=4) if sum(c) == 6]
    assert simplex(4, 6) == [tuple(x / 6 for x in c) for c in want]
    assert len(simplex(4, 6)) == grid_points(4, 6) == 84


def test_a_grid_too_large_to_search_is_refused_naming_grid():
    members = ["text-gbm", "ssjf", "model-median", "linear-prompt", "lexical-gbm"]
    with pytest.raises(ValueError, match=r"5 members on a grid of 100 make 4,598,126 weight vectors.*'grid'"):
        PREDICTORS.create("stack", members=members, grid=100)
    PREDICTORS.create("stack", members=members, grid=10)  # 1,001 points: fine
    PREDICTORS.create("stack", members=members, grid=100, weights=[0.2] * 5)  # no search


def test_the_weight_is_the_calibration_sets_best_ranker_and_quantiles_cover():
    pred = PREDICTORS.create("stack", **MEMBERS).fit(planted(3000, 0), validation=planted(1500, 1))
    taus = pred.fit_info["calibration_tau"]
    assert pred.fit_info["weights"] == [0.0, 1.0]  # the prompt-length line knows the model too
    assert taus["0,1"] == max(taus.values()) > taus["1,0"]
    test = planted(4000, 2)
    est = pred.predict(test)
    y = np.array([r.output_tokens for r in test])
    assert kendall_tau_b(est.rank_score, y) > 0.8
    cover = (y[:, None] <= est.quantiles).mean(axis=0)
    assert np.abs(cover[:9] - np.array(LEVELS[:9])).max() < 0.03  # split conformal, exchangeable data
    assert np.array_equal(est.point, est.quantiles[:, LEVELS.index(0.5)])


def test_fixed_weights_are_used_and_the_blend_is_the_weighted_log_median():
    train, cal, test = planted(2000, 0), planted(1000, 1), planted(50, 2)
    pred = PREDICTORS.create("stack", weights=[0.25, 0.75], **MEMBERS).fit(train, validation=cal)
    a, b = (PREDICTORS.create(n).fit(train, validation=cal).predict(test) for n in MEMBERS["members"])
    m = 0.25 * np.log(a.quantiles[:, LEVELS.index(0.5)]) + 0.75 * np.log(b.quantiles[:, LEVELS.index(0.5)])
    assert pred.fit_info["weights"] == [0.25, 0.75]
    assert np.allclose(pred.predict(test).rank_score, m)


def test_save_and_load_give_the_same_estimates(tmp_path):
    pred = PREDICTORS.create("stack", **MEMBERS).fit(planted(1500, 0), validation=planted(800, 1))
    test = planted(100, 2)
    back = load_predictor(pred.save(tmp_path / "stack.npz"))
    assert np.allclose(back.predict(test).quantiles, pred.predict(test).quantiles)
    assert back.fit_info["weights"] == pred.fit_info["weights"]
    # an unseen model is told what each member does for it, not the base text
    note = back.unknown_model_fallback("new-model")
    assert note == "; ".join(f"{m.name}: {m.unknown_model_fallback('new-model')}" for m in back.members)
    assert note.startswith("model-median: ") and "; linear-prompt: " in note


@pytest.mark.parametrize("params, field", [
    (dict(members=[]), "members"), (dict(members=["text-gbm", "text-gbm"]), "members"),
    (dict(members=["stack"], member_params={}), "members"),
    (dict(member_params={"nope": {}}), "member_params"), (dict(member_params={"ssjf": 3}), "member_params"),
    (dict(weights=[0.5, 0.6]), "weights"), (dict(weights=[1.0]), "weights"), (dict(grid=0), "grid"),
])  # fmt: skip
def test_bad_parameters_are_refused_naming_them(params, field):
    with pytest.raises(ValueError, match=f"stack: parameter '{field}'"):
        PREDICTORS.create("stack", **params)


def test_a_members_bad_parameter_is_refused_before_fitting_and_text_need_is_the_members():
    with pytest.raises(ValueError, match="text-gbm: parameter 'learning_rate'"):
        PREDICTORS.create("stack", members=["text-gbm", "model-median"], member_params={"text-gbm": {"learning_rate": 0.0}})
    assert not reads_text(PREDICTORS.create("stack", **MEMBERS))
    assert reads_text(PREDICTORS.create("stack", members=["text-gbm", "model-median"], member_params={}))
