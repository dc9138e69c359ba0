"""Simulator cost in instructions: one `simulate` + `summarize` of a `sim_speed.py` case, counted.

    python benchmarks/sim_instructions.py [--case prefix] [--src src]

Runs this script under `valgrind --tool=cachegrind --cache-sim=no` twice, building the case's
workload as `sim_speed.py` does and then simulating it once and zero times, and prints the
difference: the instructions of one run, without the imports and the workload build. Wall time on
a shared machine moves by ±10 % between runs; this count moves by well under 0.1 % (with
`PYTHONHASHSEED=0` and one BLAS thread, set here). `--src` picks the source tree (e.g. a `git
worktree` of another commit) for before/after counts. Cases: `headline` (1 instance, no caching),
`prefix` (system prompts, prefix caching: `sim_realtime_factor_prefix`), `prefix_off` (the same
requests, caching off), `mooncake` (Mooncake / 4, prefix caching). Ends with a `figure:` line.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

CASES = ("headline", "prefix", "prefix_off", "mooncake")


def child(case: str, runs: int) -> None:
    from presched.metrics import summarize
    from presched.sim import SimConfig, simulate
    from presched.sim.config import EngineConfig
    from presched.workload.arrivals import apply_arrivals
    from presched.workload.config import WorkloadConfig, build_workload
    from presched.workload.shared_prefix import SharedPrefixConfig

    if case == "headline":
        reqs = build_workload(WorkloadConfig(source="azure-conv"))
    elif case.startswith("prefix"):
        reqs = build_workload(WorkloadConfig(source="azure-conv", shared_prefix=SharedPrefixConfig(
            system_prompts=8, system_prompt_tokens=512)))  # fmt: skip
    else:
        mc = build_workload(WorkloadConfig(source="mooncake-conv"))
        reqs = apply_arrivals(mc, [r.arrival * 4 for r in mc])
    cfg = SimConfig(engine=EngineConfig(enable_prefix_caching=case in ("prefix", "mooncake")))
    for _ in range(runs):
        res = simulate(reqs, cfg)
        summarize(res.records, res.itl.values())


def count(case: str, runs: int, src: Path) -> int:
    env = dict(os.environ, PYTHONPATH=str(src), PYTHONHASHSEED="0", OMP_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1")  # fmt: skip
    out = subprocess.run(
        ["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
         sys.executable, __file__, "--child", case, str(runs)],
        env=env, capture_output=True, text=True, check=True,
    ).stderr  # fmt: skip
    return int(re.search(r"I\s+refs:\s+([\d,]+)", out).group(1).replace(",", ""))


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        child(sys.argv[2], int(sys.argv[3]))
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--case", choices=CASES, default="prefix")
    ap.add_argument("--src", type=Path, default=Path(__file__).resolve().parent.parent / "src")
    args = ap.parse_args()
    base, one = count(args.case, 0, args.src), count(args.case, 1, args.src)
    print(f"{args.case}: {one - base:,} instructions in one run ({one:,} with it, {base:,} without)")
    print(f"figure: sim_instructions_{args.case} = {(one - base) / 1e9:.3f} G")


if __name__ == "__main__":
    main()
