"""What the picker adds to a request's latency, and alternatives to the shipped configuration,
side by side in one run (`benchmarks/epp.py`'s `epp_added_p50_ms` in a focused form).

    python benchmarks/epp_latency.py               # ~1 min on 2 busy cores
    python benchmarks/epp_latency.py --requests 800

Three stand-in engines (`python -m presched.serve.stub`, a TEST DOUBLE that answers at once) in
their own processes; a child process (this script with `--stack`) holds the picker (grpc.aio, as
shipped) and a real Envoy 1.40 with one listener per path below; the parent sends sequential
keep-alive requests (the lean client of benchmarks/gateway_overhead_load.py), ONE REQUEST PER PATH
IN TURN, so that the machine's load (other work) falls on every path alike. Paths:

- alone: Envoy round robin, no picker;
- shipped: Envoy + picker as `presched epp` runs it (envoy_body_mode 'buffered': ext_proc
  request body BUFFERED, response body STREAMED; override_host + retries);
- full-duplex: the same picker, Envoy sending GIE's standard FULL_DUPLEX_STREAMED bodies
  (envoy_body_mode 'full-duplex'; the shipped mode before 2026-12-03);
- no-header-wait: 'buffered' with the filter's `send_body_without_waiting_for_header_response`
  (the body sent before the headers' answer comes back; an experiment, not shipped);
- worker-thread: as before this change: the prompt's tokens counted and the length predicted in
  the worker thread (now: prompts up to `core.INLINE_COUNT_CHARS` counted, and predictors whose
  calls take at most `inline_predict_ms` called, on the event loop);
- no-predictor: the same without a length predictor (the shipped path predicts with the noisy
  oracle of benchmarks/epp.py, through `PredictBatcher` and the worker thread);
- sync-server: the sync gRPC server (a thread pool), each message handed to the picker's event
  loop and its answers awaited there;
- no-response-body: response body mode NONE (NOT a usable configuration: the usage is not
  counted and the request never ends in the picker's books; a lower bound for what skipping that
  phase would save).

Writes benchmarks/results/epp_latency.json; prints `figure: epp_added_p50_ms = ...` (shipped
minus alone, medians) and one `path: ...` line per path.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from epp import NoisyFromMaxTokens, start_engines  # noqa: E402
from gateway_overhead_load import Pool  # noqa: E402

BODY = json.dumps({"model": "stub", "prompt": "hello " * 60, "max_tokens": 16}).encode()


# --- the child: the picker, its variants and one Envoy ------------------------------------------
def run_stack(addrs: list[str]) -> None:
    from concurrent import futures

    import grpc
    from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

    from presched.epp import envoy as E
    from presched.epp.core import Picker
    from presched.epp.endpoints import initial_endpoints
    from presched.epp.exchange import Exchange
    from presched.epp.local import LocalStack, free_port
    from presched.epp.server import Processor

    cfg = {"endpoints": [{"address": a, "max_in_flight": 1000} for a in addrs], "policy": "fcfs",
           "router": "least-requests", "log": {"path": None}}  # fmt: skip
    with LocalStack(cfg, stubs=0, baselines=("round-robin",), predictor=NoisyFromMaxTokens()) as st:
        loop, picker = st.loop, st.server.picker

        class SyncProcessor(pb_grpc.ExternalProcessorServicer):
            def Process(self, it, ctx):  # noqa: N802
                ex = Exchange(picker)
                try:
                    for msg in it:
                        yield from asyncio.run_coroutine_threadsafe(ex.on(msg), loop).result()
                finally:
                    loop.call_soon_threadsafe(ex.close)

        async def aio_server(proc) -> int:
            srv = grpc.aio.server()
            pb_grpc.add_ExternalProcessorServicer_to_server(proc, srv)
            port = srv.add_insecure_port("127.0.0.1:0")
            await srv.start()
            _KEEP.append(srv)
            return port

        before = st.server.cfg.model_copy(update={"inline_predict_ms": 0.0})
        slow = Picker(before, NoisyFromMaxTokens(), None, initial_endpoints(before))
        slow.inline_count_chars = -1
        unpredicted = Picker(st.server.cfg, None, None, initial_endpoints(st.server.cfg))
        sync = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        pb_grpc.add_ExternalProcessorServicer_to_server(SyncProcessor(), sync)
        sync_port = sync.add_insecure_port("127.0.0.1:0")
        sync.start()
        pickers = {"shipped": st.server.port, "worker-thread": st.call(aio_server(Processor(slow))),
                   "no-predictor": st.call(aio_server(Processor(unpredicted))),
                   "sync-server": sync_port}  # fmt: skip
        boot = E.bootstrap(free_port(), st.server.port, free_port(), endpoints=addrs)
        h2 = boot["static_resources"]["clusters"][0]["typed_extension_protocol_options"]
        listeners, clusters = [], [boot["static_resources"]["clusters"][1]]
        retry = {"retry_on": E.RETRY_ON, "num_retries": 2}
        paths = {"alone": st.ports["round-robin"]}
        variants = {name: (port, {}) for name, port in pickers.items()}
        variants["full-duplex"] = (st.server.port, E.BODY_MODES["full-duplex"])
        variants["no-header-wait"] = (st.server.port, {})
        variants["no-response-body"] = (st.server.port, {"response_body_mode": "NONE", "response_trailer_mode": "SKIP"})
        for name, (port, modes) in variants.items():
            c = E._static(f"epp-{name}", [f"127.0.0.1:{port}"])
            c["typed_extension_protocol_options"] = h2
            clusters.append(c)
            paths[name] = free_port()
            f = E.ext_proc_filter(cluster=f"epp-{name}", modes=modes)
            if name == "no-header-wait":
                f["typed_config"]["send_body_without_waiting_for_header_response"] = True
            listeners.append(E._listener(name, paths[name], "gie_pool", [f], "127.0.0.1", retry))
        admin = free_port()
        boot = {"admin": {"address": E._addr("127.0.0.1", admin)},
                "static_resources": {"listeners": listeners, "clusters": clusters}}  # fmt: skip
        envoy = E.start_envoy(E.write_bootstrap(st.workdir / "variants.json", boot), st.workdir / "variants.log",
                              base_id=admin)  # fmt: skip
        try:
            E.wait_ready(admin, envoy)
            print(json.dumps(paths), flush=True)
            sys.stdin.read()  # until the parent closes it
        finally:
            E.stop(envoy)
            sync.stop(0)


_KEEP: list = []


# --- the parent -----------------------------------------------------------------------------------
async def measure(paths: dict[str, int], n: int, warm: int = 20) -> dict[str, list[float]]:
    pools = {k: Pool(v) for k, v in paths.items()}
    out: dict[str, list[float]] = {k: [] for k in paths}
    failed = {k: 0 for k in paths}
    try:
        for i in range(warm + n):
            for k, pool in pools.items():
                t = time.perf_counter()
                status, _, _ = await pool.post("/v1/completions", BODY, t)
                if i < warm:
                    continue
                if status == 200:
                    out[k].append((time.perf_counter() - t) * 1e3)
                else:
                    failed[k] += 1
    finally:
        for p in pools.values():
            p.close()
    return out, failed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stack", help=argparse.SUPPRESS)
    ap.add_argument("--requests", type=int, default=500, help="requests per path")
    a = ap.parse_args()
    if a.stack:
        run_stack(json.loads(a.stack))
        return
    engines, addrs = start_engines(3, 0.0, 1_000_000)
    try:
        child = subprocess.Popen([sys.executable, __file__, "--stack", json.dumps(addrs)],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
        try:
            paths = json.loads(child.stdout.readline())
            lat, failed = asyncio.run(measure(paths, a.requests))
        finally:
            child.stdin.close()
            child.wait(60)
    finally:
        for p in engines:
            p.terminate()
            p.wait()
    base = statistics.median(lat["alone"])
    rows = {}
    for k, v in lat.items():
        v = sorted(v)
        rows[k] = {"n": len(v), "failed": failed[k], "p50_ms": statistics.median(v) if v else None,
                   "p90_ms": v[int(0.9 * len(v))] if v else None,
                   "added_p50_ms": statistics.median(v) - base if v else None}  # fmt: skip
    out = HERE / "results"
    out.mkdir(exist_ok=True)
    (out / "epp_latency.json").write_text(json.dumps({"requests": a.requests, "paths": rows}, indent=1))
    for k, r in rows.items():
        if r["n"]:
            print(f"path: {k} p50 {r['p50_ms']:.2f} ms, p90 {r['p90_ms']:.2f} ms, added p50 {r['added_p50_ms']:.2f} ms, "
                  f"failed {r['failed']}")  # fmt: skip
        else:
            print(f"path: {k} no answer, failed {r['failed']}")
    print(f"figure: epp_added_p50_ms = {rows['shipped']['added_p50_ms']:.3f}")


if __name__ == "__main__":
    main()
