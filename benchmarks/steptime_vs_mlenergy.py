"""Simulated vs measured: the roofline step time against ML.ENERGY, every family in a folder.

    python benchmarks/steptime_vs_mlenergy.py                  # the shared folder (~8 min)
    python benchmarks/steptime_vs_mlenergy.py --data DIR --out DIR   # any ML.ENERGY folder
    python benchmarks/steptime_vs_mlenergy.py --quick          # smoke run (~10 s)
    python benchmarks/steptime_vs_mlenergy.py --no-calibration # skip the Llama-3.1 refit

Every configuration in the folder (files `<org>__<model>__<task>.json`, any task) is first
checked for being expressible (`presched.sim.steptime.deployment`: a model preset for its id, a
hardware preset for its GPU, its TP/EP/DP, a KV cache that fits); the fraction is
`steptime_expressible_fraction` and each refusal is printed with the field it names. Each
expressible configuration (one vLLM deployment: max_num_seqs N, parallelism) is re-run in the
simulator the way ML.ENERGY ran it (mlenergy/benchmark, commit c1d6557; leaderboard data built
with ml-energy/data v0.3.1):

- a saturated engine: every request is sent at t = 0 (request rate inf), `max_num_seqs = N`
  (per data-parallel rank: N / dp), `max_num_batched_tokens = 8192`, chunked prefill, FCFS; the
  KV cache is sized from the model and GPU like vLLM at `gpu_memory_utilization = 0.9`;
- as many requests as ML.ENERGY sent: the task's num_requests (lm-arena-chat and
  sourcegraph-fim 1024, gpqa 198) x num_request_repeats (`ml_energy_num_requests`, from its
  sweep files: benchmarks/data/mlenergy_sweeps.json), with the task's max_tokens (4096, 2048,
  32768); the multimodal tasks are refused naming `task`;
- output lengths drawn (seeded) from that configuration's own output-length histogram, uniform
  within a bin;
- prompt lengths from an assumption per task (ML.ENERGY publishes none): lm-arena-chat
  lognormal, sigma 1.0, median 150 tokens (mean ~250), and median 500 (mean ~820) as the
  sensitivity case; gpqa median 250; sourcegraph-fim median 500; see `TASKS`, `PROMPTS` and
  docs/steptime.md.

Scoring is out of sample (steptime_lomo.py): per family (dense or MoE models on one GPU), the
roofline knobs are fitted on the family's other architectures and the simulator is run with
them on the held-out one (leave one architecture out); the figures are the median |ITL error|
(`steptime_median_itl_err_pct_dense`: dense H100, `_b200`: dense B200, `_moe`: every MoE
family pooled; `..._default`: today's default knobs).

The simulated run is then measured as ML.ENERGY measures it:

- output throughput over the *steady state*: from the moment N requests have received their
  first token to the moment `num_requests - N - 1` requests have finished (after that fewer
  than N requests remain and the batch drains); tokens generated in that window / its length;
- median ITL over *every* inter-token gap of every request of the whole run (ML.ENERGY takes it
  from the client's per-request ITL lists, ramp-up and ramp-down included); the median over the
  steady-state window only is reported beside it (`itl_steady`).

For the Llama-3.1 8B/70B H100 configurations (the original tables and figures) there are three
variants: the default roofline preset with the central prompt assumption ("default") and with
long prompts ("default-long"), and a "calibrated" preset whose `step_overhead` and
`overhead_per_decode` are fitted (`calibrate`, Gauss-Newton on the log errors) to the 8B rows
only, so that its 70B rows are out of sample.

Signed error = (simulated - measured) / measured. Writes `steptime_vs_mlenergy.json`, `.md`
and `.png` (+ `_families.png`) under `--out` (default benchmarks/results/; `--quick` writes
`steptime_vs_mlenergy_quick.*`) and ends with `figure: <name> = <value>`
lines. The core is `compare(config, ...)`, importable (tests/benchmarks/).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from presched.sim.steptime import MeasuredConfig, MLEnergyFormatError, StepTimeConfig, load_mlenergy
from presched.workload.paths import data_dir

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE / "results"
sys.path.insert(0, str(HERE))
from steptime_saturated import (  # noqa: E402  (a sibling module of this script)
    GPU,
    MODELS,
    PROMPTS,
    SHORT,
    TASK,
    TASKS,
    PromptAssumption,
    compare,
    not_expressible,
    make_requests,
    ml_energy_num_requests,
    run_saturated,
    step_time_config,
)

from steptime_report import VARIANTS, headline, markdown, plot  # noqa: E402

__all__ = ["PromptAssumption", "make_requests", "ml_energy_num_requests", "run_saturated",
           "step_time_config", "TASKS"]  # re-exported for tests and notebooks

# ---------------------------------------------------------------------------------------------
# Calibration: refit the roofline's two overhead knobs to the 8B measurements
# ---------------------------------------------------------------------------------------------

CALIBRATED_KNOBS = ("step_overhead", "overhead_per_decode")
"""Knobs `calibrate` fits. memory_efficiency is left at its default: on one model and one
workload (context per request ~ fixed) it is collinear with these two."""


def _residuals(configs: list[MeasuredConfig], knobs: dict[str, float], seed: int) -> np.ndarray:
    rows = [compare(c, step_overrides=knobs, seed=seed) for c in configs]
    return np.array(
        [math.log(r["simulated"]["median_itl_ms"] / r["measured"]["median_itl_ms"]) for r in rows]
        + [math.log(r["simulated"]["output_throughput"] / r["measured"]["output_throughput"])
           for r in rows]
    )


def calibrate(
    configs: list[MeasuredConfig], seed: int = 0, iterations: int = 4, on_iteration=None
) -> dict[str, Any]:
    """Least squares on log errors of median ITL and throughput over `configs` (central
    prompts), in `CALIBRATED_KNOBS`, by Gauss-Newton with forward-difference Jacobians (the
    simulated figures are close to linear in the two overheads). Knobs are kept >= 0.
    Returns the knobs, the RMS log error before/after and the iterations' history."""
    st = StepTimeConfig()
    x = np.array([getattr(st, k) for k in CALIBRATED_KNOBS], dtype=float)
    history = []
    r = _residuals(configs, dict(zip(CALIBRATED_KNOBS, x)), seed)
    rms0 = float(np.sqrt(np.mean(r**2)))
    for it in range(iterations):
        J = np.empty((len(r), len(x)))
        for j in range(len(x)):
            h = max(0.1 * abs(x[j]), 1e-6)
            xp = x.copy()
            xp[j] += h
            J[:, j] = (_residuals(configs, dict(zip(CALIBRATED_KNOBS, xp)), seed) - r) / h
        step, *_ = np.linalg.lstsq(J, -r, rcond=None)
        # backtrack until the cost drops (and the knobs stay >= 0)
        cost, lam = float(r @ r), 1.0
        while lam > 1e-3:
            xn = np.maximum(x + lam * step, 0.0)
            rn = _residuals(configs, dict(zip(CALIBRATED_KNOBS, xn)), seed)
            if float(rn @ rn) < cost:
                break
            lam /= 2
        else:
            break
        x, r = xn, rn
        history.append({k: float(v) for k, v in zip(CALIBRATED_KNOBS, x)}
                       | {"rms_log_err": float(np.sqrt(np.mean(r**2)))})
        if on_iteration:
            on_iteration(it)
        if np.all(np.abs(lam * step) <= 0.01 * np.maximum(np.abs(x), 1e-6)):
            break
    return {
        "knobs": {k: float(v) for k, v in zip(CALIBRATED_KNOBS, x)},
        "fitted_on": sorted({c.model_id for c in configs}),
        "rms_log_err_before": rms0,
        "rms_log_err_after": float(np.sqrt(np.mean(r**2))),
        "history": history,
    }


