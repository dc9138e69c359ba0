"""The `vllm_xargs` keys presched's gateways send and its engine plugin reads.

vLLM passes a request body's `vllm_xargs` object to the engine as `SamplingParams.extra_args`;
the engine plugin (`engine/plugin/seq.py`, `estimates.py`) reads these keys from it, and the
gateway (`serve/app.py`) and the endpoint picker (`epp/core.py`) write them. One list, so the
senders and the reader cannot drift apart (and no driver imports another to find them).
"""

from __future__ import annotations

QUANTILES = "presched_quantiles"  # the predicted length quantiles at LEVELS
POINT = "presched_point"  # a point prediction (tokens)
MEAN = "presched_pred_mean"  # the predicted mean length (with Q90: a log-normal)
Q90 = "presched_pred_q90"  # the predicted 90th percentile
TARGET = "presched_target"  # ORACLE ONLY: the true length (benchmarks)
TENANT = "presched_tenant"  # the fairness id
SLOS = {"slo_e2e": "presched_slo_e2e", "slo_ttft": "presched_slo_ttft"}  # Request field: key (seconds)

KEYS = frozenset({QUANTILES, POINT, MEAN, Q90, TARGET, TENANT, *SLOS.values()})


def from_client(value: object, trust: bool) -> dict:
    """A client's own `vllm_xargs` as a gateway forwards it: without `trust`, every key above
    dropped (a client must not set its own prediction, tenant, oracle length or SLOs for the
    engine's policies: the gateway or the picker sets them); other keys kept."""
    own = dict(value) if isinstance(value, dict) else {}
    return own if trust else {k: v for k, v in own.items() if k not in KEYS}


def prediction(estimate) -> dict:
    """The keys a gateway sends for its length prediction (a `RequestEstimate` row)."""
    return {MEAN: float(estimate.mean), Q90: float(estimate.quantile(0.9))}


def set_upstream(up: dict, trust: bool, add: dict) -> None:
    """`up["vllm_xargs"]`: the client's own (`from_client`) with `add` over it; left out when
    nothing remains."""
    merged = {**from_client(up.get("vllm_xargs"), trust), **add}
    if merged:
        up["vllm_xargs"] = merged
    else:
        up.pop("vllm_xargs", None)
