"""`EppConfig`: everything `presched epp` needs (a YAML/JSON file and flags).

    endpoints:                      # or endpoints_file: pool.yaml (re-read when it changes)
      - {address: 10.0.0.11:8000, model: tiny, max_in_flight: 8}
      - {address: 10.0.0.12:8000, model: tiny, max_in_flight: 8}
    mode: queue                     # hold requests in the picker (GIE flow control) or passthrough
    policy: sjf
    router: least-work
    predictor: model.npz
    tenants: [{name: team-a, weight: 2}]   # fairness ids (x-gateway-inference-fairness-id)

The decisions are `presched serve`'s: `gateway_config()` turns this config into the
`ServeConfig` the shared `Gateway` runs on (endpoints become its backends, `http://ADDRESS`).
"""

from __future__ import annotations

import ipaddress
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from presched.config import Config
from presched.epp.envoy import answer_limit
from presched.schedule.params import validate_params
from presched.schedule.registry import POLICIES
from presched.schedule.routers import ROUTERS
from presched.serve.config import BackendConfig, LogConfig, ServeConfig, TenantConfig

MAX_GRPC_MESSAGE = 2**31 - 1  # grpc.max_*_message_length is a C int
_HEADER = re.compile(r"^[a-z0-9!#$%&'*+.^_`|~-]+$")  # an HTTP field name (RFC 9110 token), lower case


def check_address(v: str) -> str:
    """`ip:port` (IPv4, or [IPv6]:port) as GIE's destination header carries it."""
    host, sep, port = v.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"expected ip:port, got {v!r}")
    try:
        ip = ipaddress.ip_address(host[1:-1] if host.startswith("[") else host)
    except ValueError:
        raise ValueError(f"expected an IP address before the port (GIE endpoints are pod IPs), got {host!r}") from None
    if ip.version == 6 and not host.startswith("["):
        raise ValueError(f"write an IPv6 endpoint as [addr]:port, got {v!r}")
    return v


class EndpointConfig(Config):
    address: str = Field(..., description="The model server as ip:port (a pod IP in Kubernetes); the value of x-gateway-destination-endpoint.")
    model: str | None = Field(None, description="Model name it serves (default: asked from its /v1/models at start).")
    max_in_flight: int = Field(16, ge=1, description="Most requests the picker lets run on it at once in queue mode (set it to the engine's max_num_seqs or below).")
    kv_tokens: int | None = Field(None, ge=1, description="The engine's KV capacity in tokens, for KV-aware policies.")

    _address = field_validator("address")(classmethod(lambda cls, v: check_address(v)))


class FairnessTenant(Config):
    name: str = Field(..., min_length=1, max_length=128, description="A fairness id as sent in the fairness header.")
    weight: float = Field(1.0, gt=0, le=1e6, allow_inf_nan=False, description="Share for fair policies (vtc) and of the queue.")


class Objective(Config):
    name: str = Field(..., min_length=1, max_length=253, description="The InferenceObjective's name, as sent in the objective header.")
    ttft_s: float | None = Field(None, gt=0, allow_inf_nan=False, description="Time-to-first-token target of its requests (seconds), read by the `slo` policy.")
    tpot_s: float | None = Field(None, gt=0, allow_inf_nan=False, description="Time-per-output-token target (seconds).")
    e2e_s: float | None = Field(None, gt=0, allow_inf_nan=False, description="End-to-end latency target (seconds), read by the `slo` policy.")