# ---------------------------------------------------------------------------------------------
# Driver: all configurations, table, plot, figures
# ---------------------------------------------------------------------------------------------

def data_root(data: Path) -> Path:
    """The folder of ML.ENERGY files: `data` itself, or its mlenergy-leaderboard-llm folder."""
    sub = data / "mlenergy-leaderboard-llm"
    return sub if sub.is_dir() else data


def load_configs(data: Path) -> list[MeasuredConfig]:
    """H100 lm-arena-chat configurations of the two Llama-3.1 models (the legacy tables)."""
    root = data_root(data)
    out: list[MeasuredConfig] = []
    for model_id in MODELS:
        out += load_mlenergy(root, model=model_id, gpu=GPU, task=TASK)
    return sorted(out, key=lambda c: (list(MODELS).index(c.model_id), c.max_num_seqs))


def config_key(c: MeasuredConfig) -> str:
    return f"{c.model_id}|{c.task}|{c.gpu_model}|{c.num_gpus}|{c.max_num_seqs}"


def quick_subset(configs: list[MeasuredConfig]) -> list[MeasuredConfig]:
    """--quick: the smallest max_num_seqs of every (model, GPU, GPU count)."""
    best: dict[tuple, MeasuredConfig] = {}
    for c in configs:
        k = (c.model_id, c.task, c.gpu_model, c.num_gpus)
        if k not in best or c.max_num_seqs < best[k].max_num_seqs:
            best[k] = c
    return sorted(best.values(), key=config_key)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--data", type=Path, default=None,
                    help="any folder of ML.ENERGY model files (<org>__<model>__<task>.json, "
                         "searched recursively), or the shared data folder holding "
                         "mlenergy-leaderboard-llm (default: presched.workload.paths.data_dir())")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT, help="output folder")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--task", default=None, help="only this task (default: every task)")
    ap.add_argument("--no-calibration", action="store_true",
                    help="skip the calibrated Llama-3.1 variant")
    ap.add_argument("--knob-set", default="auto",
                    choices=["auto", "base", "+compute", "+compute+layer"],
                    help="knobs the leave-one-model-out folds fit: auto (each fold picks a set "
                         "by an inner leave-one-model-out on its training models) or one set "
                         "for every fold (steptime_lomo.KNOB_SETS)")
    ap.add_argument("--quick", action="store_true",
                    help="smoke run: smallest max_num_seqs per deployment, 160 requests each, "
                         "no long-prompt or calibrated variants")
    args = ap.parse_args(argv)

    from rich.progress import Progress

    import steptime_lomo as lomo

    try:  # a missing folder, a malformed file or a --task nothing has: a message, exit code 2
        root = data_root(args.data or data_dir())
        every = load_mlenergy(root, task=args.task)
    except (MLEnergyFormatError, FileNotFoundError, LookupError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    refused = {config_key(c): why for c in every if (why := not_expressible(c)) is not None}
    ok = [c for c in every if config_key(c) not in refused]
    expressible = {"total": len(every), "ok": len(ok), "fraction": len(ok) / len(every),
                   "refused": refused}  # fmt: skip
    runs_on = quick_subset(ok) if args.quick else ok
    n_req = 160 if args.quick else None
    by_key = {config_key(c): c for c in runs_on}
    legacy = [c for c in runs_on if c.model_id in MODELS and c.gpu_model == GPU
              and c.task == TASK]  # fmt: skip
    variants = ["default"] if args.quick else [
        v for v in VARIANTS if not (args.no_calibration and VARIANTS[v][1])]
    fit_on = [c for c in legacy if SHORT[c.model_id] == "8b"]
    rows: list[dict[str, Any]] = []
    calib: dict[str, Any] | None = None
    t_start = time.perf_counter()

    def run(c: MeasuredConfig, variant: str, knobs: dict | None) -> dict:
        prompts = VARIANTS.get(variant, (None, False))[0]  # None: the task's assumption
        row = compare(c, prompts=prompts, seed=args.seed, step_overrides=knobs,
                      num_requests=n_req)  # fmt: skip
        return row | {"variant": variant, "key": config_key(c)}

    with Progress(transient=False) as progress:
        task = progress.add_task("default knobs", total=len(runs_on))
        for c in runs_on:
            progress.update(task, description=f"default: {c.model_id} {c.gpu_model} "
                                              f"N={c.max_num_seqs}")  # fmt: skip
            rows.append(run(c, "default", None))
            progress.advance(task)
        default_rows = list(rows)
        if "calibrated" in variants and fit_on:
            fit_task = progress.add_task("calibrating on 8B H100 (Gauss-Newton)", total=4)
            calib = calibrate(fit_on, seed=args.seed,
                              on_iteration=lambda it: progress.advance(fit_task))
            progress.update(fit_task, completed=4)
        extra = [(c, v) for v in variants if v != "default" for c in legacy
                 if v != "calibrated" or calib]  # fmt: skip
        if extra:
            task2 = progress.add_task("Llama-3.1 variants", total=len(extra))
            for c, v in extra:
                rows.append(run(c, v, calib["knobs"] if VARIANTS[v][1] else None))
                progress.advance(task2)
        folds_task = progress.add_task("leave one model out", total=None)
        def mean_prompt(c: MeasuredConfig) -> float:  # the task's assumption
            return TASKS[c.task].prompts.mean

        lomo_rows, folds = lomo.leave_one_model_out(
            default_rows, by_key, lambda c, k: run(c, "lomo", k), mean_prompt,
            on_fold=lambda fam, m: progress.update(folds_task, description=f"lomo {fam}: {m}"),
            knob_set=args.knob_set)
        family_knobs = lomo.fit_families(default_rows, by_key, mean_prompt)
    wall = time.perf_counter() - t_start

    args.out.mkdir(parents=True, exist_ok=True)
    legacy_rows = [r for r in rows if r["model"] in SHORT.values() and r["gpu"] == GPU]
    figures = {"steptime_expressible_fraction": expressible["fraction"]}
    figures |= lomo.family_figures(default_rows, lomo_rows)
    figures |= headline(legacy_rows)
    payload = {
        "generated_by": "python benchmarks/steptime_vs_mlenergy.py " + " ".join(argv or sys.argv[1:]),
        "knob_set": args.knob_set,
        "source": f"ML.ENERGY leaderboard v3 files under {root}",
        "prompt_assumptions": {k: vars(v) | {"mean": v.mean} for k, v in PROMPTS.items()},
        "tasks": {t: vars(v) | {"prompts": v.prompts.name} for t, v in TASKS.items()},
        "variants": {k: {"prompts": p, "calibrated": c} for k, (p, c) in VARIANTS.items()},
        "expressible": expressible,
        "calibration": calib,
        "lomo_folds": folds,
        "family_knobs": family_knobs,
        "figures": figures,
        "wall_s": wall,
        "rows": rows + lomo_rows,
    }
    name = "steptime_vs_mlenergy" + ("_quick" if args.quick else "")
    (args.out / f"{name}.json").write_text(json.dumps(payload, indent=1) + "\n")
    md = (markdown(legacy_rows, calib) if legacy_rows else "")
    md += lomo.family_markdown(default_rows, lomo_rows, folds, expressible)
    (args.out / f"{name}.md").write_text(md)
    if legacy_rows:
        plot(legacy_rows, args.out / f"{name}.png")
    lomo.plot_families(default_rows, lomo_rows, args.out / f"{name}_families.png")
    print(f"wrote {args.out}/{name}.{{json,md,png}} ({len(rows) + len(lomo_rows)} runs, "
          f"{wall:.0f} s)")
    for why in sorted(refused.values()):
        print(f"not expressible: {why}")
    for fam, fit in family_knobs.items():  # presets.KNOB_PRESETS comes from these
        print(f"family knobs {fam} ({fit['knob_set']}, {len(fit['architectures'])} "
              f"architectures): " + ", ".join(f"{k} = {v:.4g}" for k, v in fit["knobs"].items()))
    if calib:
        print("calibrated on 8B: " + ", ".join(f"{k} = {v * 1e6:.1f} us"
                                                 for k, v in calib["knobs"].items()))
    for name_, value in figures.items():
        print(f"figure: {name_} = {value:.3f}" if name_ == "steptime_expressible_fraction"
              else f"figure: {name_} = {value:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
