"""`EngineProbe` (plugin config `probe`) without an engine: refused at start when it cannot read
the hook's features, replaces estimates batched (a request's own vllm_xargs prediction wins), and
a probe that raises is counted with the estimates kept. The real engine run is test_probe_hook's."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from presched.engine.plugin.config import FeatureConfig, PluginConfigError, parse_plugin_config
from presched.engine.plugin.probe import EngineProbe
from presched.predict import PREDICTORS
from presched.predict.probe.spec import FeatureSpec
from presched.workload.request import Request

HIDDEN = 6


@pytest.fixture(scope="module")
def probe_file(tmp_path_factory):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(80, HIDDEN))
    y = np.exp(4 + X[:, 0])
    spec = FeatureSpec(model="tiny-llama", layer=1, hidden=HIDDEN, pooling="mean", sink=1)
    pred = PREDICTORS.create("probe", model="tiny-llama", layer=1)
    pred.fit_features(X[:60], y[:60], X[60:], y[60:], spec=spec)
    return pred.save(tmp_path_factory.mktemp("probe") / "probe.npz")


def _probe(path, features=FeatureConfig(), model="tiny-llama", n_layers=2, hidden=HIDDEN):
    return EngineProbe(path, features, model, n_layers, hidden)


def test_config_refuses_a_probe_without_features_or_file(probe_file, tmp_path):
    with pytest.raises(PluginConfigError, match=r"^probe: needs `features`"):
        parse_plugin_config({"probe": str(probe_file)})
    with pytest.raises(PluginConfigError, match=r"^probe: model file not found"):
        parse_plugin_config({"probe": str(tmp_path / "no.npz"), "features": {}})
    assert parse_plugin_config({"probe": str(probe_file), "features": {}}).probe == probe_file
    with pytest.raises(PluginConfigError, match=r"^probe: needs `features`"):
        _probe(probe_file, features=None)


@pytest.mark.parametrize("kwargs, field", [
    (dict(features=FeatureConfig(layer=0)), "layer: fitted on 1, got 0"),
    (dict(n_layers=4), "layer: fitted on 1, got 2"),  # default layer = n_layers // 2
    (dict(features=FeatureConfig(sink_tokens=0)), "sink: fitted on 1, got 0"),
    (dict(hidden=8), "hidden: fitted on 6, got 8"),
    (dict(model="smollm2-135m"), "model: fitted on 'tiny-llama', got 'smollm2-135m'"),
])  # fmt: skip
def test_a_probe_of_other_features_is_refused_naming_the_field(probe_file, kwargs, field):
    with pytest.raises(PluginConfigError, match=r"^probe \(.*" + field.replace("(", r"\(")):
        _probe(probe_file, **kwargs)


def test_an_egtp_file_needs_the_egtp_pool_and_other_files_are_refused(tmp_path):
    rng = np.random.default_rng(1)
    X = rng.normal(size=(20, HIDDEN))
    egtp = PREDICTORS.create("egtp", model="tiny-llama", layer=1)
    egtp.fit_features(X[:15], np.full(15, 9.0), X[15:], np.full(5, 9.0))
    path = egtp.save(tmp_path / "e.npz")
    with pytest.raises(PluginConfigError, match=r"^probe: .*is an egtp probe; it needs features.egtp: true"):
        _probe(path)
    assert _probe(path, features=FeatureConfig(egtp=True)).pooling == "egtp"
    text = PREDICTORS.create("global-median").fit(
        [Request(id=f"q{i}", prompt_tokens=3, output_tokens=9) for i in range(4)])
    with pytest.raises(PluginConfigError, match=r"^probe: .*'global-median' predictor; expected a probe or egtp"):
        _probe(text.save(tmp_path / "m.npz"))
    (tmp_path / "junk.npz").write_bytes(b"not a zip")
    with pytest.raises(PluginConfigError, match=r"^probe: .*not a presched model file"):
        _probe(tmp_path / "junk.npz")


def _seq(source=None, estimate=None):
    return SimpleNamespace(pred_source=source, estimate=estimate)


def test_apply_replaces_estimates_batched_but_never_a_requests_own(probe_file):
    probe = _probe(probe_file)
    own = object()
    refined = object()
    seqs = {"a": _seq("predictor", "text"), "b": _seq("xargs", own), "c": _seq(), "d": _seq("refine", refined)}
    vecs = np.random.default_rng(2).normal(size=(5, HIDDEN)).astype(np.float32)
    # "gone" was freed; "d" was refined mid-answer (a re-pooled preempted request): kept
    assert probe.apply(["a", "b", "c", "gone", "d"], vecs, seqs) == 2
    want = probe.predictor.predict_features(vecs[[0, 2]])
    for j, rid in enumerate(("a", "c")):
        assert seqs[rid].pred_source == "probe"
        np.testing.assert_allclose(seqs[rid].estimate.quantiles, want[j].quantiles, rtol=1e-12)
    assert seqs["b"].estimate is own and seqs["b"].pred_source == "xargs"
    assert seqs["d"].estimate is refined and seqs["d"].pred_source == "refine"
    assert (probe.predictions, probe.errors) == (2, 0)


def test_a_raising_probe_is_counted_and_the_estimates_are_kept(probe_file):
    probe = _probe(probe_file)
    seqs = {"a": _seq("predictor", "text")}
    # one vector of the wrong width: the real probe raises on it (shape check)
    assert probe.apply(["a"], np.zeros((1, HIDDEN + 1), np.float32), seqs) == 0
    assert (probe.predictions, probe.errors) == (0, 1)
    assert (seqs["a"].estimate, seqs["a"].pred_source) == ("text", "predictor")
    assert probe.apply(["a"], np.zeros((1, HIDDEN), np.float32), seqs) == 1  # still serving


def test_start_engine_refuses_a_probe_of_another_layer_before_vllm_starts(tiny_model, tmp_path):
    """The launcher makes the scheduler's check itself (a refusal in ~1 s, not after a ~25 s
    vLLM start); the log file is only written once vLLM is launched, so its absence proves
    the refusal came first."""
    import json

    from presched.engine.launch import start_engine

    hidden = json.loads((tiny_model / "config.json").read_text())["hidden_size"]
    rng = np.random.default_rng(1)
    X = rng.normal(size=(30, hidden))
    pred = PREDICTORS.create("probe", model=tiny_model.name, layer=0)
    pred.fit_features(X[:20], np.exp(3 + X[:20, 0]), X[20:], np.exp(3 + X[20:, 0]))
    path = pred.save(tmp_path / "layer0.npz")
    log = tmp_path / "engine.log"
    with pytest.raises(PluginConfigError, match=r"^probe \(.*layer: fitted on 0, got 1"):
        start_engine(tiny_model, plugin={"probe": str(path), "features": {"layer": 1}}, log_path=log)
    assert not log.exists()


@pytest.fixture(scope="module")
def draft_file(tmp_path_factory):
    """A draft-probe on layer 0 of a draft model 'tiny-draft' (its own label law: 2 x y)."""
    rng = np.random.default_rng(3)
    X = rng.normal(size=(80, HIDDEN))
    y = np.exp(5 + X[:, 1])
    spec = FeatureSpec(model="tiny-draft", layer=0, hidden=HIDDEN, pooling="mean", sink=1, role="draft")
    pred = PREDICTORS.create("draft-probe", model="tiny-draft", layer=0)
    pred.fit_features(X[:60], y[:60], X[60:], y[60:], spec=spec)
    return pred.save(tmp_path_factory.mktemp("draft") / "draft.npz")


def _draft(path, features=FeatureConfig(draft_layer=0), model="tiny-draft"):
    return EngineProbe(path, features, model, 2, HIDDEN, role="draft")


def test_a_draft_probe_needs_the_draft_layer_and_a_draft_probe_file(probe_file, draft_file):
    with pytest.raises(PluginConfigError, match=r"^draft_probe: needs `features` with draft_layer"):
        parse_plugin_config({"draft_probe": str(draft_file), "features": {}})
    assert parse_plugin_config({"draft_probe": str(draft_file), "features": {"draft_layer": 0}}).draft_probe == draft_file
    with pytest.raises(PluginConfigError, match=r"^draft_probe: needs `features` with draft_layer"):
        _draft(draft_file, features=FeatureConfig())
    # the two files are not interchangeable: served-model states are not a draft model's
    with pytest.raises(PluginConfigError, match=r"^draft_probe: .*'probe' predictor; expected a draft-probe"):
        _draft(probe_file)
    with pytest.raises(PluginConfigError, match=r"^probe: .*'draft-probe' predictor; expected a probe or egtp"):
        _probe(draft_file)
    with pytest.raises(PluginConfigError, match=r"^draft_probe \(.*layer: fitted on 0, got 1"):
        _draft(draft_file, features=FeatureConfig(draft_layer=1))
    with pytest.raises(PluginConfigError, match=r"^draft_probe \(.*model: fitted on 'tiny-draft', got 'tiny-llama'"):
        _draft(draft_file, model="tiny-llama")


def test_the_served_models_probe_wins_over_the_draft_probe(probe_file, draft_file):
    """Order of consume.py: the draft probe first, then the probe; the draft probe never replaces
    a request's own, a refined or a probe estimate."""
    probe, draft = _probe(probe_file), _draft(draft_file)
    own = object()
    seqs = {"a": _seq("predictor", "text"), "b": _seq("xargs", own), "c": _seq("probe", "p"), "d": _seq()}
    vecs = np.random.default_rng(4).normal(size=(4, HIDDEN)).astype(np.float32)
    assert draft.apply(["a", "b", "c", "d"], vecs, seqs) == 2
    assert [seqs[r].pred_source for r in "abcd"] == ["draft-probe", "xargs", "probe", "draft-probe"]
    np.testing.assert_allclose(seqs["a"].estimate.quantiles, draft.predictor.predict_features(vecs[:1])[0].quantiles)
    assert probe.apply(["a", "d"], vecs[:2], seqs) == 2  # the served model's own state replaces it
    assert seqs["a"].pred_source == seqs["d"].pred_source == "probe"
    assert (draft.predictions, probe.predictions) == (2, 2)


