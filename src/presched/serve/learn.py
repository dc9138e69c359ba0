"""The gateway's side of online learning (`presched serve --learn`, `learn:` in the config).

    learner = make_learner(cfg, predictor)      # who: `serve.cli.load_parts`; resumes learn.state_dir
    fields = learn_fields(learner, seq, out)    # who: `GatewayApp._end`, once per request: teaches
                                                # the learner, returns the log row's learning columns

`learn_fields` maps what happened to a request to what it teaches: a 200 with usage is a label
(`ok`), or a lower bound when the engine cut it (`log_read.is_censored`: finish_reason
`length`, max_tokens or the context window, or `repetition`, vLLM's repetition detector; an
unknown finish_reason at max_tokens too); anything else (an error, a client that left, no usage) teaches nothing. It runs on
the event loop and costs one `OnlineLearner.observe` (tens of microseconds); refits run on the
learner's own thread. `LearnCollector` exports the learner's state in /metrics:
`presched_predictor_version`, `presched_drift_alarm` (1 while raised), `presched_drift_statistic`
(>= 1 raises it), `presched_drift_alarms` and `presched_learn_completions{kind}`.
"""

from __future__ import annotations

from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from presched.predict.online import OnlineLearner
from presched.serve.config import ServeConfig
from presched.serve.log_read import is_censored


def make_learner(cfg: ServeConfig, predictor: Any) -> OnlineLearner | None:
    c = cfg.learn
    if not c.enabled:
        return None
    if predictor is None:
        raise ValueError("learn: online learning needs a predictor (--predictor MODEL.npz)")
    anchor = []
    if c.anchor_data is not None:
        from presched.workload.loaders.generic import load_generic

        anchor = load_generic(c.anchor_data)
    if c.state_dir is not None:
        resumed = OnlineLearner.resume(c.state_dir, c, anchor)
        if resumed is not None:
            return resumed
    return OnlineLearner(predictor, c, anchor)


def learn_fields(learner: OnlineLearner | None, seq: Any, out: Any) -> dict[str, Any]:
    """Teach `learner` the request's outcome; the log row's `predictor_version` and
    `drift_alarm` (None without a learner)."""
    if learner is None:
        return {}
    version = learner.version_of(seq.id)
    if out.status == 200 and out.tokens:
        status = "length" if is_censored(out.finish_reason, out.tokens, seq.request.max_tokens) else "ok"
        learner.observe(seq.request, out.tokens, status=status)
    else:
        learner.observe(seq.request, None, status="cancelled" if out.status == 499 else "failed")
    return {"predictor_version": version, "drift_alarm": int(learner.alarm.active)}


class LearnCollector:
    """Gauges and counters read from the learner at scrape time."""

    def __init__(self, learner: OnlineLearner) -> None:
        self.learner = learner

    def collect(self):
        s = self.learner.status()
        for name, key, text in (("predictor_version", "predictor_version", "Version of the length predictor in use (1 = as loaded; +1 per refit)."),
                                ("drift_alarm", "drift_alarm", "1 while the drift alarm is raised (recent completions not distributed as predicted)."),
                                ("drift_statistic", "drift_statistic", "CUSUM statistic of the drift alarm over its threshold (>= 1 raises it).")):  # fmt: skip
            g = GaugeMetricFamily(f"presched_{name}", text)
            g.add_metric([], float(s[key]))
            yield g
        yield CounterMetricFamily("presched_drift_alarms", "Drift alarms raised.", value=s["drift_alarms"])
        c = CounterMetricFamily("presched_learn_completions", "Completions the learner saw, by what it "
                                "did with them (learned, censored, ignored, capped; stale and unpredicted are learned ones "
                                "whose prediction could not be scored; refits ...).", labels=["kind"])  # fmt: skip
        for kind in ("learned", "censored", "ignored", "capped", "stale", "unpredicted", "refits", "refit_failed",
                     "refit_discarded"):
            c.add_metric([kind], float(s.get(kind, 0)))
        yield c
