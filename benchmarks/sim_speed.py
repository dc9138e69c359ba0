"""Simulator speed: simulated seconds per wall second, and simulated requests per wall second.

    python benchmarks/sim_speed.py [--repeats 5] [--out benchmarks/results]

Replays the full Azure LLM 2023 conversation trace (19,366 requests, ~58 min) through the
simulator with every feature on: paged KV blocks (28k blocks of 16 tokens, Llama-3.1-8B on one
H100), chunked prefill (8192-token budget), vLLM v1 step semantics, per-request timestamps and
the inter-token-latency log; the timed work includes building the per-request records and the
full metric summary. Configurations:

- 1 instance at the trace's own rate (the headline figure);
- 8 instances (least-requests router) at the trace's own rate;
- 8 instances with the trace sped up 8x (the same per-instance load as one instance);
- 1 instance with fast-forward off (every step simulated), to show what event jumping buys;
- prefix caching on (`figure: sim_realtime_factor_prefix`): 1 instance, the same trace with
  8 shared system prompts of 512 tokens (`workload.shared_prefix`, Zipf popularity, 16-token
  block hashes: 1 cache unit per block, the finest case), beside the same requests with caching
  off (their prompts are 512 tokens longer, so that run is not the headline's);
- prefix caching on, 1 instance, the Mooncake conversation trace with its own 512-token hashes
  at a quarter of its rate (the per-instance load of benchmarks/prefix.py), beside caching off.

Each configuration runs `--repeats` times; the best run is reported (the machine is shared
and noisy; best-of-N is the usual estimate of the undisturbed cost) with the median beside it.
Ends with `figure: name = value` lines.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from presched.metrics import summarize
from presched.sim import SimConfig, simulate
from presched.sim.config import EngineConfig
from presched.workload.arrivals import apply_arrivals
from presched.workload.config import WorkloadConfig, build_workload
from presched.workload.shared_prefix import SharedPrefixConfig


def timed_run(requests, cfg: SimConfig) -> tuple[float, float, int, float]:
    t = time.perf_counter()
    res = simulate(requests, cfg)
    summarize(res.records, res.itl.values())
    wall = time.perf_counter() - t
    return wall, res.sim_seconds, res.num_steps, res.prompt_hit_rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = ap.parse_args()

    trace = build_workload(WorkloadConfig(source="azure-conv"))
    fast8 = apply_arrivals(trace, [r.arrival / 8 for r in trace])
    shared = build_workload(WorkloadConfig(source="azure-conv", shared_prefix=SharedPrefixConfig(
        system_prompts=8, system_prompt_tokens=512)))  # fmt: skip
    mc = build_workload(WorkloadConfig(source="mooncake-conv"))
    mc4 = apply_arrivals(mc, [r.arrival * 4 for r in mc])
    caching = SimConfig(engine=EngineConfig(enable_prefix_caching=True))
    cases = [
        ("1 instance", trace, SimConfig()),
        ("8 instances", trace, SimConfig(num_instances=8, router="least-requests")),
        ("8 instances, 8x rate", fast8, SimConfig(num_instances=8, router="least-requests")),
        ("1 instance, no fast-forward", trace, SimConfig(fast_forward=False)),
        ("1 instance, system prompts, prefix caching", shared, caching),
        ("1 instance, system prompts, no caching", shared, SimConfig()),
        ("1 instance, Mooncake / 4, prefix caching", mc4, caching),
        ("1 instance, Mooncake / 4, no caching", mc4, SimConfig()),
    ]
    rows = []
    with Progress(transient=True) as prog:
        task = prog.add_task("simulating", total=len(cases) * args.repeats)
        for name, reqs, cfg in cases:
            repeats = args.repeats if cfg.fast_forward else max(1, args.repeats // 2)
            walls = []
            for _ in range(repeats):
                wall, sim_s, steps, hit = timed_run(reqs, cfg)
                walls.append(wall)
                prog.advance(task)
            best = min(walls)
            rows.append({
                "case": name, "requests": len(reqs), "instances": cfg.num_instances,
                "simulated_s": sim_s, "engine_steps": steps, "wall_s_best": best,
                "wall_s_median": statistics.median(walls), "realtime_factor": sim_s / best,
                "realtime_factor_median": sim_s / statistics.median(walls),
                "requests_per_s": len(reqs) / best, "us_per_step": 1e6 * best / steps,
                "prompt_hit_rate": hit,
            })  # fmt: skip

    table = Table(title="presched simulator speed — Azure conv trace (and Mooncake), Llama-3.1-8B on H100")
    for col in ("case", "requests", "simulated s", "engine steps", "wall s (best / median)",
                "× real time (best / median)", "requests / wall s", "µs / step", "hit rate"):  # fmt: skip
        table.add_column(col, justify="left" if col == "case" else "right")
    for r in rows:
        table.add_row(r["case"], str(r["requests"]), f"{r['simulated_s']:.0f}", f"{r['engine_steps']:,}",
                      f"{r['wall_s_best']:.3f} / {r['wall_s_median']:.3f}",
                      f"{r['realtime_factor']:,.0f} / {r['realtime_factor_median']:,.0f}",
                      f"{r['requests_per_s']:,.0f}", f"{r['us_per_step']:.1f}",
                      f"{r['prompt_hit_rate']:.3f}")  # fmt: skip
    Console(width=160).print(table)

    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "sim_speed.json"
    path.write_text(json.dumps({"repeats": args.repeats, "rows": rows}, indent=2))
    print(f"wrote {path}")
    head = rows[0]
    print(f"figure: sim_realtime_factor = {head['realtime_factor']:.0f}")
    print(f"figure: sim_requests_per_s = {head['requests_per_s']:.0f}")
    by = {r["case"]: r for r in rows}
    print(f"figure: sim_realtime_factor_prefix = "
          f"{by['1 instance, system prompts, prefix caching']['realtime_factor']:.0f}")
    print(f"figure: sim_realtime_factor_prefix_mooncake = "
          f"{by['1 instance, Mooncake / 4, prefix caching']['realtime_factor']:.0f}")


if __name__ == "__main__":
    main()
