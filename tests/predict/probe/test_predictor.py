"""`probe` / `egtp`: the ridge + conformal head on pooled hidden states (numpy only; the vectors
here are synthetic with a known log-linear length law, since what is tested is the head, its
file and its refusals — the real features are tested in test_features.py)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import kendalltau

from presched.predict import LEVELS, PREDICTORS, ModelFileError, load_predictor
from presched.predict.probe import FeatureSpec
from presched.workload.request import Request

D = 16


def _data(n, seed):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(n, D))
    y = np.exp(4 + 0.8 * X[:, 0] - 0.5 * X[:, 1] + 0.2 * rng.normal(size=n))
    return X, np.maximum(np.round(y), 1)


def _requests(X, y, key, prefix):
    return [Request(id=f"{prefix}{i}", prompt_tokens=10, output_tokens=int(v), prompt=f"p{prefix}{i}",
                    metadata={key: x}) for i, (x, v) in enumerate(zip(X, y))]


SPEC = FeatureSpec(model="smollm2-135m", layer=15, hidden=D, pooling="mean", sink=1)


@pytest.fixture(scope="module")
def fitted():
    X, y = _data(600, 0)
    Xc, yc = _data(2000, 1)  # enough calibration rows for coverage within a few points
    return PREDICTORS.create("probe").fit_features(X, y, Xc, yc)


def test_probe_learns_a_log_linear_length_law_with_calibrated_quantiles(fitted):
    X, y = _data(2000, 2)
    est = fitted.predict_features(X, SPEC)
    assert est.quantiles.shape == (2000, len(LEVELS))
    assert kendalltau(est.rank_score, y).statistic > 0.6
    cover = (y[:, None] <= est.quantiles).mean(0)
    assert np.abs(cover[:9] - np.array(LEVELS[:9])).max() < 0.05


def test_fit_and_predict_from_requests_read_the_attached_vectors():
    X, y = _data(300, 3)
    Xc, yc = _data(100, 4)
    key = SPEC.key()
    pred = PREDICTORS.create("probe").fit(_requests(X, y, key, "a"), validation=_requests(Xc, yc, key, "b"))
    Xt, yt = _data(50, 5)
    reqs = _requests(Xt, yt, key, "t")
    np.testing.assert_allclose(pred.predict(reqs).point, pred.predict_features(Xt).point)


def test_save_load_round_trip_gives_the_same_estimates(fitted, tmp_path):
    X, _ = _data(40, 6)
    path = fitted.save(tmp_path / "probe.npz")
    back = load_predictor(path)
    assert type(back).__name__ == "Probe" and back.spec == fitted.spec
    a, b = fitted.predict_features(X), back.predict_features(X, SPEC)
    np.testing.assert_array_equal(a.quantiles, b.quantiles)
    np.testing.assert_array_equal(a.rank_score, b.rank_score)


@pytest.mark.parametrize("change, field", [({"layer": 20}, "layer"), ({"model": "gemma-3-270m"}, "model"),
                                           ({"pooling": "egtp"}, "pooling"), ({"sink": 0}, "sink")])
def test_a_loaded_probe_refuses_features_of_another_model_or_layer(fitted, tmp_path, change, field):
    back = load_predictor(fitted.save(tmp_path / "probe.npz"))
    other = SPEC.model_copy(update=change)
    with pytest.raises(ValueError, match=f"other hidden states.*{field}: fitted on"):
        back.predict_features(_data(3, 7)[0], other)


def test_requests_carrying_another_layers_vectors_are_refused_naming_both_keys(fitted):
    other = SPEC.model_copy(update={"layer": 20}).key()
    reqs = _requests(*_data(2, 8), other, "o")
    with pytest.raises(ValueError, match=r"no hidden-state features 'hidden:smollm2-135m:L15:mean:s1'.*L20"):
        fitted.predict(reqs)


def test_wrong_width_and_a_file_of_the_other_pooling_are_refused(fitted, tmp_path):
    with pytest.raises(ValueError, match=f"expected shape \\(n, {D}\\)"):
        fitted.predict_features(np.zeros((2, D + 1)))
    path = fitted.save(tmp_path / "p.npz")
    with np.load(path) as z:  # relabel the file as an egtp probe: its stored spec says mean
        arrays = dict(z)
    import json

    head = json.loads(str(arrays.pop("__header__")))
    head["predictor"] = "egtp"
    np.savez(tmp_path / "e.npz", __header__=np.array(json.dumps(head)), **arrays)
    with pytest.raises(ValueError, match="'mean'-pooled, not 'egtp'"):
        load_predictor(tmp_path / "e.npz")


def test_egtp_is_registered_and_reads_its_own_key():
    X, y = _data(200, 9)
    pred = PREDICTORS.create("egtp", layer=12).fit_features(X, y, *_data(100, 10))
    assert pred.spec.key() == "hidden:smollm2-135m:L12:egtp:s1"


def test_draft_probe_reads_the_draft_models_key_and_refuses_served_model_states(tmp_path):
    from presched.predict.probe.spec import FeatureSpec

    X, y = _data(200, 11)
    pred = PREDICTORS.create("draft-probe", model="smollm2-135m", layer=15).fit_features(X, y, *_data(100, 12))
    assert pred.spec.key() == "hidden:draft:smollm2-135m:L15:mean:s1" != PREDICTORS.create("probe").wanted_spec(D).key()
    back = load_predictor(pred.save(tmp_path / "d.npz"))
    assert back.name == "draft-probe" and back.spec == pred.spec
    np.testing.assert_allclose(back.predict_features(X[:5]).quantiles, pred.predict_features(X[:5]).quantiles)
    served = FeatureSpec(model="smollm2-135m", layer=15, hidden=D, pooling="mean", sink=1)
    with pytest.raises(ValueError, match="reads 'mean'-pooled states of the draft model, got 'mean'-pooled of the served"):
        PREDICTORS.create("draft-probe").fit_features(X, y, *_data(100, 12), spec=served)
    with pytest.raises(ValueError, match="this probe reads other hidden states .*role: fitted on 'draft', got 'served'"):
        pred.predict_features(X[:2], served)
    # requests carrying only the served model's vectors are refused, naming the key it needs
    from presched.workload.request import Request

    r = Request(id="q", prompt_tokens=3, output_tokens=9, metadata={served.key(): X[0]})
    with pytest.raises(ValueError, match=r"no hidden-state features 'hidden:draft:smollm2-135m:L15:mean:s1'"):
        pred.predict([r])


def test_bad_params_and_unfitted_use_are_clear_errors():
    with pytest.raises(ValueError, match="parameter 'layer' must be an integer"):
        PREDICTORS.create("probe", layer="mid")
    with pytest.raises(ValueError, match="fit"):
        PREDICTORS.create("probe").predict_features(np.zeros((1, D)))
    with pytest.raises(ModelFileError):
        load_predictor("/nonexistent/probe.npz")


def test_hidden_state_predictors_are_registered_but_not_in_the_default_eval_list():
    from presched.predict.evaluate import available_predictors

    assert {"probe", "egtp", "draft-probe"} <= set(PREDICTORS.names())
    names = available_predictors()
    assert "text-gbm" in names and not {"probe", "egtp", "draft-probe"} & set(names)


def test_alpha_none_is_chosen_on_held_out_fit_rows():
    from presched.predict.probe.predictor import ALPHAS, RidgeHead

    rng = np.random.default_rng(5)
    # 400 noisy columns, 150 rows, one weak signal: a small penalty overfits, a large one wins
    X = rng.normal(size=(150, 400))
    y = np.exp(4 + 0.3 * X[:, 0] + 0.5 * rng.normal(size=150))
    noisy = RidgeHead(None, 0.05).fit(X, y, X[:20], y[:20])
    # 3 clean columns, many rows: the least penalty is as good as any
    X2 = rng.normal(size=(2000, 3))
    y2 = np.exp(4 + X2 @ np.array([0.8, -0.5, 0.3]) + 0.05 * rng.normal(size=2000))
    clean = RidgeHead(None, 0.05).fit(X2, y2, X2[:20], y2[:20])
    assert noisy.alpha >= 300 and clean.alpha <= 10 and {noisy.alpha, clean.alpha} <= set(ALPHAS)
    assert RidgeHead(7.0, 0.05).fit(X, y, X[:20], y[:20]).alpha == 7.0  # a given alpha is kept
    with pytest.raises(ValueError, match="'alpha' must be a positive number or null"):
        PREDICTORS.create("probe", alpha=0)
    with pytest.raises(ValueError, match="'alpha' must be a positive number or null"):
        PREDICTORS.create("probe-refine", alpha="big")


@pytest.mark.parametrize("name,extra", [("probe", {}), ("egtp", {}), ("draft-probe", {"model": "draft-x"}),
                                        ("probe-refine", {}), ("self-report", {})])  # fmt: skip
@pytest.mark.parametrize("floor", [0, 0.0, -1.0, float("nan"), float("inf")])
def test_a_sigma_floor_that_is_not_positive_is_refused_at_construction(name, extra, floor):
    # a floor of 0 let the adaptive spread ridge predict <= 0 for a calibration row, and fit
    # crashed in the conformal step ("scale: expected 20 finite positive values")
    with pytest.raises(ValueError, match=rf"^{name}: parameter 'sigma_floor' must be a positive number"):
        PREDICTORS.create(name, sigma_floor=floor, **extra)


def test_a_saved_probe_keeps_the_alpha_it_chose(fitted, tmp_path):
    back = load_predictor(fitted.save(tmp_path / "p.npz"))
    assert back.head.alpha == fitted.head.alpha is not None


@pytest.mark.parametrize("name", ["probe", "egtp", "draft-probe"])
def test_the_prompt_probes_say_they_read_prompt_text(name):
    # outside the engine they run the model on the text: a gateway or picker refuses a request
    # without it (400 naming prompt) instead of failing its predictor (a 500); probe-refine
    # reads the engine's per-step state and never the text
    from presched.predict.base import reads_text

    assert reads_text(PREDICTORS.create(name)) and not reads_text(PREDICTORS.create("probe-refine"))


def test_alpha_is_chosen_holding_out_whole_prompts():
    """A prompt answered 5 times (one row per model or run) has 5 identical vectors: rows held
    out one by one left copies in the fitted part and chose the least penalty (alpha 1: the
    probe fell from tau-b 0.45 to 0.11 on real records); whole prompts held out do not."""
    from presched.predict.probe.predictor import choose_alpha

    rng = np.random.default_rng(0)
    n, d, k = 150, 120, 5
    X = rng.normal(size=(n, d))
    ly = X @ (0.05 * rng.normal(size=d)) + rng.normal(0, 0.8, n)
    Xr, lyr = np.repeat(X, k, 0), np.repeat(ly, k) + rng.normal(0, 0.5, n * k)
    assert choose_alpha(Xr, lyr) <= 3.0  # the copies' fit (what it did)
    assert choose_alpha(Xr, lyr, groups=list(np.repeat(np.arange(n), k))) >= choose_alpha(X, ly)


def test_records_without_the_state_are_skipped_in_training_and_bad_vectors_named():
    key = SPEC.key()
    X, y = _data(200, 3)
    reqs = _requests(X, y, key, "r")
    reqs[5].metadata.pop(key)  # a request whose state was never read in the engine
    p = PREDICTORS.create("probe").fit(reqs)
    assert p.skipped == 1
    with pytest.raises(ValueError, match="request 'r5'.*no hidden-state features"):
        p.predict([reqs[5]])
    bad = _requests(X[:2], y[:2], key, "b")
    bad[1].metadata[key] = np.zeros(D + 1)
    with pytest.raises(ValueError, match=f"request 'b1'.*{D + 1} values"):
        p.predict(bad)
    bad[1].metadata[key] = {"16": [1.0]}
    with pytest.raises(ValueError, match="request 'b1'.*vector of numbers"):
        p.predict(bad)
    nan = np.full((1, D), np.nan)
    with pytest.raises(ValueError, match="features: rows \\[0\\] are not finite"):
        p.predict_features(nan)
    with pytest.raises(ValueError, match="lengths: must be finite"):
        PREDICTORS.create("probe").fit_features(X, np.where(np.arange(200) == 3, np.nan, y), X, y)


@pytest.mark.parametrize("params, wanted", [
    ({"layer": 14}, "hidden:smollm2-135m:L14:mean:s1"), ({"sink": 0}, "hidden:smollm2-135m:L15:mean:s0"),
    ({"model": "other"}, "hidden:other:L15:mean:s1"),
])  # fmt: skip
def test_training_on_records_of_other_settings_names_the_key_wanted_and_carried(params, wanted):
    """Every row was dropped and numpy said 'need at least one array to stack'."""
    X, y = _data(60, 3)
    reqs = _requests(X, y, SPEC.key(), "a")
    with pytest.raises(ValueError, match="none of the 60 training requests carries features") as e:
        PREDICTORS.create("probe", **params).fit(reqs)
    assert wanted in str(e.value) and SPEC.key() in str(e.value)
    with pytest.raises(ValueError, match="^egtp: none of the 60 .*'hidden:smollm2-135m:L15:egtp:s1'"):
        PREDICTORS.create("egtp").fit(reqs)  # the records hold the mean pooling, not EGTP's


def test_a_probe_without_model_dir_and_probe_refine_are_refused_by_the_fronts(fitted, tmp_path):
    """The gateway and the endpoint picker get prompt text only: such a file answered every
    request with a 500 ('no hidden-state features ... in metadata'); now it is refused at start."""
    from presched.serve.cli import load_parts
    from presched.serve.config import ServeConfig

    path = fitted.save(tmp_path / "probe.npz")
    cfg = ServeConfig(backends=[{"url": "http://127.0.0.1:9", "model": "m"}], predictor=str(path), log={"path": None})
    with pytest.raises(ValueError, match=r"^predictor: .*probe.npz: probe reads the served model's hidden states.*model_dir"):
        load_parts(cfg)
    assert PREDICTORS.create("probe-refine").front_refusal().startswith("probe-refine refines")
    assert PREDICTORS.create("probe", model_dir="/some/smollm2-135m").front_refusal() is None
    assert PREDICTORS.create("model-median").front_refusal() is None


def test_model_dir_of_another_model_than_the_model_param_is_refused_naming_it():
    """Vectors computed on model_dir were labelled with the `model` param: a gemma folder with
    the default model 'smollm2-135m' made smollm2 keys of gemma states."""
    with pytest.raises(ValueError, match=r"^probe: parameter 'model' is 'smollm2-135m' but model_dir is the folder 'gemma-3-270m'"):
        PREDICTORS.create("probe", model_dir="/models/gemma-3-270m")
    assert PREDICTORS.create("egtp", model_dir="/models/gemma-3-270m/", model="gemma-3-270m").params["model"] == "gemma-3-270m"
