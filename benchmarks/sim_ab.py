"""Simulator speed of two versions side by side: the working tree's `src` against a git commit's.

    python benchmarks/sim_ab.py [--base COMMIT] [--repeats 5] [--out benchmarks/results]

Both versions are imported into one process (the base from `git archive COMMIT src`, unpacked
in a temporary folder) and run on the same requests, alternating case by case and in turn
(ABBA), so that the load of a shared, noisy machine hits both alike; each case reports the best
of `--repeats` runs, wall (with the metric summary, as `sim_speed.py`) and CPU time, and checks
that both versions give the same results (steps, preemptions, hits, finish times). Cases: the
headline trace without caching, and `sim_speed.py`'s prefix-caching cases with and without
caching. Ends with `figure: sim_ab_speedup_<case> = base wall / new wall` lines.
"""

from __future__ import annotations

import argparse
import importlib
import json
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODULES = ("sim", "sim.config", "workload.config", "workload.shared_prefix", "workload.arrivals", "metrics")


def load(src: Path) -> dict:
    """The presched modules under `src`, imported afresh (the previous copy stays alive in the
    functions that hold it)."""
    for m in [m for m in sys.modules if m == "presched" or m.startswith("presched.")]:
        del sys.modules[m]
    sys.path.insert(0, str(src))
    try:
        return {n: importlib.import_module("presched." + n) for n in MODULES}
    finally:
        sys.path.remove(str(src))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="HEAD", help="git commit to compare against")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = ap.parse_args()

    tmp = Path(tempfile.mkdtemp(prefix="sim_ab_"))
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", args.base, "src"], check=True,
                             capture_output=True).stdout  # fmt: skip
    (tmp / "src.tar").write_bytes(archive)
    with tarfile.open(tmp / "src.tar") as tar:
        tar.extractall(tmp, filter="data")
    trees = {"base": load(tmp / "src"), "new": load(ROOT / "src")}
    m = trees["new"]
    W, SP = m["workload.config"].WorkloadConfig, m["workload.shared_prefix"].SharedPrefixConfig
    build = m["workload.config"].build_workload
    trace = build(W(source="azure-conv"))
    shared = build(W(source="azure-conv", shared_prefix=SP(system_prompts=8, system_prompt_tokens=512)))
    mc = build(W(source="mooncake-conv"))
    mc4 = m["workload.arrivals"].apply_arrivals(mc, [r.arrival * 4 for r in mc])
    cases = [("headline", trace, False), ("prefix", shared, True), ("prefix_off", shared, False),
             ("prefix_mooncake", mc4, True), ("mooncake_off", mc4, False)]  # fmt: skip
    wall: dict = {}
    cpu: dict = {}
    same: dict = {}
    for rep in range(args.repeats):
        for name, reqs, caching in cases:
            for t in ("base", "new") if rep % 2 == 0 else ("new", "base"):
                mm = trees[t]
                cfg = mm["sim"].SimConfig(engine=mm["sim.config"].EngineConfig(enable_prefix_caching=caching))
                t0, c0 = time.perf_counter(), time.process_time()
                res = mm["sim"].simulate(reqs, cfg)
                mm["metrics"].summarize(res.records, res.itl.values())
                wall.setdefault((t, name), []).append(time.perf_counter() - t0)
                cpu.setdefault((t, name), []).append(time.process_time() - c0)
                key = (res.num_steps, res.num_preemptions, res.prefix_hit_tokens,
                       res.records.finish.tobytes(), res.sim_seconds)  # fmt: skip
                same.setdefault(name, set()).add(key)
    rows = []
    for name, _, _ in cases:
        b, n = min(wall[("base", name)]), min(wall[("new", name)])
        sim_s = next(iter(same[name]))[4]
        rows.append({
            "case": name, "simulated_s": sim_s, "base_wall_s": b, "new_wall_s": n,
            "base_cpu_s": min(cpu[("base", name)]), "new_cpu_s": min(cpu[("new", name)]),
            "base_realtime_factor": sim_s / b, "new_realtime_factor": sim_s / n,
            "speedup_wall": b / n, "speedup_cpu": min(cpu[("base", name)]) / min(cpu[("new", name)]),
            "identical_results": len(same[name]) == 1,
        })  # fmt: skip
        r = rows[-1]
        print(f"{name:16s} base {b:.3f} s ({r['base_realtime_factor']:,.0f}x)  new {n:.3f} s "
              f"({r['new_realtime_factor']:,.0f}x)  wall {r['speedup_wall']:.2f}x  cpu "
              f"{r['speedup_cpu']:.2f}x  identical {r['identical_results']}")  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "sim_ab.json"
    path.write_text(json.dumps({"base": args.base, "repeats": args.repeats, "rows": rows}, indent=2))
    print(f"wrote {path}")
    for r in rows:
        print(f"figure: sim_ab_speedup_{r['case']} = {r['speedup_wall']:.2f}")


if __name__ == "__main__":
    main()
