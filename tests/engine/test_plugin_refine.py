"""`EngineRefine` (plugin config `refine`) without an engine: refused at start when it cannot read
the hook's states, refines only at its `refine_at` tokens (batched; a request's own vllm_xargs
prediction wins), and a model that raises is counted with the estimates kept. The real engine
run, against the transformers reference, is test_probe_hook's."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from presched.engine.plugin.config import FeatureConfig, PluginConfigError
from presched.engine.plugin.refine import EngineRefine
from presched.predict import PREDICTORS

HIDDEN = 5


@pytest.fixture(scope="module")
def refine_file(tmp_path_factory):
    rng = np.random.default_rng(0)
    S, P = rng.normal(size=(120, HIDDEN)), rng.normal(size=(120, HIDDEN))
    g = rng.choice([4.0, 16.0], 120)
    L = g + np.exp(3 + S[:, 0])
    pred = PREDICTORS.create("probe-refine", model="tiny-llama", layer=1)
    pred.fit_steps(S[:90], P[:90], g[:90], L[:90], S[90:], P[90:], g[90:], L[90:])
    return pred.save(tmp_path_factory.mktemp("refine") / "refine.npz")


def _refine(path, features=FeatureConfig(), at=(4, 16), model="tiny-llama", n_layers=2, hidden=HIDDEN):
    return EngineRefine(path, features, at, model, n_layers, hidden)


def _seq(g, source="probe", estimate=None, prompt=True, seed=0):
    rng = np.random.default_rng(seed)
    return SimpleNamespace(features_step=rng.normal(size=HIDDEN).astype(np.float32), features_step_g=g,
                           features_prompt=rng.normal(size=HIDDEN).astype(np.float32) if prompt else None,
                           pred_source=source, estimate=estimate)  # fmt: skip


@pytest.mark.parametrize("kwargs,field", [
    ({"model": "smollm2-135m"}, "model"), ({"n_layers": 4}, "layer"),  # default layer 4 // 2 = 2
    ({"hidden": HIDDEN + 1}, "hidden"), ({"features": FeatureConfig(sink_tokens=0)}, "sink"),
])  # fmt: skip
def test_a_model_of_other_states_is_refused_naming_the_field(refine_file, kwargs, field):
    with pytest.raises(PluginConfigError, match=rf"^refine \(.*{field}: fitted on"):
        _refine(refine_file, **kwargs)


def test_refused_without_steps_or_for_another_predictor(refine_file, tmp_path):
    with pytest.raises(PluginConfigError, match="^refine: needs `features` with steps on"):
        _refine(refine_file, features=FeatureConfig(steps=False))
    with pytest.raises(PluginConfigError, match="^refine: needs"):
        _refine(refine_file, features=None)
    probe = PREDICTORS.create("probe", model="tiny-llama", layer=1)
    X = np.random.default_rng(1).normal(size=(20, HIDDEN))
    probe.fit_features(X[:15], np.full(15, 9.0), X[15:], np.full(5, 9.0))
    with pytest.raises(PluginConfigError, match=r"^refine: .*'probe' predictor"):
        _refine(probe.save(tmp_path / "p.npz"))


def test_apply_refines_at_its_tokens_only_and_never_a_requests_own(refine_file):
    eng = _refine(refine_file)
    own = object()
    seqs = {"at4": _seq(4, seed=1), "at16": _seq(16, seed=2), "at5": _seq(5, estimate="kept", seed=3),
            "own": _seq(4, "xargs", own, seed=4), "noprompt": _seq(4, estimate="kept", prompt=False)}
    assert eng.apply(["at4", "at16", "at5", "own", "noprompt", "gone"], seqs) == 2
    s = [seqs["at4"], seqs["at16"]]
    want = eng.predictor.predict_steps(np.stack([x.features_step for x in s]),
                                       np.stack([x.features_prompt for x in s]), np.array([4.0, 16.0]))  # fmt: skip
    for j, x in enumerate(s):
        assert x.pred_source == "refine"
        np.testing.assert_allclose(x.estimate.quantiles, want[j].quantiles, rtol=1e-12)
    assert seqs["at5"].estimate == "kept" and seqs["noprompt"].estimate == "kept"
    assert seqs["own"].estimate is own and (eng.predictions, eng.errors) == (2, 0)


def test_a_raising_model_is_counted_and_the_estimates_are_kept(refine_file):
    eng = _refine(refine_file)
    bad = _seq(4, estimate="kept")
    bad.features_step = np.zeros(HIDDEN + 2, np.float32)  # wrong width: stacking/predicting raises
    good = _seq(4, estimate="kept", seed=5)
    assert eng.apply(["bad", "good"], {"bad": bad, "good": good}) == 0
    assert (eng.errors, bad.estimate, good.estimate) == (1, "kept", "kept")
    assert eng.apply(["good"], {"good": good}) == 1  # still serving


def test_a_refined_estimate_is_what_remains_given_l_above_g_for_the_policies(refine_file):
    # the policies read E[L - g | L > g] and quantiles of L - g (schedule/lengths.py) off
    # seq.estimate: after a refine at g, that is probe-refine's remaining-length distribution,
    # with no mass left at L <= g
    from presched.predict import LengthEstimate
    from presched.schedule.lengths import remaining

    eng = _refine(refine_file)
    seqs = {"a": _seq(4, seed=6), "b": _seq(16, seed=7)}
    assert eng.apply(["a", "b"], seqs) == 2
    for seq in seqs.values():
        g = float(seq.features_step_g)
        seq.generated = seq.features_step_g
        est = seq.estimate
        assert est.lower == g + 1 and est.survival(g) == 1.0
        rem = LengthEstimate.from_quantiles(est.quantiles[None] - g)[0]  # L - g, from 1 token
        assert remaining("mean")(seq) == pytest.approx(rem.mean, rel=1e-9)
        for stat, p in (("q10", 0.1), ("median", 0.5), ("q90", 0.9)):
            assert remaining(stat)(seq) == pytest.approx(max(rem.quantile(p), 1.0), rel=1e-9)


def test_an_answer_model_reads_each_requests_answer_pool_and_skips_one_without(tmp_path):
    """A model fitted with `answer` on, its law in the answer pool: the engine passes each
    seq's own mean state (sum / count, `features_answer`), so the refined means follow the
    pools; a seq with no pool yet keeps its estimate."""
    from presched.engine.plugin.answer import answer_mean
    from presched.engine.plugin.consume import FeatureConsumer
    from presched.engine.plugin.config import parse_plugin_config

    rng = np.random.default_rng(3)
    S, P, A = (rng.normal(size=(160, HIDDEN)) for _ in range(3))
    g = np.full(160, 4.0)
    L = g + np.exp(3 + A[:, 0])
    pred = PREDICTORS.create("probe-refine", model="tiny-llama", layer=1, answer=True)
    pred.fit_steps(S[:120], P[:120], g[:120], L[:120], S[120:], P[120:], g[120:], L[120:], A=A[:120], A_cal=A[120:])
    path = pred.save(tmp_path / "answer.npz")
    eng = _refine(path)
    assert eng.answer
    seqs = {}
    for i, a in enumerate((-1.0, 0.0, 1.0)):
        seq = _seq(4, seed=10 + i)
        total = np.zeros(HIDDEN)
        total[0] = 3 * a  # a pool of 3 states whose mean's column 0 is a
        seq.features_answer = [total, 3]
        seqs[f"s{i}"] = seq
    seqs["none"] = _seq(4, estimate="kept", seed=20)
    seqs["none"].features_answer = None
    assert eng.apply(list(seqs), seqs) == 3 and seqs["none"].estimate == "kept"
    means = [seqs[f"s{i}"].estimate.mean_remaining(4.0) for i in range(3)]
    assert means[0] < means[1] < means[2] and means[2] / means[0] > 3  # exp(3 + a): the pool decides
    assert answer_mean(seqs["s2"]).tolist() == [1.0] + [0.0] * (HIDDEN - 1)
    # the consumer sums pools for such a model even without records
    cfg = parse_plugin_config({"features": {}, "refine": str(path), "refine_at": [4]})
    vcfg = SimpleNamespace(model_config=SimpleNamespace(model="/m/tiny-llama", hf_config=SimpleNamespace(
        num_hidden_layers=2, hidden_size=HIDDEN)))  # fmt: skip
    assert FeatureConsumer(cfg, vcfg, {}, lambda: None).answer
