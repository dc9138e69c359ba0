"""`self-report`: ask the served model itself how long its answer will be (PiA).

    pred = PREDICTORS.create("self-report", base_url="http://127.0.0.1:8100", model="smollm2-135m")
    pred.fit(train_requests, validation=calibration_requests)
    est = pred.predict(requests)                         # one chat completion per new prompt

For each request, one greedy chat completion on the served model's OpenAI API (`/v1/chat/
completions`, `max_tokens` short) with the request's prompt and `question` after it, e.g. "...
How many words will your answer have? Reply with one number only." The first integer of the
reply is the model's own estimate r (`parse_report`; none: the reply is "unparsed"). The raw
number is not trusted as a length: it is calibrated like every presched predictor, features
[log(1 + r), 1 if parsed] -> `RidgeHead` (ridge on log length, a ridge on the residual for the
spread, split-conformal quantiles on `validation`), so an unparsed reply gets the fitted mean of
unparsed ones and a model that always answers "100" ranks nothing (its tau-b is 0, honestly).

An unparsed reply's log(1 + r) is imputed with the mean over the parsed fit rows (saved with
the model): a model that always gives a number leaves no unparsed row to fit, and a 0 there put
the row far outside the data (a q95 of 79,000 tokens).

Cost: a model call per prompt before the request can be ordered (replies cached by prompt text
within the predictor, the newest MAX_CACHED); calls run `concurrency` at a time with `timeout_s`
each. A call that fails (HTTP error, timeout, bad JSON) counts as unparsed for that prediction,
is counted in `errors`, and is not cached: the prompt is asked again next time. `asked`,
`unparsed` count the rest. Needs httpx (the `serve` extra).
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from presched.predict.base import PREDICTORS, Predictor, checked_params
from presched.predict.estimate import LEVELS, LengthEstimate
from presched.predict.probe.predictor import RidgeHead, check_alpha, check_sigma_floor
from presched.predict.text_gbm import fit_and_calibration
from presched.workload.request import Request

QUESTION = ("\n\nDo not answer yet. How many words will your answer to this have? "
            "Reply with one number only.")  # fmt: skip
DEFAULTS: dict[str, Any] = {"base_url": None, "model": None, "question": QUESTION, "max_tokens": 8,
                            "timeout_s": 60.0, "concurrency": 8, "alpha": 1.0, "sigma_floor": 0.05,
                            "calib_frac": 0.2, "seed": 0}  # fmt: skip
MAX_REPORT = 1_000_000
MAX_CACHED = 10_000
"""Replies kept (by prompt text, least recently used dropped first): a gateway sees new prompts forever."""
_FAILED = object()  # a call that got no reply: not cached
_INT = re.compile(r"\d[\d,]*")
_MED = LEVELS.index(0.5)


def parse_report(text: str | None) -> int | None:
    """The first integer in a reply ("About 120 words." -> 120, "1,200" -> 1200), capped at
    MAX_REPORT; None when there is none."""
    if not text:
        return None
    m = _INT.search(text)
    if m is None:
        return None
    digits = m.group(0).replace(",", "")
    return min(int(digits[:7]), MAX_REPORT)


@PREDICTORS.register("self-report")
class SelfReport(Predictor):
    """PiA: the served model's own answer to "how long will your answer be?", calibrated."""

    name = "self-report"
    needs_serving_model = True  # needs a live model: left out of text-only evaluations
    needs_text = True  # it asks the model about the prompt's text

    def __init__(self, **params: Any) -> None:
        super().__init__(**checked_params(self.name, DEFAULTS, params, nullable=("base_url", "model")))
        p = self.params
        if not 1 <= int(p["max_tokens"]) <= 256 or not 1 <= int(p["concurrency"]) <= 64:
            raise ValueError("self-report: max_tokens must be in 1..256 and concurrency in 1..64")
        if not 0 < float(p["timeout_s"]) <= 3600:
            raise ValueError("self-report: timeout_s must be in (0, 3600]")
        check_sigma_floor(self.name, p["sigma_floor"])
        check_alpha(self.name, p["alpha"])
        self._replies: OrderedDict[str, int | None] = OrderedDict()
        self.impute = 0.0  # log(1 + r) given to an unparsed reply: the parsed fit rows' mean
        self.asked = self.unparsed = self.errors = 0
        self.last_error: str | None = None

    # --- the model's own report ---------------------------------------------------------------
    def reports(self, requests: Sequence[Request]) -> list[int | None]:
        """The parsed report of each request's prompt (asked once per distinct prompt)."""
        p = self.params
        if p["base_url"] is None or p["model"] is None:
            raise ValueError("self-report: set base_url and model (the served model to ask)")
        for r in requests:
            if not r.prompt:
                raise ValueError(f"request {r.id!r}: field 'prompt' is empty; self-report asks the model about the text")
        cache, got, prompts = self._replies, {}, {r.prompt for r in requests}
        for prompt in prompts & cache.keys():
            cache.move_to_end(prompt)
            got[prompt] = cache[prompt]
        todo = sorted(prompts - got.keys())
        if todo:
            import httpx

            with httpx.Client(base_url=p["base_url"].rstrip("/"), timeout=float(p["timeout_s"])) as client:
                with ThreadPoolExecutor(int(p["concurrency"])) as pool:
                    for prompt, rep in zip(todo, pool.map(lambda t: self._ask(client, t), todo)):
                        got[prompt] = None if rep is _FAILED else rep
                        if rep is not _FAILED:
                            cache[prompt] = rep
            while len(cache) > MAX_CACHED:
                cache.popitem(last=False)
        return [got[r.prompt] for r in requests]

    def _ask(self, client, prompt: str) -> Any:
        """The parsed report (None: the reply held no number), or _FAILED when no reply came."""
        p = self.params
        body = {"model": p["model"], "max_tokens": int(p["max_tokens"]), "temperature": 0.0,
                "messages": [{"role": "user", "content": prompt + p["question"]}]}  # fmt: skip
        try:
            r = client.post("/v1/chat/completions", json=body)
            r.raise_for_status()
            text = r.json()["choices"][0]["message"]["content"]
        except Exception as e:  # noqa: BLE001 - counted; the request then gets the unparsed estimate
            self.errors += 1
            self.last_error = f"{type(e).__name__}: {e}"
            return _FAILED
        self.asked += 1
        rep = parse_report(text)
        self.unparsed += rep is None
        return rep

    def features(self, reports: Sequence[int | None]) -> np.ndarray:
        """[log(1 + r), 1] per parsed report, [impute, 0] per unparsed one."""
        return np.array([[np.log1p(r) if r is not None else self.impute, float(r is not None)]
                         for r in reports])  # fmt: skip

    # --- fit / predict ------------------------------------------------------------------------
    def fit(self, requests: Sequence[Request], validation: Sequence[Request] | None = None) -> "SelfReport":
        p = self.params
        reqs, y, cal, y_cal = fit_and_calibration(requests, validation, p["calib_frac"], p["seed"])
        fit_reports, cal_reports = self.reports(reqs), self.reports(cal)
        parsed = [np.log1p(r) for r in fit_reports if r is not None]
        self.impute = float(np.mean(parsed)) if parsed else 0.0
        X, X_cal = self.features(fit_reports), self.features(cal_reports)
        if self.asked == 0:  # nothing to calibrate: the server is down or not an OpenAI API
            raise ValueError(f"self-report: no reply from {p['base_url']} ({self.errors} calls failed; "
                             f"last: {self.last_error})")  # fmt: skip
        self.head = RidgeHead(p["alpha"], p["sigma_floor"]).fit(X, y, X_cal, y_cal)
        self.fitted = True
        return self

    def predict(self, requests: Sequence[Request]) -> LengthEstimate:
        self.check_fitted()
        if len(requests) == 0:
            raise ValueError("requests: empty")
        q, mu = self.head.quantiles(self.features(self.reports(requests)))
        return LengthEstimate(q, q[:, _MED], mu)

    def state(self) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
        arrays, values = self.head.state()
        return arrays, {**values, "impute": self.impute}

    @classmethod
    def from_state(cls, params: dict[str, Any], arrays: dict[str, np.ndarray], values: dict[str, Any]) -> "SelfReport":
        pred = cls(**params)
        pred.head = RidgeHead.from_state(pred.params["alpha"], pred.params["sigma_floor"], arrays, values)
        pred.impute = float(values.get("impute", 0.0))  # files from before 2026-12-07: 0, as then
        pred.fitted = True
        return pred
