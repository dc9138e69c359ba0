"""Soak and chaos: the gateway under ~80 % of its measured capacity for 10 minutes while its
backends crash, stall and its clients misbehave; then count what was lost.

    python benchmarks/soak.py                       # 10 min, stubs (rate: 80 % of a short ramp)
    python benchmarks/soak.py --duration 30 --rps 40
    python benchmarks/soak.py --engine              # the two backends are real vLLM CPU engines
    python benchmarks/soak.py --quick               # ~15 s, for tests
    python benchmarks/soak.py --quick --no-chaos    # nothing broken: every figure must be 0

Processes, all on 127.0.0.1, stopped by PID at the end (also on error): the gateway
(`python -m presched.cli serve -c CONFIG`, queue mode, request log with prompts) in front of
three backends: `a` and `b`, the repo's stub (a test double) or with `--engine` vLLM on the tiny
model, and `stall`, the stalling test double of `soak_backends.py`. Chaos, on a fixed schedule:
`a` is SIGKILLed and started again on the same port every `--kill-every` s (120); halfway
between kills `stall` stalls after its response headers for `--stall-for` s (15); 5 % of
requests have malformed bodies (bad JSON, wrong types, unknown model, too large, bad API key,
...), 5 % are streams whose client leaves after the first event; two tenants, `victim` (20 %
of the rate) and `flood` (80 %, plus a burst of 2 × rps requests within 1 s every
`--flood-every` s, 30: about +7 % load). The load is an open-loop Poisson stream (a lean HTTP/1.1 client in soak_load.py, at most
`--max-outstanding` in flight, each given up after `--client-timeout` s).

Every request carries a unique id in its prompt (`soak-s123 ...`); the gateway logs prompts
(`log.store_prompts`), so the log joins to what the client sent. At the end the gateway gets
SIGTERM while requests are still in flight (its drain), then the log is read and joined:

- `soak_lost`: requests that got no final answer (timeout, connection error, cut stream),
  except the clients that left on purpose, plus accepted requests (a 200, an x-request-id, a
  log row) that have no log row;
- `soak_duplicated`: one client id logged more than once, one gateway id answered twice;
- `soak_gateway_5xx`: 5xx (status from the log row, else the client's) whose cause is not a
  backend: a 502/503/504 whose error names a backend is allowed, anything else counts;
- `soak_rss_growth_mb`: the gateway's resident memory at the end of the load minus after the
  warm-up (with chaos: the first chaos cycle, 1.5 x `--kill-every`, at most half the run; without:
  20 % of the run, at most 60 s), counted as RssAnon (heap and stacks: where a leak
  grows; the file-backed pages of VmRSS come and go with other processes' memory pressure, so
  VmRSS is in the JSON and the plot but not the figure);
- `soak_live_blocks_growth`: the same difference of the gateway's live heap, in memory blocks
  held by live Python objects (`presched_python_allocated_blocks` on its /metrics; a held
  request is ~166): a leak grows it, a drained backlog does not (resident memory keeps the
  allocator's high-water mark, the live heap falls back);
- `soak_victim_p99_wait_s`: P99 of the victim tenant's `queue_wait_s` in the log;
- `soak_rss_high_water_mb`, `soak_peak_in_flight` (context for the growth): the most RssAnon
  above its first sample, and the most requests in flight, over the whole run, warm-up included
  (the allocator keeps what the peak backlog took: ~13 KB per request in flight).

Writes benchmarks/results/soak.json and soak.png (RSS, in-flight, outcomes over time).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import shutil
import signal
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

sys.path.insert(0, str(Path(__file__).parent))
from soak_account import UID, account, read_rows
from soak_backends import Rig, live_heap, memory_mb
from soak_load import Client, Rec, offer, plan
from soak_plot import plot

OUT = Path(__file__).parent / "results"


# --- chaos and sampling ----------------------------------------------------------------------
def schedule(args) -> list[tuple[float, str]]:
    """(time, what): kill+restart `a` every kill_every s; stall episodes halfway between."""
    ev = []
    k = 1
    while args.chaos and k * args.kill_every < args.duration:
        ev.append((k * args.kill_every - args.kill_every / 2, "stall_on"))
        ev.append((k * args.kill_every - args.kill_every / 2 + args.stall_for, "stall_off"))
        ev.append((k * args.kill_every, "kill_a"))
        k += 1
    return sorted(ev)


async def chaos(rig: Rig, events: list[tuple[float, str]], log: list[dict], t0: float) -> None:
    for at, what in events:
        await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
        t = time.monotonic() - t0
        if what == "kill_a":
            await asyncio.to_thread(rig.backends["a"].kill)
            log.append({"t": t, "event": "kill a"})
            await asyncio.to_thread(rig.backends["a"].start, 300)
            log.append({"t": time.monotonic() - t0, "event": "a up"})
        else:
            await asyncio.to_thread(rig.stall, what == "stall_on")
            log.append({"t": t, "event": what})


async def sample(
    rig: Rig, client: Client, recs: list[Rec], out: list[dict], t0: float, every: float
) -> None:
    while True:
        done = Counter(r.outcome for r in recs if r.t_end is not None)
        live = await asyncio.to_thread(live_heap, rig.base)
        out.append({"t": time.monotonic() - t0, **memory_mb(rig.gateway.pid), **live,
                    "in_flight": client.in_flight, **done})  # fmt: skip
        await asyncio.sleep(every)


# --- the phases ---------------------------------------------------------------------------------
async def ramp(args, rig: Rig, console: Console) -> dict:
    """Capacity: the highest offered rate (of args.ramp_rates, args.ramp_step_s each, no chaos)
    at which every request succeeded, >= 95 % of the rate was achieved and P99 latency <= limit."""
    steps, best = [], None
    rng = random.Random(args.seed + 1)
    client = Client(rig.base, args.client_timeout, args.max_outstanding)
    try:
        for i, rate in enumerate(args.ramp_rates):
            recs, times = plan(
                rng, "r", rate, args.ramp_step_s, args.model, args.tokens, False, args.seed + 10 + i
            )
            for r in recs:
                r.uid = f"{i}x{r.uid}"  # unique across steps; the soak's join ignores them
            tasks: list = []
            t = time.monotonic()
            await offer(client, recs, times, tasks)
            await asyncio.gather(*tasks)
            span = max(args.ramp_step_s, time.monotonic() - t)
            ok = [r for r in recs if r.outcome == "ok"]
            lat = [r.t_end - r.t_send for r in ok]
            p99 = float(np.percentile(lat, 99)) if lat else float("inf")
            offered = len(recs) / args.ramp_step_s  # this Poisson sample's rate
            passed = (
                len(ok) == len(recs)
                and len(ok) / span >= 0.95 * offered
                and p99 <= args.p99_limit_s
            )
            steps.append({"rate": rate, "sent": len(recs), "ok": len(ok), "offered_rps": offered,
                          "achieved_rps": len(ok) / span, "p99_s": p99, "passed": passed})  # fmt: skip
            console.print(f"ramp {rate:g} req/s: {len(ok)}/{len(recs)} ok, p99 {p99:.3f} s -> "
                          f"{'pass' if passed else 'FAIL'}", highlight=False)  # fmt: skip
            if not passed:
                break
            best = rate
    finally:
        await client.aclose()
    return {"steps": steps, "capacity_rps": best}


async def soak(args, rig: Rig, progress: Progress) -> dict:
    rng = random.Random(args.seed)
    recs, times = plan(rng, "s", args.rps, args.duration, args.model, args.tokens, args.chaos, args.seed,
                       args.flood_every, args.flood_size)  # fmt: skip
    client = Client(rig.base, args.client_timeout, args.max_outstanding)
    events, samples, tasks = [], [], []
    t0 = time.monotonic()
    bg = [asyncio.create_task(chaos(rig, schedule(args), events, t0)),
          asyncio.create_task(sample(rig, client, recs, samples, t0, args.sample_s))]  # fmt: skip
    bar = progress.add_task("soak", total=args.duration)

    async def show() -> None:
        while True:
            c = Counter(r.outcome for r in recs if r.t_end is not None)
            progress.update(bar, completed=min(args.duration, time.monotonic() - t0),
                            description=f"soak {args.rps:.0f} req/s  in flight {client.in_flight:4d}  "
                            + "  ".join(f"{k} {v}" for k, v in sorted(c.items())))  # fmt: skip
            await asyncio.sleep(1.0)

    bg.append(asyncio.create_task(show()))
    try:
        await offer(client, recs, times, tasks)
        await asyncio.sleep(max(0.0, t0 + args.duration - time.monotonic()))
        end = {
            "t": time.monotonic() - t0,
            **memory_mb(rig.gateway.pid),
            **await asyncio.to_thread(live_heap, rig.base),
            "in_flight": client.in_flight,
        }
        for t in bg:
            t.cancel()
        await asyncio.gather(*bg, return_exceptions=True)
        await asyncio.to_thread(rig.stall, False)
        drain = asyncio.create_task(
            asyncio.to_thread(rig.sigterm_gateway, args.client_timeout + 20)
        )
        await asyncio.gather(*tasks)  # every request is bounded by the client timeout
        drain_info = await drain
    finally:
        for t in bg:
            t.cancel()
        await client.aclose()
    warm = [s for s in samples if s["t"] >= args.warmup_s]
    return {"recs": recs, "events": events, "samples": samples, "end": end, "drain": drain_info,
            "in_flight_at_sigterm": end["in_flight"],
            "after_warmup": warm[0] if warm else samples[0]}  # fmt: skip


# --- the command ------------------------------------------------------------------------------
def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--duration", type=float, default=None, help="seconds of soak (default 600; quick 12)"
    )
    ap.add_argument(
        "--rps",
        type=float,
        default=None,
        help="offered req/s (default: 80 %% of the ramp's capacity)",
    )
    ap.add_argument(
        "--quick", action="store_true", help="a short run for tests (12 s, 2-step ramp)"
    )
    ap.add_argument(
        "--engine", action="store_true", help="backends a and b are vLLM CPU engines (tiny model)"
    )
    ap.add_argument(
        "--no-chaos",
        dest="chaos",
        action="store_false",
        help="no kills, stalls, malformed bodies or leaving clients (every figure must be 0)",
    )
    ap.add_argument(
        "--kill-every",
        type=float,
        default=None,
        help="seconds between kills of backend a (120; quick 6)",
    )
    ap.add_argument(
        "--stall-for", type=float, default=None, help="seconds of each stall episode (15; quick 2)"
    )
    ap.add_argument(
        "--flood-every",
        type=float,
        default=None,
        help="seconds between the flood tenant's bursts (30; quick 5; 0: none)",
    )
    ap.add_argument(
        "--flood-size",
        type=float,
        default=2.0,
        help="requests per burst, as a multiple of --rps (sent within 1 s)",
    )
    ap.add_argument(
        "--client-timeout",
        type=float,
        default=None,
        help="a client gives up after this (30; quick 8)",
    )
    ap.add_argument(
        "--ramp-rates",
        type=float,
        nargs="+",
        default=None,
        help="offered req/s of the capacity ramp",
    )
    ap.add_argument(
        "--ramp-step-s", type=float, default=None, help="seconds per ramp step (4; quick 1)"
    )
    ap.add_argument(
        "--p99-limit-s", type=float, default=1.0, help="a ramp step passes with P99 latency <= this"
    )
    ap.add_argument(
        "--max-outstanding", type=int, default=2000, help="most client requests in flight"
    )
    ap.add_argument("--max-in-flight", type=int, default=None, help="per backend (8; engine 4)")
    ap.add_argument("--policy", default="fcfs", help="the gateway's policy")
    ap.add_argument(
        "--gateway-set",
        action="append",
        default=[],
        help="extra `presched serve --set` (repeatable)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args(argv)
    quick, eng = a.quick, a.engine

    def default(name: str, value) -> None:
        if getattr(a, name) is None:
            setattr(a, name, value)

    default("duration", 12.0 if quick else 600.0)
    default("kill_every", 6.0 if quick else 120.0)
    default("flood_every", 5.0 if quick else 30.0)
    a.flood_every = a.flood_every or None  # 0: no bursts
    default("stall_for", 2.0 if quick else 15.0)
    default("client_timeout", 8.0 if quick else 30.0)
    default("ramp_step_s", 1.0 if quick else 4.0)
    default(
        "ramp_rates",
        [10, 20] if quick else [2, 4, 8, 16, 32] if eng else [25, 50, 100, 150, 200, 300, 400, 600],
    )
    default("max_in_flight", 4 if eng else 8)
    a.model, a.token_s = ("tiny", 0.005) if a.engine else ("stub", 0.002)
    a.tokens = (4, 16) if a.engine else (4, 32)
    # warm-up: the first chaos cycle (a kill, its backlog, a stall), so the allocator has seen
    # the peak backlog once: resident memory keeps that high-water mark, a leak grows past it
    a.warmup_s = min(0.5 * a.duration, 1.5 * a.kill_every) if a.chaos else min(60.0, 0.2 * a.duration)
    a.sample_s = 0.5 if a.duration < 60 else 1.0
    for name in (
        "duration",
        "kill_every",
        "stall_for",
        "client_timeout",
        "ramp_step_s",
        "p99_limit_s",
    ):
        if getattr(a, name) <= 0:
            ap.error(f"--{name.replace('_', '-')}: must be > 0")
    if a.duration > 86400 or a.client_timeout > 3600:
        ap.error("--duration: at most 86400 s; --client-timeout: at most 3600 s")
    if (
        not (a.rps is None or 0 < a.rps <= 5000)
        or not 0 < min(a.ramp_rates) <= max(a.ramp_rates) <= 5000
    ):
        ap.error("--rps, --ramp-rates: must be in (0, 5000] req/s")
    if not 1 <= a.max_outstanding <= 5000 or not 1 <= a.max_in_flight <= 1024:
        ap.error("--max-outstanding: 1 to 5000; --max-in-flight: 1 to 1024")
    if (a.flood_every is not None and a.flood_every < 0) or not 0 <= a.flood_size <= 20:
        ap.error("--flood-every: must be >= 0; --flood-size: 0 to 20")
    return a


_RIGS: list[Rig] = []  # what a SIGTERM must stop


def _terminate(signum, frame) -> None:
    """SIGTERM: stop every process this run started (by PID), remove its work folder, exit. Not
    by unwinding: an exception raised at an arbitrary point of the event loop's shutdown could
    wait there for minutes."""
    for rig in _RIGS:
        rig.stop()
        shutil.rmtree(rig.workdir, ignore_errors=True)
    os._exit(128 + signum)


def main(argv=None) -> None:
    args = parse(argv)
    signal.signal(signal.SIGTERM, _terminate)
    console = Console(width=150)
    args.out.mkdir(parents=True, exist_ok=True)
    wall = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="presched-soak-") as tmp:
        rig = Rig(args, Path(tmp))
        _RIGS.append(rig)
        try:
            rig.start()
            cap = None
            if args.rps is None:
                cap = asyncio.run(ramp(args, rig, console))
                base = cap["capacity_rps"] or min(args.ramp_rates) / 2
                args.rps = 0.8 * base
            console.print(f"soak: {args.rps:.1f} req/s for {args.duration:g} s", highlight=False)
            prog = Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                            console=console, transient=True)  # fmt: skip
            with prog:
                run = asyncio.run(soak(args, rig, prog))
            rows = read_rows(rig.log_path)
            gw_tail = (Path(tmp) / "gateway.log").read_text(errors="replace")[-3000:]
        finally:
            rig.stop()
    recs = [r.row() for r in run.pop("recs")]
    soak_rows = [
        r for r in rows if (m := UID.search(r.get("prompt") or "")) is None or m[1].startswith("s")
    ]
    acc = account(recs, soak_rows)
    figures = {"soak_lost": acc["lost"], "soak_duplicated": acc["duplicated"],
               "soak_gateway_5xx": acc["gateway_5xx"],
               "soak_rss_growth_mb": run["end"]["anon_mb"] - run["after_warmup"]["anon_mb"],
               "soak_live_blocks_growth": run["end"]["python_allocated_blocks"]
               - run["after_warmup"]["python_allocated_blocks"],
               "soak_victim_p99_wait_s": acc["victim_p99_wait_s"],
               "soak_rss_high_water_mb": max(x["anon_mb"] for x in run["samples"]) - run["samples"][0]["anon_mb"],
               "soak_peak_in_flight": max(x["in_flight"] for x in run["samples"])}  # fmt: skip
    meta = {"command": " ".join(["python", "benchmarks/soak.py", *(argv or sys.argv[1:])]),
            "rps": args.rps, "duration_s": args.duration, "warmup_s": args.warmup_s, "chaos": args.chaos,
            "kill_every_s": args.kill_every,
            "flood_every_s": args.flood_every, "flood_size": args.flood_size, "stall_for_s": args.stall_for, "client_timeout_s": args.client_timeout,
            "backends": ("a, b: vLLM CPU engines (tiny model)" if args.engine else
                         "a, b: presched.serve.stub (test double)") + "; stall: soak_backends.StallEngine (test double)",
            "gateway_config": rig.config(), "gateway_set": args.gateway_set, "tokens": args.tokens,
            "token_s": args.token_s, "tenants": "victim 20 %, flood 80 % of the rate",
            "machine": f"{os.cpu_count()} cores (shared)", "python": platform.python_version(),
            "wall_s": time.perf_counter() - wall}  # fmt: skip
    res = {"meta": meta, "figures": figures, "capacity": cap, "accounting": acc, **run,
           "gateway_log_tail": gw_tail}  # fmt: skip
    (args.out / "soak.json").write_text(json.dumps(res, indent=1, default=float))
    plot(res, recs, args.out)
    console.print(f"outcomes {acc['outcomes']}; 5xx causes {acc['five_xx_causes']}; drain {run['drain']}",
                  highlight=False)  # fmt: skip
    for k, v in figures.items():
        print(f"figure: {k} = {v:.4g}")


if __name__ == "__main__":
    main()