class EppConfig(Config):
    host: str = Field("127.0.0.1", description="Address the ext_proc gRPC server listens on (0.0.0.0 in a pod).")
    port: int = Field(9002, ge=0, le=65535, description="Port of the ext_proc gRPC server (GIE's default is 9002); gRPC health is served on it too.")
    endpoints: list[EndpointConfig] = Field(default_factory=list, description="The model servers of the pool (or endpoints_file).")
    endpoints_file: Path | None = Field(None, description="YAML/JSON file with `endpoints: [...]`, re-read when it changes (endpoints removed from it stop getting requests; added ones start).")
    mode: Literal["queue", "passthrough"] = Field("queue", description="'queue': hold each request in the picker until its endpoint has a free slot, then release in policy order (GIE flow control). 'passthrough': pick at once and send the prediction as vLLM `priority`.")
    policy: str = Field("fcfs", description="Order of each endpoint's queue: " + ", ".join(POLICIES.names()) + ".")
    policy_params: dict[str, Any] = Field(default_factory=dict, description="Parameters of the policy.")
    router: str = Field("least-work", description="Which endpoint gets a request: " + ", ".join(ROUTERS.names()) + ".")
    router_params: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the router.")
    predictor: Path | None = Field(None, description="Length predictor file from `presched train` (.npz).")
    tokenizer: Path | None = Field(None, description="A tokenizer.json to count prompt tokens exactly (default: o200k_base or ~4 characters per token).")
    inline_predict_ms: float = Field(0.5, ge=0, description="A predictor whose calls take at most this many ms (moving average of the measured calls) predicts an idle picker's request at once on the event loop instead of in the worker thread, whose hand-off costs more (~0.7 ms on a busy machine); 0 = always the worker thread (calls batched).")
    send_prediction: bool = Field(True, description="Pass the prediction to the engine: header x-presched-predicted-tokens and vllm_xargs presched_pred_mean / presched_pred_q90 in the body; also the request's objective targets (presched_slo_ttft / presched_slo_e2e) and its fairness id (presched_tenant, unless 'default'), which the engine plugin's policies read.")
    trust_client_xargs: bool = Field(False, description="Forward the presched keys of a client's own vllm_xargs (presched_quantiles, presched_point, presched_pred_mean / _q90, presched_target, presched_tenant, presched_slo_*) to the engine. Off: they are dropped, so a client cannot set its own prediction, tenant or SLOs for the engine plugin's policies; other vllm_xargs keys always pass. Turn on only for trusted clients (a benchmark sending oracle lengths).")
    tenants: list[FairnessTenant] = Field(default_factory=list, description="Fairness ids with weights; an id not listed shares the rest of the queue with weight 1.")
    objectives: list[Objective] = Field(default_factory=list, description="Inference objectives: a request naming one in the objective header gets its latency targets (policy `slo` orders by them); a name not listed is refused (400).")
    max_queue: int = Field(10_000, ge=1, le=10_000_000, description="Most requests held in the picker; more get 429. Each tenant may fill only its share.")
    max_prompt_tokens: int = Field(32_768, ge=1, description="Longer prompts get 413.")
    max_body_bytes: int = Field(8 * 2**20, ge=1024, le=2**30, description="At most 1 GiB (gRPC message sizes are C ints: this plus 1 MiB plus max_event_bytes must stay under 2 GiB). Larger request bodies get 413 (in 'buffered' mode from Envoy itself: the Envoy of `presched epp --envoy-port` sets its buffer limit to this; the picker accepts gRPC messages of this size plus 1 MiB).")
    envoy_body_mode: Literal["buffered", "full-duplex"] = Field("buffered", description="How the Envoy of `presched epp --envoy-port` sends bodies over ext_proc (epp/envoy.py BODY_MODES): 'buffered': the request body BUFFERED (one message; trailers SKIP), the response STREAMED: fewer messages per request; 'full-duplex': GIE's standard FULL_DUPLEX_STREAMED both ways (request trailers SEND). The picker answers in the mode Envoy announces in each stream's protocol_config, so a gateway configured either way works; this mode is assumed when Envoy announces none.")
    max_event_bytes: int = Field(2**20, ge=1024, le=2**30, description="Largest server-sent event of a streamed response (up to its blank line), which the picker holds whole to read it; a stream with a larger one ends with an error event (502) and is logged as failed, as `presched serve` does. gRPC messages to Envoy may carry this much more than a body.")
    max_response_bytes: int = Field(64 * 2**20, ge=1024, description="A non-streaming response larger than this is passed on but not parsed for usage.")
    fallbacks: int = Field(2, ge=0, le=16, description="Fallback endpoints listed after the primary in the destination header and the envoy.lb metadata (GIE's fallback list); the Envoy that `presched epp --envoy-port` runs retries that many times, each to the next listed endpoint.")
    drain_s: float = Field(5.0, ge=0, le=300, description="On SIGTERM / Ctrl-C, `presched epp` first reports readiness and the ExternalProcessor health service NOT_SERVING and keeps taking new requests this many seconds (so that the gateway's health checks and Kubernetes take the picker out of rotation first), then stops taking them and gives streams in flight 30 s; 0: stop at once.")
    health_interval_s: float = Field(2.0, gt=0, description="Seconds between health checks (GET /health) of each endpoint.")
    connect_timeout_s: float = Field(2.0, gt=0, description="Timeout of a health check.")
    destination_header: str = Field("x-gateway-destination-endpoint", description="The header (and envoy.lb metadata key) that names the picked endpoint.")
    fairness_header: str = Field("x-gateway-inference-fairness-id", description="The header naming the request's tenant (fairness id).")
    objective_header: str = Field("x-gateway-inference-objective", description="The header naming the request's inference objective.")
    prediction_header: str = Field("x-presched-predicted-tokens", description="The header that carries the predicted output tokens to the engine.")
    log: LogConfig = Field(default_factory=lambda: LogConfig(path=Path("presched-epp-requests.sqlite")), description="The request log (same format as `presched serve`'s).")

    @field_validator("policy")
    @classmethod
    def _policy_known(cls, v: str) -> str:
        if v not in POLICIES:
            raise ValueError(f"unknown policy {v!r}; known: {', '.join(POLICIES.names())}")
        return v

    @field_validator("policy_params")
    @classmethod
    def _policy_params_valid(cls, v: dict[str, Any], info) -> dict[str, Any]:
        if "policy" in info.data:
            validate_params(info.data["policy"], v)
        return v

    @field_validator("router")
    @classmethod
    def _router_known(cls, v: str) -> str:
        if v not in ROUTERS:
            raise ValueError(f"unknown router {v!r}; known: {', '.join(ROUTERS.names())}")
        return v

    @field_validator("destination_header", "fairness_header", "objective_header", "prediction_header")
    @classmethod
    def _header_name(cls, v: str) -> str:
        if not _HEADER.match(v):
            raise ValueError(f"not a lower-case HTTP header name: {v!r}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "EppConfig":
        if not self.endpoints and self.endpoints_file is None:
            raise ValueError("endpoints: at least one endpoint (or endpoints_file) is required")
        addrs = [e.address for e in self.endpoints]
        if len(set(addrs)) != len(addrs):
            raise ValueError("endpoints: an address is listed twice")
        if answer_limit(self.max_body_bytes, self.max_event_bytes) > MAX_GRPC_MESSAGE:
            raise ValueError(f"max_body_bytes: {self.max_body_bytes} plus 1 MiB plus max_event_bytes "
                             f"({self.max_event_bytes}) must stay under 2 GiB (gRPC's largest message)")  # fmt: skip
        names = [t.name for t in self.tenants]
        if len(set(names)) != len(names):
            raise ValueError("tenants: two tenants share a name")
        names = [o.name for o in self.objectives]
        if len(set(names)) != len(names):
            raise ValueError("objectives: two objectives share a name")
        return self

    def gateway_config(self, endpoints: list[EndpointConfig] | None = None) -> ServeConfig:
        """The `ServeConfig` of the shared decision core. Tenants are named by a header, not an
        API key: the `api_key` each `TenantConfig` needs is never read by the picker."""
        eps = self.endpoints if endpoints is None else endpoints
        return ServeConfig(
            backends=[BackendConfig(url=f"http://{e.address}", name=e.address, model=e.model,
                                    max_in_flight=e.max_in_flight, kv_tokens=e.kv_tokens) for e in eps],
            mode=self.mode, policy=self.policy, policy_params=self.policy_params, router=self.router,
            router_params=self.router_params, predictor=self.predictor, tokenizer=self.tokenizer,
            tenants=[TenantConfig(name=t.name, api_key=f"unused:{t.name}", weight=t.weight) for t in self.tenants],
            max_queue=self.max_queue, max_prompt_tokens=self.max_prompt_tokens, retries=self.fallbacks,
            send_prediction=self.send_prediction, trust_client_xargs=self.trust_client_xargs,
            health_interval_s=self.health_interval_s,
            max_event_bytes=self.max_event_bytes, log=self.log,
        )  # fmt: skip
