"""Prefix caching and prefix-aware routing on the Mooncake conversation trace.

    python benchmarks/prefix.py [--limit N] [--seeds 3] [--out benchmarks/results]

The whole Mooncake conversation trace (12,031 requests, ~1 h of Kimi traffic, prompts of 12k
tokens on average, every one starting with the same 512-token block) at its own arrival times,
with its own block hashes (`hash_ids`: 512-token blocks), on 4 Llama-3.1-8B instances on H100s
(vLLM v1 semantics, FCFS inside each instance, automatic prefix caching on: 16-token blocks,
a 512-token hash = one cache unit of 32 blocks). Routers:

- `round-robin`, `least-work` (predicted outstanding work), and `round-robin` with caching off;
- `prefix-only`: `prefix-affinity` (best prefix match when it covers >= 50 % of the prompt,
  SGLang's cache_threshold; else the fewest outstanding requests);
- `prefix-sticky`: `prefix-affinity` with min_match 0 (follows any match);
- `prefix-load`: `prefix-work` with work_weight 0 (llm-d's prefix + queue + KV profile);
- `prefix-work`: prefix 3 + predicted work 2 + queue 1 + KV 1 (llm-d-style weights).

The trace has no prompt text, so predictions are the noisy oracle at text-gbm's measured
accuracy (true lengths x log-normal error, sigma 0.79: the Kendall tau-b 0.434 text-gbm reaches
on CASTILLO test prompts, as `presched bench` uses); routers that read predictions run once per
noise seed (`--seeds`) and report the mean over seeds (and each seed's value).

Hit rate = the prompt hit rate: prompt tokens found cached at each request's first admission /
prompt tokens (a preempted request's recompute hitting its own blocks does not count; vLLM's own
rate, which counts it, is in the JSON as `vllm_hit_rate`).

A second, synthetic scenario shows the other regime, where most of a prompt is shareable: the
first `--synthetic-requests` (8000) requests of the Azure conversation trace with 16 shared
system prompts of 2,048 tokens (Zipf popularity) and multi-turn conversations (mean 4 turns:
`workload.shared_prefix`, 16-token hashes), arrivals sped up 3x so that 4 instances are busy;
the same routers but the sticky one and caching off, one noise seed (JSON `synthetic`, figure
`prefix_work_over_prefix_load_mean_e2e_synthetic`).

Writes benchmarks/results/prefix.json and prefix.png; ends with the `figure:` lines.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from presched.predict.noisy_oracle import noisy_oracle
from presched.sim import SimConfig, simulate
from presched.workload.arrivals import apply_arrivals
from presched.workload.config import WorkloadConfig, build_workload
from presched.workload.shared_prefix import SharedPrefixConfig

SIGMA = 0.79
INSTANCES = 4
CASES = [  # name, router, router params, caching, reads predictions
    ("round-robin, no cache", "round-robin", {}, False, False),
    ("round-robin", "round-robin", {}, True, False),
    ("least-work", "least-work", {}, True, True),
    ("prefix-only", "prefix-affinity", {}, True, False),
    ("prefix-sticky", "prefix-affinity", {"min_match": 0.0}, True, False),
    ("prefix-load", "prefix-work", {"work_weight": 0.0}, True, False),
    ("prefix-work", "prefix-work", {}, True, True),
]


def run_case(reqs, router, params, caching, estimates) -> dict:
    cfg = SimConfig(num_instances=INSTANCES, router=router, router_params=params,
                    engine=dict(enable_prefix_caching=caching))  # fmt: skip
    t = time.perf_counter()
    res = simulate(reqs, cfg, estimates=estimates)
    r = res.records
    return {
        "mean_e2e_s": float(r.e2el.mean()), "p99_e2e_s": float(np.quantile(r.e2el, 0.99)),
        "mean_ttft_s": float(r.ttft.mean()), "p99_ttft_s": float(np.quantile(r.ttft, 0.99)),
        "hit_rate": res.prompt_hit_rate, "vllm_hit_rate": res.prefix_hit_rate,
        "prefill_tokens_saved": res.prefix_hit_tokens, "preemptions": res.num_preemptions,
        "requests_per_instance": [int((r.instance == i).sum()) for i in range(INSTANCES)],
        "wall_s": time.perf_counter() - t,
    }  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--limit", type=int, default=None, help="first N requests only (tests)")
    ap.add_argument("--seeds", type=int, default=3, help="prediction-noise seeds")
    ap.add_argument("--synthetic-requests", type=int, default=8000, help="0: skip the synthetic scenario")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = ap.parse_args()

    reqs = build_workload(WorkloadConfig(source="mooncake-conv", num_requests=args.limit))
    ests = [noisy_oracle(reqs, SIGMA, seed) for seed in range(args.seeds)]
    rows = []
    for name, router, params, caching, predicts in CASES:
        runs = [run_case(reqs, router, params, caching, e) for e in (ests if predicts else [None])]
        row = {"case": name, "router": router, "router_params": params, "caching": caching,
               "seeds": len(runs), "per_seed": runs if predicts else None}  # fmt: skip
        for key in runs[0]:
            if key != "requests_per_instance":
                row[key] = statistics.fmean(run[key] for run in runs)
        row["requests_per_instance"] = runs[0]["requests_per_instance"]
        rows.append(row)
        print(f"{name}: mean E2E {row['mean_e2e_s']:.2f} s, hit rate {row['hit_rate']:.3f}", flush=True)

    synthetic = []
    if args.synthetic_requests:
        syn = build_workload(WorkloadConfig(
            source="azure-conv", num_requests=args.synthetic_requests,
            shared_prefix=SharedPrefixConfig(system_prompts=16, system_prompt_tokens=2048,
                                             mean_turns=4)))  # fmt: skip
        syn = apply_arrivals(syn, [r.arrival / 3 for r in syn])
        est = noisy_oracle(syn, SIGMA, 0)
        for name, router, params, caching, predicts in CASES:
            if name in ("round-robin, no cache", "prefix-sticky"):
                continue
            row = {"case": name, "router": router, "router_params": params,
                   **run_case(syn, router, params, caching, est if predicts else None)}  # fmt: skip
            synthetic.append(row)
            print(f"synthetic {name}: mean E2E {row['mean_e2e_s']:.2f} s, hit rate "
                  f"{row['hit_rate']:.3f}", flush=True)  # fmt: skip

    by = {r["case"]: r for r in rows}
    figures = {
        "prefix_hit_rate_best": max(r["hit_rate"] for r in rows),
        "rr_over_prefix_work_mean_e2e": by["round-robin"]["mean_e2e_s"] / by["prefix-work"]["mean_e2e_s"],
        "prefix_work_over_prefix_only_mean_e2e": by["prefix-only"]["mean_e2e_s"] / by["prefix-work"]["mean_e2e_s"],
        "prefix_work_over_prefix_load_mean_e2e": by["prefix-load"]["mean_e2e_s"] / by["prefix-work"]["mean_e2e_s"],
    }  # fmt: skip
    if synthetic:
        sy = {r["case"]: r for r in synthetic}
        figures["prefix_work_over_prefix_load_mean_e2e_synthetic"] = (
            sy["prefix-load"]["mean_e2e_s"] / sy["prefix-work"]["mean_e2e_s"])

    table = Table(title=f"Mooncake conversation trace ({len(reqs)} requests), {INSTANCES} x "
                        "Llama-3.1-8B on H100, FCFS, prefix caching")  # fmt: skip
    for col in ("case", "mean E2E s", "P99 E2E s", "mean TTFT s", "P99 TTFT s", "hit rate",
                "preempt", "requests per instance"):  # fmt: skip
        table.add_column(col, justify="left" if col == "case" else "right")
    for r in rows + [dict(s, case="synthetic: " + s["case"]) for s in synthetic]:
        table.add_row(r["case"], f"{r['mean_e2e_s']:.2f}", f"{r['p99_e2e_s']:.2f}",
                      f"{r['mean_ttft_s']:.2f}", f"{r['p99_ttft_s']:.2f}", f"{r['hit_rate']:.3f}",
                      f"{r['preemptions']:.0f}", " ".join(map(str, r["requests_per_instance"])))  # fmt: skip
    Console(width=170).print(table)

    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "prefix.json"
    path.write_text(json.dumps({"requests": len(reqs), "instances": INSTANCES, "sigma": SIGMA,
                                "rows": rows, "synthetic": synthetic, "figures": figures},
                               indent=2))  # fmt: skip
    _plot(rows, args.out / "prefix.png")
    print(f"wrote {path}")
    for k, v in figures.items():
        print(f"figure: {k} = {v:.3f}")


def _plot(rows, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in rows if r["mean_e2e_s"] < 10 * min(x["mean_e2e_s"] for x in rows)]
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    names = [r["case"] for r in shown]
    a.barh(names, [r["mean_e2e_s"] for r in shown], color="tab:blue")
    a.set_xlabel("mean E2E latency (s)")
    a.invert_yaxis()
    b.barh(names, [r["hit_rate"] for r in shown], color="tab:green")
    b.set_xlabel("prompt hit rate")
    b.invert_yaxis()
    b.set_yticklabels([])
    left = [r["case"] for r in rows if r not in shown]
    fig.suptitle("Mooncake conversation, 4 instances" + (f" (not shown, >10x: {', '.join(left)})" if left else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
