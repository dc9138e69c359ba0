"""benchmarks/gateway_overhead.py's measurements: one run on idle servers with their CPU per
request, the latency repeats in rotated order and the rate ramp."""

from __future__ import annotations

import time
from typing import Any

from rich.progress import Progress

from gateway_overhead_load import Pool, make_bodies, poisson_arrivals, run_load
from gateway_overhead_servers import Servers, machine_busy_seconds

TARGETS = ("direct", "gateway", "gateway+log", "passthrough")
RAMP_TARGETS = ("direct", "gateway")
RAMP_RATES = (100, 200, 300, 400, 600, 800, 1000, 1200, 1600, 2000, 2500, 3000)



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
