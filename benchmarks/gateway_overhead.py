"""What the presched gateway adds to a request: latency at 200 req/s, and its highest request rate.

    python benchmarks/gateway_overhead.py            # full run (8-10 min on 2 cores)
    python benchmarks/gateway_overhead.py --quick    # 1 s per measurement, 1 repeat (~25 s)
    python benchmarks/gateway_overhead.py --server-pythonpath /tmp/patched   # a patched copy
    python benchmarks/gateway_overhead.py --clients  # only the upstream client vs aiohttp, httpx

The upstream is `presched.serve.stub` with token_s 0: a minimal local upstream that answers
instantly (a test double, not an engine), so every millisecond measured is HTTP + the servers'
Python, and the gateway's share shows. Every server is its own process, started the way users
start it (`python -m presched.serve.stub`, `presched serve`, both uvicorn):

- direct: the generator calls the stub itself;
- gateway: `presched serve --log none` in front of the stub (queue mode, fcfs, no predictor);
- gateway+log: the same with the SQLite request log on;
- passthrough: `--mode passthrough`, log off.

Load: open loop, Poisson arrivals at `--rate` req/s (default 200) for `--duration` s (10), the
same arrival times for every target; POST /v1/completions with a ~60-token prompt and
max_tokens 16, non-streaming and streaming (SSE, 16 events). The load generator is a lean
HTTP/1.1 client in this file (raw asyncio streams, keep-alive pool), not `presched replay`: its
own cost is paid equally on the direct path, so "added" = gateway - direct, measured by the same
generator in the same repeat. Latency = from writing the request to the end of the response
(`send_lag` = how late the generator sent, reported apart). Repeats (`--repeats`, 3) rotate the
order of the targets; figures are medians over repeats of the per-repeat differences.

Other work on the machine is measured during every run (CPU time of all processes from
/proc/stat, less the servers' and the generator's): a latency run during which it exceeds
`--max-other-load` cores (0.5) is repeated, up to `--disturbed-retries` (2) times; the last try
counts and every try is kept in the JSON (`other_load_cores`, `disturbed`).

Max request rate: the offered rate ramps up (`--ramp-rates`) for direct and gateway; a step
passes when every request succeeded, the achieved rate is >= 95 % of the offered rate and p99 <=
`--p99-limit-ms` (100); a failing step is tried twice more (other work on the machine causes
seconds-long stalls), then the ramp stops. The highest passing rate is reported. A step that
falls more than 1 s of requests behind stops sending (`overloaded`), and every run starts once
the servers are idle again. Also measured: each server's CPU time per request (from /proc), the
steadier cost on a noisy machine, and from it `gateway_cpu_bound_rps` = 1 / (gateway CPU per
request), the rate at which the gateway's process fills one core.

The machine is noisy: 2 cores shared by the generator, the gateway and the stub (and whatever
else runs), so compare within a run. Writes benchmarks/results/gateway_overhead.json and .png,
then prints `figure: name = value` lines (gateway_added_p50_ms, gateway_max_rps, ...).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

OUT = Path(__file__).parent / "results"
UPSTREAM = "minimal local upstream that answers instantly (test double), not an engine"
TARGETS = ("direct", "gateway", "gateway+log", "passthrough")
RAMP_TARGETS = ("direct", "gateway")
RAMP_RATES = (100, 200, 300, 400, 600, 800, 1000, 1200, 1600, 2000, 2500, 3000)
MAX_TOKENS = 16
PROMPT_WORDS = (
    "the",
    "model",
    "serves",
    "requests",
    "in",
    "order",
    "of",
    "their",
    "predicted",
    "length",
    "while",
    "tenants",
    "share",
    "one",
    "engine",
    "behind",
    "a",
    "gateway",
)
_TICK = os.sysconf("SC_CLK_TCK")


# --- the load generator ----------------------------------------------------------------------
class Pool:
    """Keep-alive HTTP/1.1 connections to one server; `post` sends one request, reads the whole
    response and returns (status, body, seconds to the first body bytes). A connection idle for
    longer than `max_idle_s` is dropped (uvicorn closes them after 5 s); one that the server
    closed anyway is replaced once, as HTTP clients do."""

    def __init__(self, port: int, max_idle_s: float = 3.0) -> None:
        self.port = port
        self.max_idle_s = max_idle_s
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter, float]] = []
        self.head = f"Host: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n".encode()

    async def _conn(self, t: float):
        while self.idle:
            reader, writer, used = self.idle.pop()
            if t - used < self.max_idle_s and not reader.at_eof():
                return reader, writer, True
            writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        return reader, writer, False

    async def post(self, path: str, body: bytes, t_send: float) -> tuple[int, bytes, float]:
        msg = (
            b"POST "
            + path.encode()
            + b" HTTP/1.1\r\n"
            + self.head
            + b"Content-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )
        reader, writer, reused = await self._conn(t_send)
        writer.write(msg)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
            if not reused:
                raise
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            writer.write(msg)
            head = await reader.readuntil(b"\r\n\r\n")
        try:
            status = int(head[9:12])
            low = head.lower()
            parts = []
            t_first = 0.0
            if b"transfer-encoding: chunked" in low:
                while True:
                    size = int((await reader.readline()).split(b";")[0], 16)
                    if size == 0:
                        await reader.readline()
                        break
                    parts.append((await reader.readexactly(size + 2))[:-2])
                    if not t_first:
                        t_first = time.perf_counter() - t_send
            else:
                i = low.index(b"content-length:") + 15
                parts.append(await reader.readexactly(int(low[i : low.index(b"\r\n", i)])))
                t_first = time.perf_counter() - t_send
        except BaseException:
            writer.close()
            raise
        if b"connection: close" in low:
            writer.close()
        else:
            self.idle.append((reader, writer, time.perf_counter()))
        return status, b"".join(parts), t_first

    def close(self) -> None:
        for _, w, _ in self.idle:
            w.close()
        self.idle.clear()


def make_bodies(n: int, stream: bool, seed: int = 0) -> list[bytes]:
    """`n` request bodies with distinct ~60-token prompts (so no cache anywhere helps)."""
    rng = random.Random(seed)
    return [
        json.dumps(
            {
                "model": "stub",
                "prompt": " ".join(rng.choices(PROMPT_WORDS, k=60)),
                "max_tokens": MAX_TOKENS,
                "stream": stream,
            }
        ).encode()
        for _ in range(n)
    ]


def poisson_arrivals(rate: float, duration: float, seed: int = 0) -> np.ndarray:
    """Send times (s from the start) of an open-loop Poisson stream."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate, size=int(rate * duration * 1.5) + 10)
    t = np.cumsum(gaps) - gaps[0]
    return t[t < duration]


