"""Served models the predictor was never fitted on: the gateway predicts them with the
predictor's fallback, but says so (a warning once per model, at startup for a backend's model)
and counts them in /metrics (`presched_predictor_unknown_model_total{model}`); the Hugging Face
spelling of a fitted CASTILLO model (`org/name` for `org--name`) is not unknown."""

from __future__ import annotations

import logging

import httpx
import pytest
from serve.test_gateway_api import metric_values, settle

from presched.predict.base import PREDICTORS
from presched.serve.app import build_app
from presched.serve.config import ServeConfig
from presched.serve.predictions import MAX_MODEL_LABELS, PredictBatcher
from presched.workload.request import Request

FITTED = "meta-llama--Llama-3.1-8B-Instruct"
SERVED = "meta-llama/Llama-3.1-8B-Instruct"  # the same model, as a client names it
NEW = "acme/Brand-New-7B"


@pytest.fixture(scope="module")
def pred():
    reqs = [Request(id=f"{m}{p}", prompt_tokens=p, output_tokens=k * p, model=m)
            for m, k in ((FITTED, 5), ("google--gemma-3-4b-it", 1)) for p in range(2, 200, 3)]  # fmt: skip
    return PREDICTORS.create("linear-prompt").fit(reqs)


def test_unknown_models_are_counted_warned_once_and_exported(asgi_server, stub_server, pred, caplog):
    up_known, _ = stub_server(model=SERVED)
    up_new, _ = stub_server(model=NEW)
    backends = [{"url": up_known, "model": SERVED, "max_in_flight": 4},
                {"url": up_new, "model": NEW, "max_in_flight": 4}]  # fmt: skip
    with caplog.at_level(logging.WARNING):
        app = build_app(ServeConfig(backends=backends, log={"path": None}, policy="sjf"), pred)
        url = asgi_server(app)
        for model in (SERVED, NEW, NEW, SERVED, NEW):
            r = httpx.post(url + "/v1/completions", json={"model": model, "prompt": "a b c", "max_tokens": 3})
            assert r.status_code == 200, r.text
        settle(app.state.gateway.gw, 5)
    values = metric_values(httpx.get(url + "/metrics").text)
    assert values[f'presched_predictor_unknown_model_total{{model="{NEW}"}}'] == 3
    assert not [k for k in values if "unknown_model" in k and "Llama" in k]
    said = [r.getMessage() for r in caplog.records if NEW in r.getMessage()]
    # once at startup (a backend serves it), once at its first request; never for the fitted one
    assert len(said) == 2 and all("linear-prompt" in s and "presched train --from-log" in s for s in said)
    assert any(s.startswith("startup:") for s in said)
    assert not [r for r in caplog.records if "Llama" in r.getMessage()]


def test_fitted_model_under_its_hugging_face_name_gets_its_own_row(pred):
    batcher = PredictBatcher(pred)
    try:
        r = Request(id="a", prompt_tokens=50, model=SERVED)
        got = batcher._predict([r])[0]
        want = pred.predict([Request(id="a", prompt_tokens=50, model=FITTED)])[0]
        pooled = pred.predict([Request(id="a", prompt_tokens=50, model="nobody")])[0]
        assert got.mean == pytest.approx(want.mean) and got.mean != pytest.approx(pooled.mean)
        assert not batcher.unknown_models
    finally:
        batcher.worker.close()


def test_unknown_model_labels_are_bounded(pred):
    batcher = PredictBatcher(pred)
    try:
        batcher._predict([Request(id=str(i), prompt_tokens=5, model=f"m{i}") for i in range(MAX_MODEL_LABELS + 5)])
        batcher._predict([Request(id="x", prompt_tokens=5, model="m0"), Request(id="y", prompt_tokens=5, model="")])
        assert len(batcher.unknown_models) == MAX_MODEL_LABELS + 1
        assert batcher.unknown_models["other"] == 6 and batcher.unknown_models["m0"] == 2
    finally:
        batcher.worker.close()


def test_with_learn_names_still_match_unseen_models_are_counted_and_refits_learn_one_model(pred):
    """`presched serve --learn` puts an OnlineLearner in front of the predictor: it had no
    `known_models`, so `org/name` got the all-model fallback, unseen models went uncounted, and a
    refit trained on the client's spelling beside the anchor's (one model learnt as two)."""
    from presched.predict.online import OnlineConfig, OnlineLearner

    learner = OnlineLearner(pred, OnlineConfig(enabled=True, refit_every=0), background=False)
    batcher = PredictBatcher(learner)
    try:
        r = Request(id="a", prompt_tokens=50, model=SERVED, prompt="a question")
        got = batcher._predict([r])[0]
        want = pred.predict([Request(id="a", prompt_tokens=50, model=FITTED)])[0]
        assert got.point == want.point
        batcher._predict([Request(id="b", prompt_tokens=50, model=NEW)])
        assert dict(batcher.unknown_models) == {NEW: 1}
        learner.observe(r, 200, status="ok")
        learner.observe(Request(id="c", prompt_tokens=5, model=SERVED, prompt="unpredicted"), 20)
        assert [q.model for q, _ in learner.buffer] == [FITTED, FITTED]  # the fitted spelling
        # called directly (presched learn), the learner matches the names itself
        direct = learner.predict([Request(id="d", prompt_tokens=50, model=SERVED, prompt="x")])
        assert direct.point[0] == want.point
    finally:
        batcher.worker.close()


def test_the_learners_known_models_are_read_again_after_a_refit(pred):
    """A refit fitted on a new model's answers knows it: the gateway stops calling it unseen."""
    from presched.predict.online import OnlineConfig, OnlineLearner

    learner = OnlineLearner(pred, OnlineConfig(enabled=True, refit_every=0), background=False)
    batcher = PredictBatcher(learner)
    try:
        assert batcher.known.match(NEW) is None
        learner.base = PREDICTORS.create("linear-prompt").fit(
            [Request(id=f"n{p}", prompt_tokens=p, output_tokens=p, model=NEW) for p in range(2, 50)])
        learner.version += 1  # what a refit's swap does
        assert batcher.known.match(NEW) == NEW
    finally:
        batcher.worker.close()
