"""Leave-one-model-out scoring of the roofline step time on ML.ENERGY (used by
benchmarks/steptime_vs_mlenergy.py; importable on its own).

Families: dense and MoE models by GPU ('dense-h100', 'dense-b200', 'moe-h100', 'moe-b200'); the
MoE figure pools the MoE families, each configuration scored in its own.
For each family and each model m in it, the roofline knobs `KNOBS` are fitted on the family's
other models and the simulator is then run, with those knobs, on m's configurations: every
reported error is out of sample. A "model" here is an architecture (`HELD_OUT`): checkpoints of
one shape and number format are held out together. A family with one has no out-of-sample score.

Which knobs are fitted is itself chosen without the held-out model: each fold runs an inner
leave-one-model-out on its training models for each candidate set in `KNOB_SETS` (base:
step_overhead, overhead_per_decode, memory_efficiency, collective_latency; then
+compute_efficiency; then +overhead_per_layer) and keeps, by the one-standard-error rule, the
set with the fewest knobs whose mean inner error (per architecture) is within one standard
error of the best (base when fewer than 3 training models).

The fit needs thousands of evaluations, too many for full simulations, so it uses a surrogate
calibrated by one full simulation per configuration (the default knobs' run):

    itl_c(knobs) ~ rho_c * step_time(decode-only, B_c, B_c * ctx_c; knobs)
    rho_c        = simulated median ITL (default knobs) / the same step time (default knobs)

with B_c the measured average batch per data-parallel rank and ctx_c the mean context of a
running request (mean prompt + E[L^2] / (2 E[L]) generated tokens: a running request is caught
with probability proportional to its output length L). rho_c carries what the decode step
alone misses (prefill chunks in mixed steps, the drain at the end of the run). The knobs
minimise sum_c soft_l1(log(itl_c / measured_c)) (scipy least_squares, f_scale 0.1: a few
anomalous measurements, e.g. Llama-3.1-8B on B200 at max_num_seqs 128, do not dominate).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
from scipy.optimize import least_squares

from presched.sim.steptime import MeasuredConfig, RooflineStepModel, StepTimeConfig
from presched.sim.steptime.deployment import deployment_config

# knob -> (unit it is fitted in, lower, upper bound in that unit)
KNOB_RANGES = {
    "step_overhead": (1e-3, 0.0, 20.0),  # ms
    "overhead_per_decode": (1e-6, 0.0, 300.0),  # us
    "memory_efficiency": (1.0, 0.2, 1.0),
    "collective_latency": (1e-6, 0.0, 300.0),  # us
    "compute_efficiency": (1.0, 0.1, 1.0),
    "overhead_per_layer": (1e-6, 0.0, 300.0),  # us
}
BASE_KNOBS = ("step_overhead", "overhead_per_decode", "memory_efficiency", "collective_latency")
KNOB_SETS = {  # candidates; each fold picks one by an inner leave-one-model-out on its training set
    "base": BASE_KNOBS,
    "+compute": BASE_KNOBS + ("compute_efficiency",),
    "+compute+layer": BASE_KNOBS + ("compute_efficiency", "overhead_per_layer"),
}
KNOBS = tuple(KNOB_RANGES)
FIGURE_OF_FAMILY = {"dense": ("dense-h100",), "b200": ("dense-b200",),
                    "moe": ("moe-h100", "moe-b200", "moe-h200"), "moe_h100": ("moe-h100",),
                    "moe_b200": ("moe-b200",)}  # fmt: skip
"""Figure suffix -> the families it pools (each configuration scored in its own family)."""
PER_GPU_FIGURES = ("moe_h100", "moe_b200")
"""Printed only when the folder holds that GPU's MoE runs (the others print nan when empty)."""
HELD_OUT = "architecture"
"""What a fold holds out: every model of one architecture (rows' `architecture`: the presets of
one shape and number format), so that no fold trains on a twin of its held-out model (Llama 3.1
/ 3.3 70B, Qwen3 Instruct / Thinking / Coder, DeepSeek V3.1 / R1)."""


def default_knobs() -> dict[str, float]:
    st = StepTimeConfig()
    hw_latency = st.hardware_spec().interconnect_latency
    return {k: (hw_latency if k == "collective_latency" else float(getattr(st, k)))
            for k in KNOBS}  # fmt: skip


