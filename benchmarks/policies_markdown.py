"""docs/policy-evidence.md's tables, rendered from `benchmarks/policies.py`'s JSON.

    python benchmarks/policies_markdown.py                          # benchmarks/results/policies.json
    python benchmarks/policies_markdown.py --json other.json

Prints Markdown, one section per table of the evidence page (headline settings, seeds,
4 instances, noise sweep, knobs, routers), every number derived from the JSON only, so the page
can be regenerated after each run instead of copied by hand. Gain capture = (FCFS - policy) /
(FCFS - srpt-oracle) on mean E2E, against the FCFS and srpt-oracle rows of the same workload,
load, instance count and seed; "n/a" where FCFS equals the oracle.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import policies as P  # the evidence benchmark: its row lookup and gain capture

RESULTS = Path(__file__).parent / "results" / "policies.json"
SETTINGS = (("code", 0.9), ("conv", 0.95), ("mooncake", 0.9))
SEEDED = (("code", 0.9), ("conv", 0.95))
MULTI = ("fcfs", "srpt-oracle", "rank", "srpt", "mlfq-preempt+sjf")


def pick(rows, w: str, load: float, policy: str, inst: int = 1, seed: int = 0):
    """`policies.pick`, of workload seed 0 unless told (the seeds table mixes seeds)."""
    return P.pick(rows, w, load, policy, inst, seed)


def fmt_cap(x: float) -> str:
    return "n/a" if x != x else f"{x:.2f}"


def table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def settings_tables(rows) -> str:
    out = []
    for w, load in SETTINGS:
        fc, orc = pick(rows, w, load, "fcfs"), pick(rows, w, load, "srpt-oracle")
        if not fc or not orc:
            continue
        body = []
        for r in rows:
            if (r["workload"], r["load"], r["instances"], r.get("seed", 0)) != (w, load, 1, 0):
                continue
            cap = P.capture(fc["mean_e2el_ms"], orc["mean_e2el_ms"], r["mean_e2el_ms"])
            body.append([r["policy"], f"{r['mean_e2el_ms'] / 1e3:.2f}", f"{r['p99_e2el_ms'] / 1e3:.1f}",
                         f"{r['short_p99_e2el_ms'] / 1e3:.2f}", f"{r['long_p99_queue_wait_ms'] / 1e3:.1f}",
                         f"{r['mean_ttft_ms'] / 1e3:.2f}", str(r["preemptions"]), fmt_cap(cap),
                         f"{r['p99_e2el_ms'] / fc['p99_e2el_ms']:.2f}"])  # fmt: skip
        out.append(f"### {w}, load {load:.2f}, 1 instance\n\n" + table(
            ["policy", "mean E2E s", "P99 E2E s", "short P99 s", "long P99 wait s", "mean TTFT s", "preemptions",
             "gain capture", "P99 / FCFS"], body))  # fmt: skip
    return "\n\n".join(out)


def seeds_table(rows, seed_rows) -> str:
    every = rows + seed_rows
    seeds = sorted({r.get("seed", 0) for r in every})
    policies = [r["policy"] for r in rows if (r["workload"], r["load"], r["instances"], r.get("seed", 0)) == ("code", 0.9, 1, 0)
                and "|" not in r["policy"]]  # fmt: skip
    header = ["policy"]
    for w, load in SEEDED:
        header += [f"{w} {load:g} s{s}" for s in seeds] + [f"{w} mean"]
    body = []
    for p in policies:
        line = [p]
        for w, load in SEEDED:
            caps = []
            for s in seeds:
                fc, orc, r = (pick(every, w, load, q, seed=s) for q in ("fcfs", "srpt-oracle", p))
                if not (fc and orc and r):
                    line.append("—")
                    continue
                caps.append(P.capture(fc["mean_e2el_ms"], orc["mean_e2el_ms"], r["mean_e2el_ms"]))
                line.append(f"{caps[-1]:.2f} ({r['p99_e2el_ms'] / fc['p99_e2el_ms']:.2f}x)")
            line.append(f"{statistics.mean(caps):.2f}" if caps else "—")
        body.append(line)
    return "## Three workload seeds: gain capture (P99 ÷ FCFS), headline settings\n\n" + table(header, body)


def multi_tables(rows, loads) -> str:
    out = ["## 4 instances (router least-requests): mean E2E s (gain capture)"]
    for w in ("conv", "code", "mooncake"):
        body = []
        for p in MULTI:
            line = [p]
            for load in loads:
                fc, orc, r = (pick(rows, w, load, q, inst=4) for q in ("fcfs", "srpt-oracle", p))
                line.append(f"{r['mean_e2el_ms'] / 1e3:.2f} ({fmt_cap(P.capture(fc['mean_e2el_ms'], orc['mean_e2el_ms'], r['mean_e2el_ms']))})"
                            if fc and orc and r else "—")  # fmt: skip
            body.append(line)
        out.append(f"{w}:\n\n" + table(["policy", *(f"{x:.2f}" for x in loads)], body))
    return "\n\n".join(out)


def noise_table(rows, sweep) -> str:
    policies = sorted({s["policy"] for s in sweep})
    keys = list(dict.fromkeys((s["workload"], s["load"], s["sigma"]) for s in sweep))
    body = []
    for w, load, sigma in keys:
        fc, orc = pick(rows, w, load, "fcfs"), pick(rows, w, load, "srpt-oracle")
        here = {s["policy"]: s for s in sweep if (s["workload"], s["load"], s["sigma"]) == (w, load, sigma)}
        tau = next(iter(here.values()))["tau"]
        body.append([f"{w} {load:g}", str(sigma), f"{tau:.2f}", *(
            fmt_cap(P.capture(fc["mean_e2el_ms"], orc["mean_e2el_ms"], here[p]["mean_e2el_ms"])) if p in here else "—"
            for p in policies)])  # fmt: skip
    return ("## Noise sweep: accuracy → gain (noisy oracle, gain capture)\n"
            "![noise sweep](../benchmarks/results/policies-noise-sweep.png)\n\n"
            + table(["workload", "sigma", "tau-b", *policies], body))  # fmt: skip


def knob_table(rows, pareto) -> str:
    fc, orc = pick(rows, "code", 0.9, "fcfs"), pick(rows, "code", 0.9, "srpt-oracle")
    body = [[k["policy"], f"{k['knob']}={k['value']:g}", f"{k['mean_e2el_ms'] / 1e3:.2f}", f"{k['p99_e2el_ms'] / 1e3:.1f}",
             f"{k['p99_e2el_ms'] / fc['p99_e2el_ms']:.2f}", fmt_cap(P.capture(fc["mean_e2el_ms"], orc["mean_e2el_ms"], k["mean_e2el_ms"]))]
            for k in pareto]  # fmt: skip
    return ("## Each policy's knob (code 90 %, seed 0, real predictions)\n"
            "![pareto](../benchmarks/results/policies-pareto.png)\n\n"
            + table(["policy", "knob", "mean E2E s", "P99 E2E s", "P99/FCFS", "capture"], body))  # fmt: skip


def router_table(routing) -> str:
    body = [[r["router"], r["policy"], f"{r['mean_e2el_ms'] / 1e3:.2f}", f"{r['p99_e2el_ms'] / 1e3:.1f}",
             f"{r['short_p99_e2el_ms'] / 1e3:.2f}"] for r in routing]  # fmt: skip
    return "## Routers (code 90 %, 4 instances)\n\n" + table(["router", "policy", "mean E2E s", "P99 E2E s", "short P99 s"], body)


def render(result: dict) -> str:
    rows = result["rows"]
    parts = [settings_tables(rows), seeds_table(rows, result.get("seed_rows", [])),
             multi_tables(rows, result["meta"]["loads"]), noise_table(rows, result["noise_sweep"]),
             knob_table(rows, result["pareto"]), router_table(result["routing"])]  # fmt: skip
    return "\n\n".join(parts) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, default=RESULTS, help="a policies.json written by benchmarks/policies.py")
    args = ap.parse_args()
    if not args.json.exists():
        raise SystemExit(f"--json: {args.json} does not exist; run benchmarks/policies.py first")
    print(render(json.loads(args.json.read_text())), end="")


if __name__ == "__main__":
    main()
