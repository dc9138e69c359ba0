"""Requests the length predictor cannot predict, through the real gateway over real HTTP (a
`StubEngine` upstream, uvicorn): a request without prompt text meets a text predictor (refused
400 naming `prompt`, before predicting), and a predictor that raises on one request of a batch
(only that request fails; the others of its batch are predicted one by one and served).
Each test failed before its fix: the first answered 500 (the predictor's "field 'prompt' is
empty"), the batch one failed every request of the batch with the other client's error."""

from __future__ import annotations

import asyncio
import random

import httpx
import pytest

from presched.predict.base import PREDICTORS, reads_text
from presched.predict.baselines import LinearPrompt
from presched.predict.estimate import LengthEstimate
from presched.serve.app import build_app
from presched.serve.config import ServeConfig
from presched.serve.predictions import PredictBatcher
from presched.workload.request import Request

WORDS = "explain write list why code short summary of the and because python".split()


def _texts(n: int, seed: int = 0) -> list[Request]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        p = " ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 40)))
        out.append(Request(id=f"t{i}", prompt=p, prompt_tokens=len(p) // 4, output_tokens=rng.randint(5, 300),
                           model="stub"))  # fmt: skip
    return out


@pytest.fixture(scope="module")
def lexical():
    """A real text predictor (lexical-gbm), fitted on a small labelled set."""
    return PREDICTORS.create("lexical-gbm").fit(_texts(300))


def _gateway(asgi_server, stub_server, predictor) -> tuple[str, object]:
    up, _ = stub_server()
    cfg = ServeConfig(backends=[{"url": up, "model": "stub", "max_in_flight": 8}], policy="sjf", log={"path": None})
    app = build_app(cfg, predictor)
    return asgi_server(app), app.state.gateway


def test_a_request_without_prompt_text_meets_a_text_predictor_400_naming_prompt(asgi_server, stub_server, lexical):
    url, g = _gateway(asgi_server, stub_server, lexical)
    no_text = [("/v1/completions", {"prompt": [1, 2, 3]}),  # token ids
               ("/v1/chat/completions", {"messages": [{"role": "user", "content": None}]}),
               ("/v1/completions", {"prompt": "   \n "})]  # fmt: skip
    with httpx.Client(timeout=30) as c:
        for path, body in no_text:
            r = c.post(url + path, json={**body, "max_tokens": 2})
            err = r.json()["error"]
            assert (r.status_code, err["type"], err["param"], err["code"]) == (400, "invalid_request_error", "prompt", 400), r.text
            assert "lexical-gbm" in err["message"] and "reads prompt text" in err["message"]
        r = c.post(url + "/v1/completions", json={"prompt": "explain why python", "max_tokens": 2})
        assert r.status_code == 200, r.text
        r = c.post(url + "/v1/chat/completions", json={"max_tokens": 2, "messages": [
            {"role": "system", "content": "explain"}, {"role": "user", "content": None}]})  # fmt: skip
        assert r.status_code == 200, r.text  # some text in the messages: predicted
    assert (g.gw.accepted, g.predict.predicted) == (2, 2)  # the refused ones were never predicted


def test_a_predictor_that_reads_no_text_still_predicts_token_id_prompts(asgi_server, stub_server):
    reqs = [Request(id=f"r{i}", prompt_tokens=p, output_tokens=2 * p, model="stub") for i, p in enumerate([2, 8, 32, 128] * 3)]
    url, _ = _gateway(asgi_server, stub_server, LinearPrompt().fit(reqs))
    r = httpx.post(url + "/v1/completions", json={"prompt": [1, 2, 3], "max_tokens": 2}, timeout=30)
    assert r.status_code == 200, r.text


def test_the_online_learner_answers_for_the_model_it_wraps(lexical):
    from presched.predict.online import OnlineLearner

    learner = OnlineLearner(lexical, background=False)
    try:
        assert reads_text(lexical) and reads_text(learner)
        assert not reads_text(LinearPrompt())
    finally:
        learner.close()


class _FailsOnPoison(LinearPrompt):
    """Fault injection on a real predictor (linear-prompt): `predict` raises on a batch holding a
    prompt with "poison" in it. Records each call's prompts."""

    def __init__(self) -> None:
        super().__init__()
        self.batches: list[list[str]] = []

    def predict(self, requests):
        self.batches.append([r.prompt or "" for r in requests])
        bad = [r.id for r in requests if "poison" in (r.prompt or "")]
        if bad:
            raise ValueError(f"request {bad[0]!r}: this prompt cannot be read")
        return super().predict(requests)


def test_a_request_the_predictor_fails_on_fails_alone_not_its_whole_batch():
    """`PredictBatcher` with its worker thread (the batching is not in the HTTP layer): six
    requests ask in the same loop turn, one batch; the predictor raises on it; each is then
    predicted alone, and only the poisoned one gets the error (its own id in it)."""
    pred = _FailsOnPoison().fit([Request(id=f"r{i}", prompt_tokens=p, output_tokens=2 * p, model="stub")
                                 for i, p in enumerate([2, 8, 32, 128] * 3)])  # fmt: skip
    prompts = [f"ordinary {i}" for i in range(5)] + ["poison"]
    reqs = [Request(id=f"q{i}", prompt=p, prompt_tokens=4, model="stub") for i, p in enumerate(prompts)]

    async def main():
        pb = PredictBatcher(pred)
        try:
            return await asyncio.wait_for(asyncio.gather(*(pb.estimate(r) for r in reqs), return_exceptions=True), 30)
        finally:
            pb.worker.close()

    got = asyncio.run(main())
    assert pred.batches[0] == prompts and sorted(pred.batches[1:]) == sorted([p] for p in prompts)
    assert not any(isinstance(g, Exception) for g in got[:5]), got
    assert all(g.mean > 0 for g in got[:5])
    assert isinstance(got[5], ValueError) and "'q5'" in str(got[5])


def test_the_wrong_number_of_estimates_still_fails_the_batch_at_once():
    """A predictor that returns another number of estimates is broken, not one request:
    its batch fails whole, with no retries one by one."""
    calls = []

    class Short(LinearPrompt):
        def predict(self, requests):
            calls.append(len(requests))
            return LengthEstimate.from_quantiles(super().predict(requests).quantiles[1:])

    pred = Short().fit([Request(id=f"r{i}", prompt_tokens=p, output_tokens=2 * p, model="stub")
                        for i, p in enumerate([2, 8, 32, 128] * 3)])  # fmt: skip

    async def main():
        pb = PredictBatcher(pred)
        try:
            reqs = [Request(id=f"q{i}", prompt="x", prompt_tokens=4, model="stub") for i in range(3)]
            return await asyncio.wait_for(asyncio.gather(*(pb.estimate(r) for r in reqs), return_exceptions=True), 30)
        finally:
            pb.worker.close()

    got = asyncio.run(main())
    assert calls == [3] and all("2 estimates for 3 requests" in str(g) for g in got), (calls, got)