def context_per_request(config: MeasuredConfig, mean_prompt: float) -> float:
    """Mean context (prompt + generated so far) of a running request in the steady state."""
    edges = np.asarray(config.output_length_bins, dtype=float)
    p = np.asarray(config.output_length_counts, dtype=float)
    p = p / p.sum()
    a, b = edges[:-1], edges[1:]
    m1 = float(p @ ((a + b) / 2))
    m2 = float(p @ ((a * a + a * b + b * b) / 3))  # uniform within a bin
    return mean_prompt + m2 / (2 * m1)


_SHAPES: dict[tuple[int, float], tuple[Any, Any, int, int, int, int, int]] = {}


MeanPrompt = float | Callable[[MeasuredConfig], float]
"""Mean prompt tokens: one number, or one per configuration (its task's assumption)."""


def decode_surrogate(config: MeasuredConfig, knobs: dict[str, float],
                     mean_prompt: MeanPrompt) -> float:  # fmt: skip
    """Seconds of a decode-only step at the measured batch and mean context, with `knobs`."""
    prompt = mean_prompt(config) if callable(mean_prompt) else mean_prompt
    key = (id(config), prompt)
    if key not in _SHAPES:
        st = deployment_config(config)
        b = max(1, round(config.avg_batch_size / config.data_parallel))
        c = round(b * context_per_request(config, prompt))
        _SHAPES[key] = (st.model_spec(), st.hardware_spec(), st.tp, st.ep, st.dp, b, c)
    model, hw, tp, ep, dp, b, c = _SHAPES[key]
    r = RooflineStepModel(model, hw, tp=tp, ep=ep, dp=dp, **knobs)
    return r.step_time(0, 0, 0, b, c)


def _rho(row: dict, configs: dict, mean_prompt: MeanPrompt) -> float:
    base = default_knobs()
    return (row["simulated"]["median_itl_ms"] / 1e3
            / decode_surrogate(configs[row["key"]], base, mean_prompt))  # fmt: skip


def surrogate_itl(row: dict, configs: dict, knobs: dict[str, float],
                  mean_prompt: MeanPrompt) -> float:  # fmt: skip
    """The surrogate's median ITL (seconds) of a default-knob row under `knobs`."""
    return _rho(row, configs, mean_prompt) * decode_surrogate(configs[row["key"]], knobs,
                                                               mean_prompt)  # fmt: skip


def fit_knobs(rows: list[dict], configs: dict[str, MeasuredConfig], mean_prompt: MeanPrompt,
              free: tuple[str, ...] = BASE_KNOBS) -> dict[str, float]:  # fmt: skip
    """Knobs (`free` fitted, the others at their defaults) minimising the surrogate's soft-l1
    log error on `rows` (default-knob runs; each row's `key` indexes `configs`)."""
    base = default_knobs()
    rho = np.array([_rho(r, configs, mean_prompt) for r in rows])
    meas = np.array([r["measured"]["median_itl_ms"] / 1e3 for r in rows])
    cs = [configs[r["key"]] for r in rows]
    scale = np.array([KNOB_RANGES[k][0] for k in free])
    lower = np.array([KNOB_RANGES[k][1] for k in free])
    upper = np.array([KNOB_RANGES[k][2] for k in free])

    def knobs_of(x: np.ndarray) -> dict[str, float]:
        return base | dict(zip(free, (x * scale).tolist()))

    def residuals(x: np.ndarray) -> np.ndarray:
        sim = np.array([decode_surrogate(c, knobs_of(x), mean_prompt) for c in cs])
        return np.log(rho * sim / meas)

    start = np.clip(np.array([base[k] for k in free]) / scale, lower + 1e-6, upper - 1e-6)
    sol = least_squares(residuals, start, bounds=(lower, upper), loss="soft_l1", f_scale=0.1,
                        x_scale=np.maximum(np.abs(start), 1e-2), max_nfev=200)  # fmt: skip
    return knobs_of(sol.x)


def mean_se(errors: list[float]) -> tuple[float, float]:
    """(mean, standard error: sample sd / sqrt(n)) of per-fold errors."""
    return float(np.mean(errors)), float(np.std(errors, ddof=1) / math.sqrt(len(errors)))


def one_se_choice(fold_errors: dict[str, list[float]]) -> str:
    """The one-standard-error rule (Hastie, Tibshirani & Friedman, ESL 7.10): of the candidate
    sets, in `KNOB_SETS` order (fewest knobs first), the first whose mean fold error is at most
    the best mean plus that best set's standard error (sample sd / sqrt(folds)). Fold errors
    are per held-out architecture, so an architecture weighs the same however many
    configurations it has."""
    stats = {name: mean_se(e) for name, e in fold_errors.items()}
    best = min(stats, key=lambda n: stats[n][0])
    bound = stats[best][0] + stats[best][1]
    return next(n for n in fold_errors if stats[n][0] <= bound)