def test_the_consumer_gives_an_egtp_probe_the_egtp_pools(tmp_path):
    """consume.py hands an egtp probe the step's EGTP vectors, not the means (the real engine's
    EGTP pools are test_probe_hook's), and records both tables."""
    from presched.engine.plugin.consume import FeatureConsumer
    from presched.engine.plugin.features import StepFeatures
    from presched.engine.plugin.records import EGTP_FEATURE_TABLE, RecordWriter

    rng = np.random.default_rng(5)
    X = rng.normal(size=(40, HIDDEN))
    egtp = PREDICTORS.create("egtp", model="tiny-llama", layer=1)
    egtp.fit_features(X[:30], np.exp(4 + X[:30, 0]), X[30:], np.exp(4 + X[30:, 0]))
    path = egtp.save(tmp_path / "e.npz")
    cfg = parse_plugin_config({"features": {"egtp": True}, "probe": str(path)})
    hf = SimpleNamespace(num_hidden_layers=2, hidden_size=HIDDEN)
    vcfg = SimpleNamespace(model_config=SimpleNamespace(model="/m/tiny-llama", hf_config=hf), speculative_config=None)
    counts, saved = {}, []
    con = FeatureConsumer(cfg, vcfg, counts, lambda: saved.append(1))
    seq = SimpleNamespace(id="a", pred_source="predictor", estimate="text", features_prompt=None, features_n=0,
                          features_missing=0, feature_pools=0, features_egtp=None, feature_steps=0,
                          features_draft=None, features_record=None)  # fmt: skip
    mean, pooled = rng.normal(size=(1, HIDDEN)).astype(np.float32), rng.normal(size=(1, HIDDEN)).astype(np.float32)
    con.step(StepFeatures(layer=1, sink=1, hidden=HIDDEN, prompt_ids=["a"], prompt=mean, prompt_n=[5],
                          prompt_missing=[0], prompt_egtp=pooled), {"a": seq})  # fmt: skip
    assert seq.pred_source == "probe" and counts["pred_probe"] == 1 and not saved
    np.testing.assert_allclose(seq.estimate.quantiles, egtp.predict_features(pooled)[0].quantiles)
    w = RecordWriter(tmp_path / "r.sqlite")
    con.write(w, seq)
    w.close()
    import sqlite3

    (spec,) = sqlite3.connect(tmp_path / "r.sqlite").execute(f"SELECT spec FROM {EGTP_FEATURE_TABLE}").fetchone()
    assert '"pooling":"egtp"' in spec