def response_ok(status: int, data: bytes, stream: bool) -> bool:
    """A complete answer: 200 and the stub's last event / usage."""
    if status != 200:
        return False
    if stream:
        return data.endswith(b"data: [DONE]\n\n") and data.count(b"data: ") == MAX_TOKENS + 1
    return b'"completion_tokens":' in data


async def run_load(
    pool: Pool,
    arrivals: np.ndarray,
    bodies: list[bytes],
    stream: bool,
    duration: float,
    drain_s: float = 10.0,
    max_outstanding: int | None = None,
) -> dict[str, Any]:
    """Send one body per arrival time (open loop, arrivals within `duration` s), wait for every
    answer (at most `drain_s` after the last send) and measure. Offered rate = sent / duration;
    achieved = answered / max(duration, time to the last answer). With `max_outstanding`, a
    server that falls that far behind is declared overloaded: the rest is not sent (counted as
    errors), so a ramp step past the limit does not leave a backlog that skews the next one."""
    n = len(arrivals)
    lat = np.full(n, np.nan)
    ttfb = np.full(n, np.nan)
    lag = np.zeros(n)
    ends = np.full(n, np.nan)
    errors: dict[str, int] = {}
    t0 = time.perf_counter() + 0.005

    done = [0]  # requests answered or failed

    async def one(i: int) -> None:
        t = time.perf_counter()
        lag[i] = t - (t0 + arrivals[i])
        try:
            status, data, first = await pool.post("/v1/completions", bodies[i % len(bodies)], t)
        except Exception as e:  # noqa: BLE001 - counted
            errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1
            return
        finally:
            done[0] += 1
        end = time.perf_counter()
        if not response_ok(status, data, stream):
            key = str(status) if status != 200 else "incomplete"
            errors[key] = errors.get(key, 0) + 1
            return
        lat[i], ttfb[i], ends[i] = end - t, first, end

    cpu0 = time.process_time()
    tasks = []
    for i, at in enumerate(arrivals):
        delay = t0 + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if max_outstanding is not None and len(tasks) - done[0] > max_outstanding:
            errors["overloaded"] = n - i
            break
        tasks.append(asyncio.create_task(one(i)))
    _, pending = await asyncio.wait(tasks, timeout=drain_s) if tasks else (set(), set())
    for t in pending:
        t.cancel()
    if pending:
        errors["timeout"] = len(pending)
        await asyncio.gather(*pending, return_exceptions=True)
        pool.close()  # connections with unread answers cannot be reused
    gen_cpu = time.process_time() - cpu0
    ok = ~np.isnan(lat)
    span = max(duration, float(np.nanmax(ends) - t0)) if ok.any() else float("nan")
    ms = lat[ok] * 1e3
    return {
        "offered_rps": n / duration,
        "sent": len(tasks),
        "planned": n,
        "ok": int(ok.sum()),
        "errors": errors,
        "achieved_rps": int(ok.sum()) / span,
        "p50_ms": _pct(ms, 50),
        "p90_ms": _pct(ms, 90),
        "p99_ms": _pct(ms, 99),
        "mean_ms": float(ms.mean()) if ms.size else float("nan"),
        "ttfb_p50_ms": _pct(ttfb[ok] * 1e3, 50),
        "send_lag_p99_ms": _pct(lag[: len(tasks)] * 1e3, 99),
        "generator_cpu_us_per_req": gen_cpu / max(len(tasks), 1) * 1e6,
    }