def select_knob_set(rows: list[dict], configs: dict, mean_prompt: MeanPrompt) -> tuple[str, dict]:
    """The `KNOB_SETS` entry picked by `one_se_choice` from an inner leave-one-model-out over
    `rows` alone (nested inside the outer fold: the held-out model is never seen); each inner
    fold's error is the median |surrogate error| of its held-out architecture. 'base' when
    `rows` hold fewer than 3 models. Returns (name, {name: {"mean", "se", "folds"}} in %)."""
    models = sorted({r[HELD_OUT] for r in rows})
    if len(models) < 3:
        return "base", {}
    fold_errors: dict[str, list[float]] = {}
    for name, free in KNOB_SETS.items():
        fold_errors[name] = []
        for m in models:
            knobs = fit_knobs([r for r in rows if r[HELD_OUT] != m], configs, mean_prompt, free)
            fold_errors[name].append(float(np.median(
                [100 * abs(surrogate_itl(r, configs, knobs, mean_prompt)
                           / (r["measured"]["median_itl_ms"] / 1e3) - 1)
                 for r in rows if r[HELD_OUT] == m])))  # fmt: skip
    inner = {name: dict(zip(("mean", "se"), mean_se(e)), folds=dict(zip(models, e)))
             for name, e in fold_errors.items()}
    return one_se_choice(fold_errors), inner


def leave_one_model_out(
    default_rows: list[dict],
    configs: dict[str, MeasuredConfig],
    simulate: Callable[[MeasuredConfig, dict[str, float]], dict],
    mean_prompt: MeanPrompt,
    on_fold: Callable[[str, str], None] | None = None,
    knob_set: str = "auto",
) -> tuple[list[dict], list[dict]]:
    """Out-of-sample rows (`variant` 'lomo', with the fold's knobs) and one record per fold.
    `knob_set`: 'auto' (each fold picks by `select_knob_set`) or a `KNOB_SETS` name for all."""
    if knob_set != "auto" and knob_set not in KNOB_SETS:
        raise ValueError(f"knob_set: got {knob_set!r}, expected auto or one of "
                         f"{', '.join(KNOB_SETS)}")  # fmt: skip
    rows, folds = [], []
    for fam in sorted({r["family"] for r in default_rows}):
        fam_rows = [r for r in default_rows if r["family"] == fam]
        models = sorted({r[HELD_OUT] for r in fam_rows})
        if len(models) < 2:
            folds.append({"family": fam, "held_out": models[0] if models else None,
                          "knobs": None, "note": "one model: no out-of-sample score"})
            continue
        for m in models:
            if on_fold:
                on_fold(fam, m)
            train = [r for r in fam_rows if r[HELD_OUT] != m]
            chosen, inner = (select_knob_set(train, configs, mean_prompt)
                             if knob_set == "auto" else (knob_set, {}))  # fmt: skip
            knobs = fit_knobs(train, configs, mean_prompt, KNOB_SETS[chosen])
            folds.append({"family": fam, "held_out": m, "knobs": knobs, "knob_set": chosen,
                          "inner_fold_err_pct": inner,
                          "trained_on": sorted({r[HELD_OUT] for r in train})})
            for r in fam_rows:
                if r[HELD_OUT] == m:
                    out = simulate(configs[r["key"]], knobs)
                    out |= {"variant": "lomo", "key": r["key"], "fold_knobs": knobs}
                    rows.append(out)
    return rows, folds


def fit_families(default_rows: list[dict], configs: dict[str, MeasuredConfig],
                 mean_prompt: MeanPrompt) -> dict[str, dict[str, Any]]:  # fmt: skip
    """Per family, the knobs fitted on all of its architectures, by the folds' own procedure
    (the set chosen by `select_knob_set`, then `fit_knobs`): what a fold would use for an
    architecture the folder does not hold. Their out-of-sample error is the family's
    leave-one-out figure."""
    out = {}
    for fam in sorted({r["family"] for r in default_rows}):
        rows = [r for r in default_rows if r["family"] == fam]
        chosen, inner = select_knob_set(rows, configs, mean_prompt)
        out[fam] = {"knob_set": chosen, "knobs": fit_knobs(rows, configs, mean_prompt,
                                                            KNOB_SETS[chosen]),
                    "architectures": sorted({r[HELD_OUT] for r in rows}),
                    "configurations": len(rows), "inner_fold_err_pct": inner}  # fmt: skip
    return out


