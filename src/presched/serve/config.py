"""`ServeConfig`: everything `presched serve` needs, from a YAML/JSON file and flags.

    backends:
      - {url: http://127.0.0.1:8001, model: tiny, max_in_flight: 8}
      - {url: http://127.0.0.1:8002, model: tiny, max_in_flight: 8}
    mode: queue                 # or passthrough
    policy: sjf                 # any registered policy; policy_params: {...}
    router: least-requests
    predictor: model.npz        # a file from `presched train`; omit for none
    tenants:
      - {name: gold, api_key: sk-gold, weight: 2}
      - {name: free, api_key: sk-free, rate_limit_rps: 5}
    log: {path: presched-requests.sqlite}
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from presched.config import Config
from presched.predict.online.config import OnlineConfig
from presched.schedule.params import validate_params
from presched.schedule.registry import POLICIES
from presched.schedule.routers import ROUTERS


class BackendConfig(Config):
    url: str = Field(..., description="Base URL of an OpenAI-compatible engine (e.g. http://127.0.0.1:8000), without /v1.")
    model: str | None = Field(None, description="Model name the backend serves (default: asked from its /v1/models at start).")
    name: str | None = Field(None, description="Label in metrics and the log (default: the URL).")
    max_in_flight: int = Field(16, ge=1, description="Most requests the gateway sends to this backend at once in queue mode. Set it to the engine's max_num_seqs (or below) so the gateway's order is the order that runs.")
    kv_tokens: int | None = Field(None, ge=1, description="The engine's KV capacity in tokens, for KV-aware policies (kv-admission); unknown if unset.")

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        if not v.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return v.rstrip("/").removesuffix("/v1")


class TenantConfig(Config):
    name: str = Field(..., min_length=1, description="Tenant name (log, metrics, fair share).")
    api_key: str = Field(..., min_length=1, description="The API key (Authorization: Bearer KEY) that identifies this tenant.")
    weight: float = Field(1.0, gt=0, le=1e6, allow_inf_nan=False, description="Share for fair policies (vtc): a tenant with weight 2 gets twice the service of one with weight 1 when both wait.")
    rate_limit_rps: float | None = Field(None, ge=1e-3, le=1e6, allow_inf_nan=False, description="Most requests per second this tenant may start (token bucket); more get 429.")
    burst: int | None = Field(None, ge=1, le=1_000_000, description="Bucket size of the rate limit (default: max(1, rate_limit_rps)).")


class LogConfig(Config):
    path: Path | None = Field(Path("presched-requests.sqlite"), description="SQLite file with one row per accepted request (prediction, true tokens, timings); null disables it.")
    store_prompts: bool = Field(False, description="Also store the prompt text (needed by `presched train --from-log` for text predictors).")


class ServeConfig(Config):
    host: str = Field("127.0.0.1", description="Address the gateway listens on.")
    port: int = Field(8080, ge=0, le=65535, description="Port the gateway listens on.")
    backends: list[BackendConfig] = Field(..., min_length=1, description="Engines behind the gateway.")
    mode: Literal["queue", "passthrough"] = Field("queue", description="'queue': hold requests in the gateway and release them in policy order, at most max_in_flight per backend. 'passthrough': send at once with a vLLM `priority` from the prediction (needs --scheduling-policy priority on the engine).")
    policy: str = Field("fcfs", description="Order of the gateway queue (queue mode): " + ", ".join(POLICIES.names()) + ".")
    policy_params: dict[str, Any] = Field(default_factory=dict, description="Parameters of the policy, checked by its model (`presched config --policy NAME` lists them).")
    router: str = Field("least-requests", description="Which backend gets a request: " + ", ".join(ROUTERS.names()) + ".")
    router_params: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments of the router.")
    predictor: Path | None = Field(None, description="Length predictor file from `presched train` (.npz); none: policies that need predictions cannot be used.")
    tokenizer: Path | None = Field(None, description="A tokenizer.json of the served model to count prompt tokens exactly (default: o200k_base if toktok is installed, else ~4 characters per token).")
    priority_stat: str = Field("mean", description="Passthrough mode: the statistic of the predicted length sent as vLLM `priority` (mean, median, q90, ...; lower runs first).")
    send_prediction: bool = Field(False, description="Add the prediction to the upstream body as vllm_xargs (presched_pred_mean, presched_pred_q90), and the request's tenant (presched_tenant, unless 'default'), for engine-side plug-ins.")
    trust_client_xargs: bool = Field(False, description="Forward the presched keys of a client's own vllm_xargs (presched_quantiles, presched_point, presched_pred_mean / _q90, presched_target, presched_tenant, presched_slo_*) to the engine. Off: they are dropped, so a client cannot set its own prediction, tenant or SLOs for the engine plugin's policies; other vllm_xargs keys always pass. Turn on only for trusted clients (a benchmark sending oracle lengths).")
    tenants: list[TenantConfig] = Field(default_factory=list, description="API keys and their tenants. Empty: no authentication, every request is tenant 'default'.")
    max_queue: int = Field(10_000, ge=1, le=10_000_000, description="Most requests waiting in the gateway; more get 429 with Retry-After. With tenants, each tenant may fill only its share, max_queue * weight / (sum of weights) (docs/gateway.md, Queue shares).")
    max_prompt_tokens: int = Field(32_768, ge=1, description="Longer prompts get 413.")
    prefix_block_tokens: int = Field(16, ge=1, description="Tokens per hashed block of a prompt, for routers that read block hashes (prefix-affinity, prefix-work): the engines' KV block size (vLLM --block-size). The prompt is tokenized as for counting (tokenizer, else o200k_base, else 4-character pieces) and chain-hashed like the simulator's workloads.")
    max_body_bytes: int = Field(8 * 2**20, ge=1024, description="Larger request bodies get 413.")
    connect_timeout_s: float = Field(5.0, gt=0, description="Backend connect timeout; a backend that refuses or times out is retried on another.")
    first_byte_timeout_s: float = Field(600.0, gt=0, description="Most seconds from sending to the backend's response headers before it counts as failed (and is retried elsewhere).")
    health_interval_s: float = Field(2.0, gt=0, description="Seconds between health checks (GET /health) of each backend.")
    retries: int = Field(2, ge=0, le=100, description="Other backends to try when one fails before the first byte.")
    log: LogConfig = Field(default_factory=LogConfig, description="The request log.")
    learn: OnlineConfig = Field(default_factory=OnlineConfig, description="Online learning from completed requests (`--learn`): recalibration, drift alarm, background refits of the predictor (docs/predictors/online.md).")
    idle_timeout_s: float = Field(60.0, gt=0, le=86_400, description="Most seconds between two reads of a backend's response body once its first bytes came (the wait for those is first_byte_timeout_s). A backend that stalls longer is cut off: a stream ends with an error event, a whole response is retried elsewhere, and the backend counts as failing.")
    drain_timeout_s: float = Field(30.0, ge=0, le=86_400, description="On shutdown (SIGTERM, Ctrl-C), most seconds to let requests in flight finish; those still running after it end with an error (503; an error event in a stream) and their log row.")
    max_event_bytes: int = Field(2**20, ge=1024, le=2**30, description="Largest server-sent event relayed from a backend (up to its blank line); a stream with a larger one ends with an error event.")
    max_response_bytes: int = Field(64 * 2**20, ge=1024, le=2**34, description="Largest non-streaming response body read from a backend; a larger one fails the request (502).")
    max_chunk_bytes: int = Field(16 * 2**20, ge=1024, le=2**34, description="Largest HTTP chunk (chunked transfer encoding) accepted from a backend; a larger one counts as a broken response.")
    admin_api_key: str | None = Field(None, min_length=1, description="API key (Authorization: Bearer KEY) for GET /metrics and the full GET /health. Set: only this key opens them. Unset: with tenants configured any tenant's key does; without tenants they are open. Without the key /metrics is 401 and /health answers only {\"status\"} (200 ok / 503 unavailable), no tenant names or backend URLs.")
    public_status: bool = Field(False, description="Serve /metrics and the full /health to anyone, even with tenants or admin_api_key set.")
    check_content_type: bool = Field(True, description="Refuse generation requests whose Content-Type is not application/json with 415 (as vLLM does; also keeps browsers' cross-site form posts out).")
    allowed_hosts: list[str] = Field(default_factory=list, description="Host names the gateway answers to (the Host header, port ignored; '*.example.com' matches subdomains, '*' any). Empty: any host. Others get 400 (param host), e.g. against DNS rebinding.")

    @field_validator("policy")
    @classmethod
    def _policy_known(cls, v: str) -> str:
        if v not in POLICIES:
            raise ValueError(f"unknown policy {v!r}; known: {', '.join(POLICIES.names())}")
        return v

    @field_validator("policy_params")
    @classmethod
    def _policy_params_valid(cls, v: dict[str, Any], info: ValidationInfo) -> dict[str, Any]:
        if "policy" in info.data:  # errors nest: policy_params.inner_params.base_quantum
            validate_params(info.data["policy"], v)
        return v

    @field_validator("priority_stat")
    @classmethod
    def _stat_known(cls, v: str) -> str:
        from presched.schedule.lengths import check_stat

        if check_stat(v) == "rank":
            raise ValueError("'rank' is a score, not a length; use mean, median, point or qNN")
        return v

    @field_validator("router")
    @classmethod
    def _router_known(cls, v: str) -> str:
        if v not in ROUTERS:
            raise ValueError(f"unknown router {v!r}; known: {', '.join(ROUTERS.names())}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> "ServeConfig":
        keys = [t.api_key for t in self.tenants]
        if len(set(keys)) != len(keys):
            raise ValueError("tenants: two tenants share an api_key")
        names = [t.name for t in self.tenants]
        if len(set(names)) != len(names):
            raise ValueError("tenants: two tenants share a name")
        if self.admin_api_key is not None and self.admin_api_key in keys:
            raise ValueError("admin_api_key: must differ from every tenant's api_key")
        if any(not h.strip() for h in self.allowed_hosts):
            raise ValueError("allowed_hosts: an empty host name")
        return self