def _pct(x: np.ndarray, q: float) -> float:
    return float(np.percentile(x, q)) if len(x) else float("nan")


# --- the servers -----------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def machine_busy_seconds() -> float:
    """CPU seconds all processes of the machine have used (from /proc/stat)."""
    f = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in f[:8])
    return (user + nice + system + irq + softirq + steal) / _TICK


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process (from /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


class Servers:
    """The stub and the three gateway variants, each a process; `ports[target]`."""

    def __init__(self, workdir: Path, pythonpath: str | None = None) -> None:
        self.workdir = workdir
        self.procs: dict[str, subprocess.Popen] = {}
        self.ports: dict[str, int] = {}
        self.env = dict(os.environ)
        if pythonpath:
            self.env["PYTHONPATH"] = os.pathsep.join(
                filter(None, [pythonpath, self.env.get("PYTHONPATH")])
            )

    def _spawn(self, name: str, cmd: list[str]) -> None:
        with open(self.workdir / f"{name.replace('+', '-')}.log", "wb") as err:
            self.procs[name] = subprocess.Popen(
                cmd, stdout=err, stderr=subprocess.STDOUT, cwd=self.workdir, env=self.env
            )

    def libraries(self) -> dict[str, bool]:
        """Which optional speed-ups the servers' Python finds (uvicorn uses uvloop and httptools
        when importable; httpcore imports sniffio on every lock it makes and is slow without it)."""
        code = (
            "import importlib.util as u, json; print(json.dumps({m: u.find_spec(m) is not None "
            "for m in ('uvloop', 'httptools', 'sniffio')}))"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], env=self.env, capture_output=True, text=True, check=True
        )
        return json.loads(out.stdout)

    def start(self, targets: tuple[str, ...]) -> None:
        py = sys.executable
        self.ports["direct"] = free_port()
        self._spawn(
            "direct", [py, "-m", "presched.serve.stub", "--port", str(self.ports["direct"])]
        )
        self._wait_ready("direct", "/v1/models")
        upstream = f"http://127.0.0.1:{self.ports['direct']}"
        extra = {
            "gateway": ["--log", "none"],
            "passthrough": ["--log", "none", "--mode", "passthrough"],
            "gateway+log": ["--log", str(self.workdir / "requests.sqlite")],
        }
        gws = [t for t in targets if t != "direct"]
        for t in gws:
            self.ports[t] = free_port()
            self._spawn(
                t,
                [
                    py,
                    "-m",
                    "presched.cli",
                    "serve",
                    "--backend",
                    upstream,
                    "--port",
                    str(self.ports[t]),
                    *extra[t],
                ],
            )
        for t in gws:
            self._wait_ready(t, "/health")

    def _wait_ready(self, name: str, path: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.procs[name].poll() is not None:
                break
            if self._get_ok(name, path):
                return
            time.sleep(0.1)
        log = (self.workdir / f"{name.replace('+', '-')}.log").read_text(errors="replace")
        raise RuntimeError(
            f"{name} did not start within {timeout:.0f} s; its output:\n{log[-3000:]}"
        )

    async def settle(self, timeout: float = 20.0) -> float:
        """Wait until no server is busy (each used < 10 % of a core over 0.3 s: a backlog left
        by an overloaded run is worked off) and every gateway reports a healthy backend (its
        health check may have timed out meanwhile), at most `timeout` s; returns the seconds."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            c0 = self.cpu()
            await asyncio.sleep(0.3)
            c1 = self.cpu()
            if all(c1[t] - c0[t] < 0.03 for t in c1):
                gateways = [t for t in self.ports if t != "direct"]
                if all(await asyncio.gather(*(self._health_ok(t) for t in gateways))):
                    break
        return time.monotonic() - t0

    async def _health_ok(self, name: str) -> bool:
        try:
            async with asyncio.timeout(2.0):
                reader, writer = await asyncio.open_connection("127.0.0.1", self.ports[name])
                try:
                    writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                    return (await reader.readline()).startswith(b"HTTP/1.1 200")
                finally:
                    writer.close()
        except (OSError, TimeoutError):
            return False

    def _get_ok(self, name: str, path: str) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.ports[name]), timeout=2) as s:
                s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
                return s.recv(64).startswith(b"HTTP/1.1 200")
        except OSError:
            return False

    def cpu(self) -> dict[str, float]:
        return {t: cpu_seconds(p.pid) for t, p in self.procs.items()}

    def stop(self) -> None:
        for p in self.procs.values():
            p.terminate()
        for p in self.procs.values():
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


# --- the measurements ------------------------------------------------------------------------
async def measure(
    srv: Servers,
    pools: dict[str, Pool],
    target: str,
    arrivals,
    bodies,
    stream,
    duration: float,
    drain_s: float = 10.0,
    max_outstanding: int | None = None,
) -> dict:
    """One load run against `target` (once the servers are idle, and after 0.2 s of the same
    load, unmeasured, to open connections), with the CPU seconds each server spent per request."""
    t_settle = await srv.settle()
    rate = len(arrivals) / duration
    await run_load(
        pools[target], poisson_arrivals(rate, 0.2, seed=7), bodies[-20:], stream, 0.2, drain_s
    )
    before, busy0, own0, t0 = (
        srv.cpu(),
        machine_busy_seconds(),
        time.process_time(),
        time.perf_counter(),
    )
    row = await run_load(
        pools[target], arrivals, bodies, stream, duration, drain_s, max_outstanding
    )
    after, busy1, own1, t1 = (
        srv.cpu(),
        machine_busy_seconds(),
        time.process_time(),
        time.perf_counter(),
    )
    n = max(row["sent"], 1)
    row["cpu_us_per_req"] = {t: (after[t] - before[t]) / n * 1e6 for t in after}
    ours = sum(after[t] - before[t] for t in after) + own1 - own0
    row["other_load_cores"] = max(0.0, (busy1 - busy0 - ours) / (t1 - t0))  # other work
    row["settle_s"] = t_settle
    pools[target].close()  # the next run opens its own connections (no idle pile-up)
    return row


def passes(row: dict, p99_limit_ms: float) -> bool:
    return (
        not row["errors"]
        and row["achieved_rps"] >= 0.95 * row["offered_rps"]
        and row["p99_ms"] <= p99_limit_ms
    )


async def bench(args, srv: Servers, prog: Progress) -> dict[str, Any]:
    pools = {t: Pool(srv.ports[t]) for t in srv.ports}
    targets = [t for t in TARGETS if t in srv.ports]
    modes = (False, True)
    warm = poisson_arrivals(args.rate, 0.3, seed=99)
    for t in targets:  # open connections, warm the code paths
        for stream in modes:
            await run_load(pools[t], warm, make_bodies(50, stream, seed=99), stream, 0.3)

    runs: list[dict[str, Any]] = []
    task = prog.add_task("latency", total=args.repeats * len(modes) * len(targets))
    for rep in range(args.repeats):
        order = targets[rep % len(targets) :] + targets[: rep % len(targets)]
        arrivals = poisson_arrivals(args.rate, args.duration, seed=rep)
        for stream in modes:
            bodies = make_bodies(len(arrivals), stream, seed=rep)
            for t in order:
                prog.update(
                    task, description=f"repeat {rep + 1}: {t} {'stream' if stream else 'json'}"
                )
                for attempt in range(1 + args.disturbed_retries):  # the last attempt counts
                    row = await measure(srv, pools, t, arrivals, bodies, stream, args.duration)
                    disturbed = row["other_load_cores"] > args.max_other_load
                    runs.append(
                        dict(
                            row,
                            target=t,
                            stream=stream,
                            repeat=rep,
                            attempt=attempt,
                            disturbed=disturbed,
                            final=not disturbed or attempt == args.disturbed_retries,
                        )
                    )
                    if not disturbed:
                        break
                prog.advance(task)

    ramp: list[dict[str, Any]] = []
    rates = list(args.ramp_rates)
    task = prog.add_task("ramp", total=len(RAMP_TARGETS) * len(modes) * len(rates))
    for stream in modes:
        for t in RAMP_TARGETS:
            if t not in srv.ports:
                continue
            for k, rate in enumerate(rates):
                prog.update(task, description=f"ramp {t} {'stream' if stream else 'json'} {rate}/s")
                arrivals = poisson_arrivals(rate, args.ramp_duration, seed=1000 + k)
                bodies = make_bodies(min(len(arrivals), 2000), stream, seed=1000 + k)
                ok = False
                for attempt in range(args.ramp_attempts):
                    row = await measure(
                        srv,
                        pools,
                        t,
                        arrivals,
                        bodies,
                        stream,
                        args.ramp_duration,
                        args.drain_s,
                        max_outstanding=max(200, rate),
                    )  # 1 s of backlog: overloaded
                    ok = passes(row, args.p99_limit_ms)
                    ramp.append(
                        dict(row, target=t, stream=stream, rate=rate, attempt=attempt, passed=ok)
                    )
                    if ok:
                        break
                prog.advance(task)
                if not ok:
                    prog.advance(task, len(rates) - k - 1)
                    break
    for p in pools.values():
        p.close()
    return {"runs": runs, "ramp": ramp}


def summarize_runs(runs: list[dict]) -> dict[str, Any]:
    """Per (target, stream): medians over repeats; added = median of per-repeat differences
    to direct."""
    out: dict[str, Any] = {}
    runs = [r for r in runs if r.get("final", True)]
    for stream in (False, True):
        direct = {r["repeat"]: r for r in runs if r["target"] == "direct" and r["stream"] == stream}
        for t in TARGETS:
            rows = [r for r in runs if r["target"] == t and r["stream"] == stream]
            if not rows:
                continue
            s: dict[str, Any] = {
                k: statistics.median(r[k] for r in rows)
                for k in (
                    "p50_ms",
                    "p90_ms",
                    "p99_ms",
                    "mean_ms",
                    "ttfb_p50_ms",
                    "achieved_rps",
                    "send_lag_p99_ms",
                    "generator_cpu_us_per_req",
                    "other_load_cores",
                )
            }
            s["errors"] = sum(sum(r["errors"].values()) for r in rows)
            s["server_cpu_us_per_req"] = statistics.median(
                sum(r["cpu_us_per_req"][x] for x in ("direct", t) if x in r["cpu_us_per_req"])
                for r in rows
            )
            s["target_cpu_us_per_req"] = statistics.median(r["cpu_us_per_req"][t] for r in rows)
            if t != "direct" and direct:
                pairs = [(r, direct[r["repeat"]]) for r in rows if r["repeat"] in direct]
                for q in ("p50", "p99"):
                    s[f"added_{q}_ms"] = statistics.median(
                        g[f"{q}_ms"] - d[f"{q}_ms"] for g, d in pairs
                    )
                    s[f"ratio_{q}"] = statistics.median(
                        g[f"{q}_ms"] / d[f"{q}_ms"] for g, d in pairs
                    )
            out[f"{t}/{'stream' if stream else 'json'}"] = s
    return out


def max_rates(ramp: list[dict]) -> dict[str, float]:
    out = {}
    for stream in (False, True):
        for t in RAMP_TARGETS:
            ok = [
                r["rate"]
                for r in ramp
                if r["target"] == t and r["stream"] == stream and r["passed"]
            ]
            tried = [r for r in ramp if r["target"] == t and r["stream"] == stream]
            if tried:
                out[f"{t}/{'stream' if stream else 'json'}"] = float(max(ok)) if ok else 0.0
    return out


def figures_of(summary: dict, maxes: dict) -> dict[str, float]:
    g, gs = summary.get("gateway/json", {}), summary.get("gateway/stream", {})
    f = {
        "gateway_added_p50_ms": g.get("added_p50_ms"),
        "gateway_max_rps": maxes.get("gateway/json"),
        "gateway_added_p99_ms": g.get("added_p99_ms"),
        "gateway_added_p50_ms_stream": gs.get("added_p50_ms"),
        "gateway_added_p99_ms_stream": gs.get("added_p99_ms"),
        "gateway_added_p50_ms_with_log": summary.get("gateway+log/json", {}).get("added_p50_ms"),
        "gateway_added_p50_ms_passthrough": summary.get("passthrough/json", {}).get("added_p50_ms"),
        "gateway_cpu_us_per_req": g.get("target_cpu_us_per_req"),
        "gateway_cpu_bound_rps": 1e6 / g["target_cpu_us_per_req"]
        if g.get("target_cpu_us_per_req")
        else None,
        "gateway_cpu_us_per_req_stream": gs.get("target_cpu_us_per_req"),
        "direct_p50_ms": summary.get("direct/json", {}).get("p50_ms"),
        "direct_max_rps": maxes.get("direct/json"),
        "gateway_max_rps_stream": maxes.get("gateway/stream"),
        "direct_max_rps_stream": maxes.get("direct/stream"),
    }
    return {k: float(v) for k, v in f.items() if v is not None}


# --- output ----------------------------------------------------------------------------------
def table(summary: dict, maxes: dict, rate: float, console: Console) -> None:
    t = Table(title=f"gateway overhead at {rate:g} req/s (upstream: {UPSTREAM})")
    for col in (
        "target",
        "p50 ms",
        "p99 ms",
        "added p50 ms",
        "added p99 ms",
        "× p50",
        "errors",
        "CPU µs/req of the target",
        "other load (cores)",
        "max req/s (p99 ≤ limit)",
    ):
        t.add_column(col, justify="left" if col == "target" else "right")
    for key, s in summary.items():

        def f(k: str, fmt: str = "{:.3f}", s: dict = s) -> str:
            return fmt.format(s[k]) if k in s else "—"

        mx = maxes.get(key)
        t.add_row(
            key,
            f("p50_ms"),
            f("p99_ms"),
            f("added_p50_ms"),
            f("added_p99_ms"),
            f("ratio_p50", "{:.2f}"),
            str(s["errors"]),
            f"{s['target_cpu_us_per_req']:.0f}",
            f"{s['other_load_cores']:.2f}",
            "—" if mx is None else f"{mx:g}",
        )
    console.print(t)


def plot(result: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    summary = result["summary"]
    keys = list(summary)
    x = np.arange(len(keys))
    ax = axes[0]
    ax.bar(x - 0.2, [summary[k]["p50_ms"] for k in keys], 0.4, label="p50")
    ax.bar(x + 0.2, [summary[k]["p99_ms"] for k in keys], 0.4, label="p99")
    ax.set_xticks(x, keys, fontsize=8, rotation=30, ha="right")
    ax.set_ylabel("latency (ms)")
    ax.set_title(
        f"latency at {result['meta']['rate']:g} req/s (median of {result['meta']['repeats']})"
    )
    ax.legend()
    for ax, col, label in (
        (axes[1], "achieved_rps", "achieved req/s"),
        (axes[2], "p99_ms", "p99 latency (ms)"),
    ):
        for stream in (False, True):
            for t in RAMP_TARGETS:
                rows = [r for r in result["ramp"] if r["target"] == t and r["stream"] == stream]
                last = {r["rate"]: r for r in rows}  # the retry replaces a failed first attempt
                if last:
                    xs = sorted(last)
                    ax.plot(
                        xs,
                        [last[v][col] for v in xs],
                        "o-" if not stream else "s--",
                        label=f"{t} {'stream' if stream else 'json'}",
                    )
        ax.set_xlabel("offered req/s")
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
    axes[1].plot(
        [0, max(result["meta"]["ramp_rates"])],
        [0, max(result["meta"]["ramp_rates"])],
        color="grey",
        lw=0.8,
        ls=":",
    )
    axes[1].set_title("ramp: throughput")
    axes[2].axhline(result["meta"]["p99_limit_ms"], color="grey", lw=0.8, ls=":")
    axes[2].set_yscale("log")
    axes[2].set_title("ramp: p99")
    fig.suptitle(f"presched gateway overhead — upstream: {UPSTREAM}; 2 shared cores", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "gateway_overhead.png", dpi=120)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--quick",
        action="store_true",
        help="1 s per measurement, 1 repeat, short ramp (a smoke run)",
    )
    ap.add_argument(
        "--rate", type=float, default=200.0, help="offered req/s of the latency comparison"
    )
    ap.add_argument(
        "--duration", type=float, default=None, help="seconds per latency run (default 10; quick 1)"
    )
    ap.add_argument(
        "--repeats",
        type=int,
        default=None,
        help="repeats of the latency comparison (default 3; quick 1)",
    )
    ap.add_argument(
        "--ramp-rates",
        type=int,
        nargs="+",
        default=None,
        help=f"offered req/s of the ramp (default {' '.join(map(str, RAMP_RATES))})",
    )
    ap.add_argument(
        "--ramp-duration",
        type=float,
        default=None,
        help="seconds per ramp step (default 5; quick 1)",
    )
    ap.add_argument(
        "--p99-limit-ms", type=float, default=100.0, help="a ramp step passes with p99 at most this"
    )
    ap.add_argument(
        "--max-other-load",
        type=float,
        default=0.5,
        help="a latency run during which other processes used more cores than this is repeated "
        "(the last try counts)",
    )
    ap.add_argument(
        "--disturbed-retries",
        type=int,
        default=None,
        help="repeats of a disturbed latency run (default 2; quick 0)",
    )
    ap.add_argument(
        "--server-pythonpath",
        default=None,
        help="PYTHONPATH prefix of every server process (to measure a patched copy of presched "
        "or extra libraries)",
    )
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument(
        "--clients",
        action="store_true",
        help="measure only the gateway's upstream HTTP client side by side with aiohttp's and "
        "httpx's (client CPU per request; benchmarks/upstream_clients.py, its other flags there)",
    )
    args = ap.parse_args()
    if args.clients:
        from upstream_clients import main as clients_main  # this folder is on sys.path

        clients_main(["--out", str(args.out)])
        return
    args.disturbed_retries = (
        args.disturbed_retries if args.disturbed_retries is not None else (0 if args.quick else 2)
    )
    args.ramp_attempts = (
        1 if args.quick else 3
    )  # a failing step is tried twice more (noisy machine)
    args.drain_s = (
        2.0 if args.quick else 5.0
    )  # a ramp request unanswered this long after the last send fails
    args.duration = args.duration or (1.0 if args.quick else 10.0)
    args.repeats = args.repeats or (1 if args.quick else 3)
    args.ramp_rates = args.ramp_rates or ([100, 200] if args.quick else list(RAMP_RATES))
    args.ramp_duration = args.ramp_duration or (0.5 if args.quick else 5.0)
    for name in ("rate", "duration", "ramp_duration", "p99_limit_ms"):
        if getattr(args, name) <= 0:
            ap.error(f"--{name.replace('_', '-')}: must be > 0")
    if args.repeats < 1 or min(args.ramp_rates) <= 0:
        ap.error("--repeats and --ramp-rates: must be >= 1")
    console = Console(width=160)
    wall = time.perf_counter()
    load0 = os.getloadavg()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="presched-overhead-") as tmp:
        srv = Servers(Path(tmp), args.server_pythonpath)
        libs = srv.libraries()
        try:
            srv.start(TARGETS)
            prog = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                console=console,
                transient=True,
                refresh_per_second=2,
            )
            with prog:
                data = asyncio.run(bench(args, srv, prog))
        finally:
            srv.stop()
    summary = summarize_runs(data["runs"])
    maxes = max_rates(data["ramp"])
    figures = figures_of(summary, maxes)
    meta = {
        "upstream": UPSTREAM,
        "rate": args.rate,
        "duration_s": args.duration,
        "repeats": args.repeats,
        "ramp_rates": args.ramp_rates,
        "ramp_duration_s": args.ramp_duration,
        "p99_limit_ms": args.p99_limit_ms,
        "max_tokens": MAX_TOKENS,
        "arrivals": "poisson",
        "max_other_load": args.max_other_load,
        "disturbed_retries": args.disturbed_retries,
        "loadavg_at_start": load0,
        "gateway": "presched serve --log none (queue mode, fcfs, no predictor); gateway+log: "
        "SQLite log on; passthrough: --mode passthrough",
        "machine": f"{os.cpu_count()} cores shared by the generator, the gateway and the stub "
        "(noisy)",
        "command": " ".join(["python", "benchmarks/gateway_overhead.py", *sys.argv[1:]]),
        "server_libraries": libs,
        "server_pythonpath": args.server_pythonpath,
        "python": platform.python_version(),
        "wall_s": time.perf_counter() - wall,
    }
    result = {"meta": meta, "summary": summary, "max_rps": maxes, "figures": figures, **data}
    (args.out / "gateway_overhead.json").write_text(json.dumps(result, indent=1, default=float))
    plot(result, args.out)
    table(summary, maxes, args.rate, console)
    console.print(
        f"upstream: {UPSTREAM}; {meta['machine']}; wall {meta['wall_s']:.0f} s", highlight=False
    )
    for k, v in figures.items():
        print(f"figure: {k} = {v:.4g}")


if __name__ == "__main__":
    main()
