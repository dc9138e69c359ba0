"""benchmarks/policies.py's figures (headline, prompt-oracle capture), table and plots."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from policies_set import BASELINES, DEFAULT_POLICY, ORACLES, PO, PROMPT_ORACLE_POLICIES, capture, pick


def headline(rows, decision, names) -> tuple[dict[str, float], dict[str, Any]]:
    """The issue's figures, each the MEAN over the workload seeds present in `rows` (a row
    without `seed` is seed 0) of the per-seed value; the best predictive policy is the one with
    the highest mean gain capture (one policy for all seeds, not the best of each). Returns
    (figures, per-seed detail)."""
    f: dict[str, float] = {}
    detail: dict[str, Any] = {}
    predictive = [p for p in names if p not in ORACLES and p not in BASELINES]
    seeds = sorted({r.get("seed", 0) for r in rows})
    mean = statistics.mean
    for tag, w, load in (("conv95", "conv", 0.95), ("code90", "code", 0.9)):
        per_seed = []
        for sd in seeds:
            here = [r for r in rows if r.get("seed", 0) == sd]
            fc, orc = pick(here, w, load, "fcfs"), pick(here, w, load, "srpt-oracle")
            if fc is not None and orc is not None:
                per_seed.append((sd, fc, orc, {p: r for p in predictive if (r := pick(here, w, load, p))}))
        if not per_seed:
            continue

        def cap(p, s):
            return capture(s[1]["mean_e2el_ms"], s[2]["mean_e2el_ms"], s[3][p]["mean_e2el_ms"])

        common = [p for p in predictive if all(p in s[3] for s in per_seed)]
        best = max(common, key=lambda p: mean(cap(p, s) for s in per_seed))
        f[f"gain_capture_{tag}"] = mean(cap(best, s) for s in per_seed)
        detail[tag] = {"best": best, "seeds": [s[0] for s in per_seed],
                       "gain_capture": {p: [cap(p, s) for s in per_seed] for p in common}}  # fmt: skip
        if tag == "code90":
            f["fcfs_over_best_mean_e2e_code90"] = mean(s[1]["mean_e2el_ms"] / s[3][best]["mean_e2el_ms"] for s in per_seed)
            f["short_p99_vs_fcfs_code90"] = mean(s[3][best]["short_p99_e2el_ms"] / s[1]["short_p99_e2el_ms"] for s in per_seed)
            if DEFAULT_POLICY in common:
                f["default_p99_vs_fcfs_code90"] = mean(s[3][DEFAULT_POLICY]["p99_e2el_ms"] / s[1]["p99_e2el_ms"] for s in per_seed)
                f["default_gain_capture_code90"] = mean(cap(DEFAULT_POLICY, s) for s in per_seed)
            print(f"best predictive policy on code 90 % (mean over seeds {detail[tag]['seeds']}): {best}")
    if DEFAULT_POLICY in decision:
        f["decision_us_per_request_10k"] = decision[DEFAULT_POLICY]
    return f, detail


def prompt_oracle_capture(rows) -> dict[str, tuple[str, float]]:
    """Per headline setting: the best policy fed the prompt oracle, and its gain capture."""
    out = {}
    for tag, w, load in (("conv95", "conv", 0.95), ("code90", "code", 0.9)):
        fc, orc = pick(rows, w, load, "fcfs"), pick(rows, w, load, "srpt-oracle")
        cands = [(r["mean_e2el_ms"], r["policy"]) for p in PROMPT_ORACLE_POLICIES if (r := pick(rows, w, load, p + PO))]
        if fc and orc and cands:
            best_val, best = min(cands)
            out[tag] = (best, capture(fc["mean_e2el_ms"], orc["mean_e2el_ms"], best_val))
    return out


def table(rows, console: Console) -> None:
    t = Table(title="mean / p99 E2E (s), short-request p99 (s), by workload and load (1 instance)")
    for c in ("workload", "load", "policy", "mean E2E", "p99 E2E", "short p99", "long p99 wait", "preempt", "capture"):
        t.add_column(c, justify="right")
    for r in rows:
        if r["instances"] != 1:
            continue
        fc = pick(rows, r["workload"], r["load"], "fcfs")
        orc = pick(rows, r["workload"], r["load"], "srpt-oracle")
        cap = capture(fc["mean_e2el_ms"], orc["mean_e2el_ms"], r["mean_e2el_ms"]) if fc and orc else float("nan")
        t.add_row(r["workload"], f"{r['load']:.2f}", r["policy"], f"{r['mean_e2el_ms'] / 1e3:.2f}",
                  f"{r['p99_e2el_ms'] / 1e3:.1f}", f"{r['short_p99_e2el_ms'] / 1e3:.2f}",
                  f"{r['long_p99_queue_wait_ms'] / 1e3:.1f}", str(r["preemptions"]), f"{cap:.2f}")  # fmt: skip
    console.print(t)


def plots(rows, sweep, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ws = sorted({r["workload"] for r in rows})
    fig, axes = plt.subplots(2, len(ws), figsize=(5 * len(ws), 8), squeeze=False)
    for j, w in enumerate(ws):
        for i, (metric, label) in enumerate((("mean_e2el_ms", "mean E2E (s)"), ("p99_e2el_ms", "P99 E2E (s)"))):
            ax = axes[i, j]
            pols = sorted({r["policy"] for r in rows if r["workload"] == w and r["instances"] == 1})
            for p in pols:
                pts = sorted((r["load"], r[metric] / 1e3) for r in rows
                             if r["workload"] == w and r["policy"] == p and r["instances"] == 1)  # fmt: skip
                style = "--" if p in ORACLES else ":" if p in BASELINES else "-"
                ax.plot(*zip(*pts), style, marker="o", ms=3, label=p)
            ax.set_title(f"{w}, 1 instance")
            ax.set_xlabel("load (fraction of capacity)")
            ax.set_ylabel(label)
            ax.set_yscale("log")
    axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "policies-latency-vs-load.png", dpi=120)
    plt.close(fig)

    if sweep:
        ws = sorted({s["workload"] for s in sweep})
        fig, axes = plt.subplots(1, len(ws), figsize=(5 * len(ws), 4), squeeze=False)
        for j, w in enumerate(ws):
            ax = axes[0, j]
            load = next(s["load"] for s in sweep if s["workload"] == w)
            ref = [r for r in rows if r["workload"] == w and r["instances"] == 1 and r["load"] == load]
            for p in sorted({s["policy"] for s in sweep}):
                pts = sorted((s["tau"], s["mean_e2el_ms"] / 1e3) for s in sweep if s["workload"] == w and s["policy"] == p)
                ax.plot(*zip(*pts), marker="o", ms=3, label=p)
            for r in ref:
                if r["policy"] in ("fcfs", "srpt-oracle"):
                    ax.axhline(r["mean_e2el_ms"] / 1e3, ls="--", lw=0.8, color="k" if r["policy"] == "fcfs" else "g")
            ax.set_title(f"{w}: noisy-oracle sweep (fcfs black, srpt-oracle green)")
            ax.set_xlabel("Kendall tau-b of predictions vs true lengths")
            ax.set_ylabel("mean E2E (s)")
        axes[0, 0].legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out / "policies-noise-sweep.png", dpi=120)
        plt.close(fig)


def plot_pareto(rows, pareto, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.5))
    for pol in sorted({p["policy"] for p in pareto}):
        pts = [(p["mean_e2el_ms"] / 1e3, p["p99_e2el_ms"] / 1e3, p["value"]) for p in pareto if p["policy"] == pol]
        knob = next(p["knob"] for p in pareto if p["policy"] == pol)
        ax.plot([x for x, _, _ in pts], [y for _, y, _ in pts], marker="o", label=f"{pol} ({knob})")
        for x, y, v in pts:
            ax.annotate(f"{v:g}" if v < 1e8 else "off", (x, y), fontsize=6)
    for name, marker in (("fcfs", "s"), ("srpt-oracle", "*"), ("sjf", "^"), ("srpt" + PO, "P")):
        r = pick(rows, "code", 0.9, name)
        if r:
            ax.plot(r["mean_e2el_ms"] / 1e3, r["p99_e2el_ms"] / 1e3, marker, ms=9, label=name)
    fc = pick(rows, "code", 0.9, "fcfs")
    if fc:
        ax.axhline(1.5 * fc["p99_e2el_ms"] / 1e3, ls=":", color="grey", label="1.5x FCFS P99")
    ax.set_xlabel("mean E2E (s)")
    ax.set_ylabel("P99 E2E (s)")
    ax.set_title("code, 90 % load: each policy's knob (text-gbm predictions)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "policies-pareto.png", dpi=120)
    plt.close(fig)

