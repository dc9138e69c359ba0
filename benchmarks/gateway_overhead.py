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
HTTP/1.1 client (gateway_overhead_load.py: raw asyncio streams, keep-alive pool), not
`presched replay`: its own cost is paid equally on the direct path, so "added" = gateway -
direct, measured by the same generator in the same repeat. Latency = from writing the request to the end of the response
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
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

sys.path.insert(0, str(Path(__file__).parent))  # its parts: gateway_overhead_*.py beside it
from gateway_overhead_load import (  # noqa: F401 - Pool ... response_ok: tested from here
    MAX_TOKENS, Pool, make_bodies, poisson_arrivals, response_ok)
from gateway_overhead_measure import RAMP_RATES, TARGETS, bench
from gateway_overhead_report import UPSTREAM, figures_of, max_rates, plot, summarize_runs, table
from gateway_overhead_servers import Servers

OUT = Path(__file__).parent / "results"


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