def median_abs(rows: list[dict], key: str = "itl_err_pct") -> float:
    return float(np.median([abs(r[key]) for r in rows])) if rows else math.nan


def family_figures(default_rows: list[dict], lomo_rows: list[dict]) -> dict[str, float]:
    """`steptime_median_itl_err_pct_<FIGURE_OF_FAMILY key>` (out of sample) and the default-knob
    counterparts (`..._default`, today's knobs, fitted on Llama-3.1-8B H100 only)."""
    out: dict[str, float] = {}
    for name, fams in FIGURE_OF_FAMILY.items():
        if name in PER_GPU_FIGURES and not any(r["family"] in fams for r in default_rows):
            continue
        out[f"steptime_median_itl_err_pct_{name}"] = median_abs(
            [r for r in lomo_rows if r["family"] in fams])
        out[f"steptime_median_itl_err_pct_{name}_default"] = median_abs(
            [r for r in default_rows if r["family"] in fams])
    return out


def family_markdown(default_rows: list[dict], lomo_rows: list[dict], folds: list[dict],
                    expressible: dict[str, Any]) -> str:  # fmt: skip
    """Per family and model: configurations, median |ITL err| default vs out of sample."""
    lines = [
        "",
        f"**Expressible**: {expressible['ok']} of {expressible['total']} configurations "
        f"({expressible['fraction']:.3f}).",
        "",
        "Median |ITL error| per model, default knobs vs leave-one-model-out (knobs fitted on the "
        "family's other models):",
        "",
        "| family | model | held out with (architecture) | GPUs (tp/ep) | configs | default | out "
        "of sample | fold knobs (step ms, per-decode us, mem eff, collective us, compute eff, "
        "per-layer us) | set |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    fold_of = {(f["family"], f["held_out"]): f for f in folds}
    for fam in sorted({r["family"] for r in default_rows}):
        for m in sorted({r["model_id"] for r in default_rows if r["family"] == fam}):
            d = [r for r in default_rows if r["family"] == fam and r["model_id"] == m]
            o = [r for r in lomo_rows if r["family"] == fam and r["model_id"] == m]
            par = ", ".join(sorted({f"{r['num_gpus']}x {r['gpu']} ({r['tp']}/{r['ep']})"
                                    for r in d}))  # fmt: skip
            fold = fold_of.get((fam, d[0][HELD_OUT])) or {}
            k = fold.get("knobs")
            ks = (f"{k['step_overhead'] * 1e3:.2f}, {k['overhead_per_decode'] * 1e6:.1f}, "
                  f"{k['memory_efficiency']:.2f}, {k['collective_latency'] * 1e6:.1f}, "
                  f"{k['compute_efficiency']:.2f}, {k['overhead_per_layer'] * 1e6:.1f}"
                  ) if k else "-"  # fmt: skip
            oo = f"{median_abs(o):.1f}%" if o else "-"
            lines.append(f"| {fam} | {m} | {d[0][HELD_OUT]} | {par} | {len(d)} | "
                         f"{median_abs(d):.1f}% | {oo} | {ks} | {fold.get('knob_set', '-')} |")
    lines.append("")
    return "\n".join(lines)


def plot_families(default_rows: list[dict], lomo_rows: list[dict], path) -> None:
    """Measured vs simulated median ITL, default knobs and out of sample, one panel a family."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fams = sorted({r["family"] for r in default_rows})
    fig, axes = plt.subplots(1, len(fams), figsize=(5 * len(fams), 4.6), squeeze=False)
    for ax, fam in zip(axes[0], fams):
        for rows, style, label in ((default_rows, "o", "default knobs"),
                                   (lomo_rows, "^", "leave one model out")):  # fmt: skip
            sel = [r for r in rows if r["family"] == fam]
            if sel:
                ax.plot([r["measured"]["median_itl_ms"] for r in sel],
                        [r["simulated"]["median_itl_ms"] for r in sel], style, alpha=0.7,
                        label=f"{label} (median |err| {median_abs(sel):.1f}%)")  # fmt: skip
        lim = [1, max([r["measured"]["median_itl_ms"] for r in default_rows] + [10]) * 1.5]
        ax.plot(lim, lim, "k-", lw=0.8)
        ax.plot(lim, [x * 1.08 for x in lim], "k:", lw=0.6)
        ax.plot(lim, [x / 1.08 for x in lim], "k:", lw=0.6)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("measured median ITL (ms)")
        ax.set_ylabel("simulated median ITL (ms)")
        ax.set_title(fam)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("ML.ENERGY vs simulator (dotted: +-8 %)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
