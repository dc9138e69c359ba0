"""benchmarks/engine_e2e.py's table and plot."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from engine_e2e_figures import med


def table(summary: dict, console: Console, title: str) -> None:
    t = Table(title=title)
    for col in ("config", "mean E2E s", "P99 s", "short P99 s", "tok/s", "sim mean s", "sim err %",
                "a priori %", "speed x", "eng ms/tok", "others", "failed"):  # fmt: skip
        t.add_column(col, justify="left" if col == "config" else "right", no_wrap=col == "config")
    for name, s in summary.items():
        t.add_row(name, f"{s['mean_e2el_ms'] / 1e3:.2f}", f"{s['p99_e2el_ms'] / 1e3:.2f}",
                  f"{s['short_p99_e2el_ms'] / 1e3:.2f}", f"{s['output_throughput']:.0f}",
                  f"{s['sim_mean_e2el_ms'] / 1e3:.2f}", f"{s['sim_mean_e2e_error_pct']:+.1f}",
                  f"{med(s['sim_a_priori_mean_e2e_error_pct_each']):+.1f}",
                  f"{med(s['speed_factor_each']):.2f}", f"{s['engine_decode_ms_per_token']:.2f}",
                  f"{s['others_cores']:.2f}", str(s["failed"]))  # fmt: skip
    console.print(t)


def plot(result: dict, out: Path, stem: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary, runs = result["summary"], result["runs"]
    names = list(summary)
    x = np.arange(len(names))
    fig, axes = plt.subplots(2, 3, figsize=(17, 9))
    panels = [("mean_e2el_ms", "mean E2E (s)", 1e-3), ("p99_e2el_ms", "P99 E2E (s)", 1e-3),
              ("short_p99_e2el_ms", "short-request P99 E2E (s)", 1e-3),
              ("output_throughput", "output tokens/s", 1.0)]  # fmt: skip
    for ax, (key, label, scale) in zip(axes.flat, panels):
        ax.bar(x, [summary[n][key] * scale for n in names], 0.6, color="tab:blue", alpha=0.6,
               label="engine (median)")  # fmt: skip
        for i, n in enumerate(names):
            each = [v * scale for v in summary[n][f"{key}_each"]]
            ax.plot([i] * len(each), each, "k.", ms=5, label="engine repeats" if i == 0 else None)
        ax.plot(x, [summary[n][f"sim_{key}"] * scale for n in names], "rx", ms=10, mew=2,
                label="simulator (fitted)")  # fmt: skip
        ax.set_xticks(x, names, rotation=20, ha="right", fontsize=8)
        ax.set_ylabel(label)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    ax = axes[1, 1]
    for i, n in enumerate(names):
        rows = [r for r in runs if r["config"] == n]
        x_ = [r["summary"]["mean_e2el_ms"] / 1e3 for r in rows]
        ax.plot(x_, [r["sim"]["mean_e2el_ms"] / 1e3 for r in rows], "o", color=f"C{i}", label=n)
        ax.plot(x_, [r["sim_a_priori"]["mean_e2el_ms"] / 1e3 for r in rows], "o", mfc="none", color=f"C{i}",
                label="a priori (speed as calibrated)" if i == 0 else None)  # fmt: skip
    lim = ax.get_xlim()[1], ax.get_ylim()[1]
    top = max(lim)
    ax.plot([0, top], [0, top], color="grey", lw=0.8, ls=":")
    ax.fill_between([0, top], [0, 0.9 * top], [0, 1.1 * top], color="grey", alpha=0.15, label="±10 %")
    ax.set_xlabel("engine mean E2E (s)")
    ax.set_ylabel("simulated mean E2E (s)")
    ax.set_title("simulator vs engine, per run (filled: speed fitted to the run; open: a priori)", fontsize=10)
    ax.legend(fontsize=7)
    ax = axes[1, 2]
    for rep, cal in enumerate(result["calibrations"]):
        dec = [p for p in cal["probes"] if p["kind"] == "decode"]
        ax.plot([p["num_decode"] for p in dec], [p["step_s"] * 1e3 for p in dec], ".", color=f"C{rep}",
                label=f"decode probes, repeat {rep}")  # fmt: skip
        c = cal["model"]["coefficients"]
        b = np.arange(1, result["meta"]["max_num_seqs"] + 1)
        ax.plot(b, 1e3 * (c["a_decode"] + c["c_decode"] * b + c["b_decode"] * b * 256), "-",
                color=f"C{rep}", lw=1)  # fmt: skip
    ax.set_xlabel("decode batch size")
    ax.set_ylabel("decode step (ms)")
    ax.set_title("calibration: engine decode steps and fit")
    ax.legend(fontsize=7)
    m = result["meta"]
    fig.suptitle(f"{m['requests']} requests ({m['source']} x CASTILLO {m['castillo_model']}, ≤{m['max_tokens']} "
                 f"tokens) at load {m['load']:g} on vLLM CPU (tiny Llama, {m['max_num_seqs']} seqs), "
                 f"{m['repeats']} repeats; 2 cores", fontsize=10)  # fmt: skip
    fig.tight_layout()
    fig.savefig(out / f"{stem}.png", dpi=110)
    plt.close(fig)
