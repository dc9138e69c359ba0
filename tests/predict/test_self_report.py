"""`self-report` (PiA): the model's own length report, calibrated. The served model is replaced
here by a TEST DOUBLE behind real HTTP (a Starlette app on uvicorn that answers chat completions
with a rule: it "reports" 3 x the prompt's word count, or no number for prompts containing
"mute", or a 500 for "crash"); the real SmolLM2 is asked in benchmarks/self_report.py."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import kendalltau
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route

from presched.predict import PREDICTORS, load_predictor
from presched.predict.self_report import MAX_REPORT, parse_report
from presched.workload.request import Request


@pytest.mark.parametrize("text,want", [
    ("120", 120), ("About 120 words.", 120), ("1,200 words", 1200), ("I think 50 or 60", 50),
    ("one hundred", None), ("", None), (None, None), ("99999999999", MAX_REPORT),
])  # fmt: skip
def test_parse_report_golden(text, want):
    assert parse_report(text) == want


def _model_app(seen: list):
    async def chat(request):
        body = await request.json()
        text = body["messages"][0]["content"]
        seen.append(body)
        prompt = text.split("\n\nDo not answer yet.")[0]
        if "crash" in prompt:
            return JSONResponse({"error": {"message": "boom"}}, status_code=500)
        reply = "I cannot say." if "mute" in prompt else f"About {3 * len(prompt.split())} words."
        return JSONResponse({"choices": [{"message": {"role": "assistant", "content": reply}}]})

    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


def _requests(n, seed, prefix):
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        words = int(rng.integers(2, 60))
        # the true length follows the planted report (with noise), except for the mute prompts
        mute = i % 10 == 0
        length = int(max(1, np.exp(np.log(3 * words) + 0.1 * rng.normal())))
        text = ("mute " if mute else "") + " ".join(f"w{prefix}{i}x{k}" for k in range(words))
        out.append(Request(id=f"{prefix}{i}", prompt_tokens=words, prompt=text, output_tokens=length))
    return out


def test_calibrated_reports_rank_lengths_through_real_http(asgi_server, tmp_path):
    seen: list = []
    url = asgi_server(_model_app(seen))
    pred = PREDICTORS.create("self-report", base_url=url, model="m", concurrency=4)
    pred.fit(_requests(120, 0, "a"), validation=_requests(200, 1, "b"))
    test = _requests(200, 2, "t")
    est = pred.predict(test)
    y = np.array([r.output_tokens for r in test])
    told = np.array(["mute" not in r.prompt for r in test])
    assert kendalltau(est.rank_score[told], y[told]).statistic > 0.8
    assert pred.asked == 520 and pred.unparsed == 52 and pred.errors == 0
    assert seen[0]["model"] == "m" and seen[0]["temperature"] == 0.0 and seen[0]["max_tokens"] == 8
    # asked once per prompt: predicting the same requests again sends nothing
    n = len(seen)
    pred.predict(test[:10])
    assert len(seen) == n
    # the saved calibration gives the same estimates (it asks again: a new predictor has no replies)
    back = load_predictor(pred.save(tmp_path / "sr.npz"))
    np.testing.assert_allclose(back.predict(test).quantiles, est.quantiles)


def test_failed_calls_are_counted_and_get_the_unparsed_estimate(asgi_server):
    url = asgi_server(_model_app([]))
    pred = PREDICTORS.create("self-report", base_url=url, model="m").fit(
        _requests(60, 0, "a"), validation=_requests(60, 1, "b"))  # fmt: skip
    mute, crash = (Request(id=k, prompt_tokens=3, prompt=f"{k} a b") for k in ("mute", "crash"))
    est = pred.predict([mute, crash])
    assert pred.errors == 1
    np.testing.assert_allclose(est.quantiles[0], est.quantiles[1])


def test_bad_params_and_input_are_clear_errors():
    with pytest.raises(ValueError, match="max_tokens"):
        PREDICTORS.create("self-report", max_tokens=0)
    with pytest.raises(ValueError, match="unknown parameter"):
        PREDICTORS.create("self-report", base_ulr="x")
    for alpha in (0, -1000, True):  # a singular ridge, or one that inverts the ranking
        with pytest.raises(ValueError, match="self-report: parameter 'alpha'"):
            PREDICTORS.create("self-report", alpha=alpha)
    with pytest.raises(ValueError, match="set base_url and model"):
        PREDICTORS.create("self-report").reports([Request(id="x", prompt_tokens=1, prompt="hi")])
    down = PREDICTORS.create("self-report", base_url="http://127.0.0.1:9", model="m", timeout_s=5.0)
    # 4 fit prompts + 1 calibration prompt, each refused
    with pytest.raises(ValueError, match=r"no reply from http://127.0.0.1:9 \(5 calls failed; last: ConnectError"):
        down.fit([Request(id=str(i), prompt_tokens=1, prompt=f"p{i}", output_tokens=5 + i) for i in range(4)],
                 validation=[Request(id="v", prompt_tokens=1, prompt="v", output_tokens=9)])  # fmt: skip
    with pytest.raises(ValueError, match="'prompt' is empty"):
        PREDICTORS.create("self-report", base_url="http://127.0.0.1:9", model="m").reports(
            [Request(id="x", prompt_tokens=1)])  # fmt: skip


def test_a_failed_call_is_asked_again_and_an_unparsed_reply_stays_inside_the_data(asgi_server, monkeypatch):
    """A model that always gives a number left no unparsed fit row: a failed call's row sat at
    log(1 + r) = 0 and got a q95 of ~79,000 tokens, and the failure was cached for good."""
    import presched.predict.self_report as sr

    seen: list = []
    url = asgi_server(_model_app(seen))
    told = [r for r in _requests(200, 0, "a") if "mute" not in r.prompt]
    pred = PREDICTORS.create("self-report", base_url=url, model="m").fit(told[:120], validation=told[120:])
    assert pred.unparsed == 0 and pred.impute > 2.0  # the mean log(1 + r) of the fit rows
    fitted = pred.predict(told[:120]).quantiles
    crash = Request(id="c", prompt_tokens=3, prompt="crash a b")
    for _ in range(2):
        q = pred.predict([crash]).quantiles[0]
        assert fitted[:, 0].min() <= q[0] and q[-1] <= fitted[:, -1].max()
    assert sum("crash" in b["messages"][0]["content"] for b in seen) == 2  # not cached: asked again
    assert pred.errors == 2
    monkeypatch.setattr(sr, "MAX_CACHED", 5)
    pred.predict(_requests(12, 5, "n"))
    assert len(pred._replies) == 5  # bounded: the newest prompts kept
