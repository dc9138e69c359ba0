"""Choosing the recommended policy's parameters without fitting them to one sample of requests.

    python benchmarks/mlfq_tuning.py            # 48 configurations x 2 settings x 5 seeds (~10 min)
    python benchmarks/mlfq_tuning.py --quick    # 4 configurations, 2 seeds, 1,000 requests (~1 min)

The predictive MLFQ with preemption (`mlfq`, `within: mean`, `preempt: true`) has three knobs
that matter: `base_quantum`, `recompute_weight` and `quantum_ratio`. Gain capture moves by
+-0.2 between workload seeds of 3,000 requests (docs/policy-evidence.md), so a grid scored on the
benchmark's own workload would pick the luckiest point. Here:

- settings: the headline ones of `benchmarks/policies.py` (Azure code at 90 % load, Azure conv
  at 95 %, one instance, text-gbm trained as `presched train` trains it);
- SELECTION seeds 0, 1, 2: the configuration with the highest mean gain capture over both
  settings and the three seeds is chosen;
- VALIDATION seeds 3, 4: never used to choose; reported for the chosen configuration and for
  the references (`rank`, `mlfq+sjf`: mlfq without preemption).

Writes benchmarks/results/mlfq_tuning.json; prints the ranking, then
`figure: chosen_selection_gain_capture = ...`, `figure: chosen_validation_gain_capture = ...`
(mean over the validation seeds and both settings) and `figure: chosen_max_p99_vs_fcfs_code = ...`.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

sys.path.insert(0, str(Path(__file__).parent))
import policies as P  # the workloads, policy set and runner of the evidence benchmark

SETTINGS = (("code", 0.9), ("conv", 0.95))
SELECTION, VALIDATION = (0, 1, 2), (3, 4)
GRID = [{"base_quantum": bq, "recompute_weight": rw, "quantum_ratio": qr}
        for bq in (64, 96, 128, 192, 256, 384) for rw in (4.0, 5.0, 6.0, 8.0) for qr in (2.0, 3.0)]  # fmt: skip
REFERENCES = ("fcfs", "srpt-oracle", "rank", "mlfq+sjf")


def label(cfg: dict[str, float]) -> str:
    return f"bq{cfg['base_quantum']:g} rw{cfg['recompute_weight']:g} qr{cfg['quantum_ratio']:g}"


def measure(predictor, seeds, grid, n_req: int, progress) -> list[dict[str, Any]]:
    """One row per (seed, setting, policy): mean / P99 E2E, gain capture, P99 / FCFS."""
    rows = []
    task = progress.add_task("grid", total=len(seeds) * len(SETTINGS) * (len(grid) + len(REFERENCES)))
    for seed in seeds:
        for w, load in SETTINGS:
            reqs, est, sim, _ = P.headline_setting(w, load, seed, n_req, predictor)
            got = {}
            for name in REFERENCES:
                got[name] = P.run(reqs, *P.POLICY_SET[name], est, sim)
                progress.advance(task)
            for cfg in grid:
                got[label(cfg)] = P.run(reqs, "mlfq", {"within": "mean", "preempt": True, **cfg}, est, sim)
                progress.advance(task)
            fc, orc = got["fcfs"], got["srpt-oracle"]
            for name, r in got.items():
                rows.append({"seed": seed, "workload": w, "load": load, "policy": name,
                             "mean_e2el_ms": r["mean_e2el_ms"], "p99_e2el_ms": r["p99_e2el_ms"],
                             "gain_capture": P.capture(fc["mean_e2el_ms"], orc["mean_e2el_ms"], r["mean_e2el_ms"]),
                             "p99_vs_fcfs": r["p99_e2el_ms"] / fc["p99_e2el_ms"]})  # fmt: skip
    return rows


def score(rows, policy: str, seeds) -> float:
    vals = [r["gain_capture"] for r in rows if r["policy"] == policy and r["seed"] in seeds]
    return statistics.mean(vals) if vals else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="4 configurations, seeds 0 and 3, 1,000 requests")
    ap.add_argument("--predictor", default=None, help="a text-gbm file from `presched train` (default: train one)")
    ap.add_argument("--out", type=Path, default=P.OUT)
    args = ap.parse_args()
    console = Console()
    wall = time.perf_counter()
    grid, sel, val, n_req = GRID, SELECTION, VALIDATION, 3000
    if args.quick:
        grid, sel, val, n_req = GRID[:: len(GRID) // 4][:4], (0,), (3,), 1000
    predictor, _ = P.train_predictor(args.predictor, console)
    with Progress(console=console, transient=True) as progress:
        rows = measure(predictor, (*sel, *val), grid, n_req, progress)

    ranked = sorted((label(c) for c in grid), key=lambda n: -score(rows, n, sel))
    chosen = ranked[0]
    t = Table(title="gain capture, mean over code 90 % and conv 95 % (P99 ÷ FCFS: worst seed)")
    for c in ("configuration", "selection seeds", "validation seeds", "worst P99 ÷ FCFS, code", "conv"):
        t.add_column(c, justify="right")
    for name in [*ranked[:10], *REFERENCES[2:]]:
        worst = {w: max(r["p99_vs_fcfs"] for r in rows if r["policy"] == name and r["workload"] == w) for w, _ in SETTINGS}
        t.add_row(name + (" (chosen)" if name == chosen else ""), f"{score(rows, name, sel):.3f}",
                  f"{score(rows, name, val):.3f}", f"{worst['code']:.2f}", f"{worst['conv']:.2f}")  # fmt: skip
    console.print(t)
    figures = {
        "chosen_selection_gain_capture": score(rows, chosen, sel),
        "chosen_validation_gain_capture": score(rows, chosen, val),
        "chosen_max_p99_vs_fcfs_code": max(r["p99_vs_fcfs"] for r in rows if r["policy"] == chosen and r["workload"] == "code"),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    meta = {"command": " ".join(["python", "benchmarks/mlfq_tuning.py", *sys.argv[1:]]), "num_requests": n_req,
            "selection_seeds": sel, "validation_seeds": val, "wall_s": time.perf_counter() - wall}  # fmt: skip
    result = {"meta": meta, "chosen": chosen, "ranking": ranked, "rows": rows, "figures": figures}
    (args.out / "mlfq_tuning.json").write_text(json.dumps(result, indent=1))
    print(f"chosen: {chosen}")
    for k, v in figures.items():
        print(f"figure: {k} = {v:.4g}")


if __name__ == "__main__":
    main()