def test_start_engine_refuses_draft_features_without_a_draft_model_before_vllm_starts(
        tiny_model, draft_file, tmp_path):  # fmt: skip
    from presched.engine.launch import start_engine

    log = tmp_path / "engine.log"
    with pytest.raises(PluginConfigError, match=r"^features.draft_layer: needs a draft model"):
        start_engine(tiny_model, plugin={"features": {"draft_layer": 1}}, log_path=log)
    # with the draft model named, its probe file is checked against the draft model's config
    with pytest.raises(PluginConfigError, match=r"^draft_probe \(.*model: fitted on 'tiny-draft', got 'tiny-llama'"):
        start_engine(tiny_model, plugin={"features": {"draft_layer": 0}, "draft_probe": str(draft_file)},
                     draft_model=tiny_model, log_path=log)  # fmt: skip
    assert not log.exists()


def test_a_non_finite_row_keeps_its_estimate_and_the_steps_others_get_theirs(probe_file):
    """One NaN vector made the whole step's batch raise, so every request kept its old estimate;
    and a state far outside the data overflowed exp(mu) (now clipped: finite quantiles)."""
    probe = _probe(probe_file)
    seqs = {k: _seq("predictor", "text") for k in "abc"}
    vecs = np.random.default_rng(3).normal(size=(3, HIDDEN)).astype(np.float32)
    vecs[1, 0] = np.nan
    vecs[2] *= 1e6  # far outside: the ridge extrapolates
    assert probe.apply(["a", "b", "c"], vecs, seqs) == 2
    assert (probe.predictions, probe.errors) == (2, 1)
    assert seqs["b"].estimate == "text" and seqs["a"].pred_source == seqs["c"].pred_source == "probe"
    assert np.isfinite(seqs["c"].estimate.quantiles).all() and seqs["c"].estimate.quantiles.max() < 1e20
