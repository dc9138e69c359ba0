"""Prometheus metrics of the gateway (`GET /metrics`).

Per request (updated when it ends): `presched_requests_total{tenant,status}`, histograms of
`presched_e2e_seconds`, `presched_ttft_seconds`, `presched_queue_wait_seconds` (gateway queue
only), `presched_output_tokens_total`, `presched_prompt_tokens_total`. Per HTTP response (refusals
too; counted by `serve.guard`): `presched_http_responses_total{endpoint,status}`, and
`presched_unhandled_errors_total`. Read at scrape time from
the gateway: `presched_waiting{backend}`, `presched_running{backend}`, `presched_backend_up`,
`presched_policy_errors_total` (policy hooks that raised at run time; see docs/gateway.md),
and the rolling prediction error of the last completed requests (`ErrorTracker`, the numbers
the `fallback` policy acts on): `presched_predictor_mae_tokens`, `..._rel_mae`,
`..._kendall_tau`, `..._discordance`, `..._coverage_q50`, `..._coverage_q90`, `..._samples`;
`presched_predictor_unknown_model_total{model}`: requests predicted for a served model the
predictor was not fitted on (it used its fallback; `serve.predictions`). The process's live heap
(`serve.memory.heap`): `presched_python_allocated_blocks`, and on glibc
`presched_malloc_in_use_bytes`, `presched_malloc_free_bytes`.
"""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client import disable_created_metrics
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from presched.serve.memory import heap

disable_created_metrics()  # no *_created series: counters and histograms only

_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320)


class GatewayMetrics:
    def __init__(self, gateway, predict=None) -> None:
        self.gw = gateway
        self.registry = r = CollectorRegistry()
        self.requests = Counter("presched_requests", "Requests that ended, by tenant and HTTP status.",
                                ["tenant", "status"], registry=r)  # fmt: skip
        self.e2e = Histogram("presched_e2e_seconds", "End-to-end latency at the gateway.",
                             buckets=_BUCKETS, registry=r)  # fmt: skip
        self.ttft = Histogram("presched_ttft_seconds", "Time to first token at the gateway.",
                              buckets=_BUCKETS, registry=r)  # fmt: skip
        self.wait = Histogram("presched_queue_wait_seconds", "Time in the gateway queue.",
                              buckets=_BUCKETS, registry=r)  # fmt: skip
        self.out_tokens = Counter("presched_output_tokens", "Output tokens (engine usage).", registry=r)
        self.in_tokens = Counter("presched_prompt_tokens", "Prompt tokens (gateway count).", registry=r)
        self.responses = Counter("presched_http_responses", "Every HTTP response of the gateway (refusals "
                                 "too), by endpoint and status; 499: the client left before any.",
                                 ["endpoint", "status"], registry=r)  # fmt: skip
        self.unhandled = Counter("presched_unhandled_errors", "Exceptions no endpoint handled "
                                 "(answered 500 and logged: a gateway bug).", registry=r)  # fmt: skip
        r.register(_Live(gateway, predict))

    def observe(self, seq, status: int) -> None:
        self.requests.labels(seq.tenant, str(status)).inc()
        self.in_tokens.inc(seq.prompt_tokens)
        if status != 200 or seq.finish is None:
            return
        self.e2e.observe(seq.finish - seq.arrival)
        if seq.first_token is not None:
            self.ttft.observe(seq.first_token - seq.arrival)
        if seq.first_scheduled is not None:
            self.wait.observe(seq.first_scheduled - seq.arrival)
        self.out_tokens.inc(seq.generated)

    def render(self) -> bytes:
        return generate_latest(self.registry)


_HEAP_HELP = {
    "python_allocated_blocks": "Memory blocks live Python objects hold (sys.getallocatedblocks): "
    "the live heap, which falls back after a backlog drains while resident memory stays high.",
    "malloc_in_use_bytes": "Bytes glibc malloc has handed out (mallinfo2 uordblks + hblkhd).",
    "malloc_free_bytes": "Bytes glibc malloc holds free, not returned to the OS (mallinfo2 fordblks).",
}


class _Live:
    """Gauges read from the gateway at scrape time."""

    def __init__(self, gateway, predict=None) -> None:
        self.gw = gateway
        self.predict = predict  # serve.predictions.PredictBatcher, or None without a predictor

    def collect(self):
        waiting = GaugeMetricFamily("presched_waiting", "Requests in the gateway queue.", labels=["backend"])
        running = GaugeMetricFamily("presched_running", "Requests sent to the backend, unfinished.", labels=["backend"])
        up = GaugeMetricFamily("presched_backend_up", "1 if the backend passed its last health check.", labels=["backend"])
        for b in self.gw.backends:
            waiting.add_metric([b.name], b.num_waiting)
            running.add_metric([b.name], b.num_running)
            up.add_metric([b.name], 1.0 if b.healthy else 0.0)
        yield from (waiting, running, up)
        yield CounterMetricFamily("presched_policy_errors", "Scheduling-policy hooks that raised "
                                  "at run time (the request concerned was failed with a 500).",
                                  value=self.gw.policy_errors)  # fmt: skip
        for name, value in heap().items():
            yield GaugeMetricFamily(f"presched_{name}", _HEAP_HELP[name], value=value)
        for name, value in self.gw.tracker.snapshot().items():
            g = GaugeMetricFamily(f"presched_predictor_{name}",
                                  f"Length prediction {name} over the last completed requests (NaN before any).")  # fmt: skip
            g.add_metric([], value if value is not None else math.nan)
            yield g
        if self.predict is not None and self.predict.known is not None:
            c = CounterMetricFamily("presched_predictor_unknown_model", "Requests predicted for a served "
                                    "model the predictor was not fitted on (it used its fallback; at most "
                                    "32 model names, the rest as 'other').", labels=["model"])  # fmt: skip
            for model, n in sorted(self.predict.unknown_models.items()):
                c.add_metric([model], n)
            yield c
