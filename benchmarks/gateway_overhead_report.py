"""benchmarks/gateway_overhead.py's summaries, figures, table and plot."""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from gateway_overhead_measure import RAMP_TARGETS, TARGETS

UPSTREAM = "minimal local upstream that answers instantly (test double), not an engine"



def summarize_runs(runs: list[dict]) -> dict[str, Any]:
    """Per (target, stream): medians over repeats; added = median of per-repeat differences
    to direct."""
    out: dict[str, Any] = {}
    runs = [r for r in runs if r.get("final", True)]
    for stream in (False, True):
        direct = {r["repeat"]: r for r in runs if r["target"] == "direct" and r["stream"] == stream}
        for t in TARGETS:
            rows = [r for r in runs if r["target"] == t and r["stream"] == stream]
            if not rows:
                continue
            s: dict[str, Any] = {
                k: statistics.median(r[k] for r in rows)
                for k in (
                    "p50_ms",
                    "p90_ms",
                    "p99_ms",
                    "mean_ms",
                    "ttfb_p50_ms",
                    "achieved_rps",
                    "send_lag_p99_ms",
                    "generator_cpu_us_per_req",
                    "other_load_cores",
                )
            }
            s["errors"] = sum(sum(r["errors"].values()) for r in rows)
            s["server_cpu_us_per_req"] = statistics.median(
                sum(r["cpu_us_per_req"][x] for x in ("direct", t) if x in r["cpu_us_per_req"])
                for r in rows
            )
            s["target_cpu_us_per_req"] = statistics.median(r["cpu_us_per_req"][t] for r in rows)
            if t != "direct" and direct:
                pairs = [(r, direct[r["repeat"]]) for r in rows if r["repeat"] in direct]
                for q in ("p50", "p99"):
                    s[f"added_{q}_ms"] = statistics.median(
                        g[f"{q}_ms"] - d[f"{q}_ms"] for g, d in pairs
                    )
                    s[f"ratio_{q}"] = statistics.median(
                        g[f"{q}_ms"] / d[f"{q}_ms"] for g, d in pairs
                    )
            out[f"{t}/{'stream' if stream else 'json'}"] = s
    return out


def max_rates(ramp: list[dict]) -> dict[str, float]:
    out = {}
    for stream in (False, True):
        for t in RAMP_TARGETS:
            ok = [
                r["rate"]
                for r in ramp
                if r["target"] == t and r["stream"] == stream and r["passed"]
            ]
            tried = [r for r in ramp if r["target"] == t and r["stream"] == stream]
            if tried:
                out[f"{t}/{'stream' if stream else 'json'}"] = float(max(ok)) if ok else 0.0
    return out


def figures_of(summary: dict, maxes: dict) -> dict[str, float]:
    g, gs = summary.get("gateway/json", {}), summary.get("gateway/stream", {})
    f = {
        "gateway_added_p50_ms": g.get("added_p50_ms"),
        "gateway_max_rps": maxes.get("gateway/json"),
        "gateway_added_p99_ms": g.get("added_p99_ms"),
        "gateway_added_p50_ms_stream": gs.get("added_p50_ms"),
        "gateway_added_p99_ms_stream": gs.get("added_p99_ms"),
        "gateway_added_p50_ms_with_log": summary.get("gateway+log/json", {}).get("added_p50_ms"),
        "gateway_added_p50_ms_passthrough": summary.get("passthrough/json", {}).get("added_p50_ms"),
        "gateway_cpu_us_per_req": g.get("target_cpu_us_per_req"),
        "gateway_cpu_bound_rps": 1e6 / g["target_cpu_us_per_req"]
        if g.get("target_cpu_us_per_req")
        else None,
        "gateway_cpu_us_per_req_stream": gs.get("target_cpu_us_per_req"),
        "direct_p50_ms": summary.get("direct/json", {}).get("p50_ms"),
        "direct_max_rps": maxes.get("direct/json"),
        "gateway_max_rps_stream": maxes.get("gateway/stream"),
        "direct_max_rps_stream": maxes.get("direct/stream"),
    }
    return {k: float(v) for k, v in f.items() if v is not None}


# --- output ----------------------------------------------------------------------------------
def table(summary: dict, maxes: dict, rate: float, console: Console) -> None:
    t = Table(title=f"gateway overhead at {rate:g} req/s (upstream: {UPSTREAM})")
    for col in (
        "target",
        "p50 ms",
        "p99 ms",
        "added p50 ms",
        "added p99 ms",
        "× p50",
        "errors",
        "CPU µs/req of the target",
        "other load (cores)",
        "max req/s (p99 ≤ limit)",
    ):
        t.add_column(col, justify="left" if col == "target" else "right")
    for key, s in summary.items():

        def f(k: str, fmt: str = "{:.3f}", s: dict = s) -> str:
            return fmt.format(s[k]) if k in s else "—"

        mx = maxes.get(key)
        t.add_row(
            key,
            f("p50_ms"),
            f("p99_ms"),
            f("added_p50_ms"),
            f("added_p99_ms"),
            f("ratio_p50", "{:.2f}"),
            str(s["errors"]),
            f"{s['target_cpu_us_per_req']:.0f}",
            f"{s['other_load_cores']:.2f}",
            "—" if mx is None else f"{mx:g}",
        )
    console.print(t)


def plot(result: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6))
    summary = result["summary"]
    keys = list(summary)
    x = np.arange(len(keys))
    ax = axes[0]
    ax.bar(x - 0.2, [summary[k]["p50_ms"] for k in keys], 0.4, label="p50")
    ax.bar(x + 0.2, [summary[k]["p99_ms"] for k in keys], 0.4, label="p99")
    ax.set_xticks(x, keys, fontsize=8, rotation=30, ha="right")
    ax.set_ylabel("latency (ms)")
    ax.set_title(
        f"latency at {result['meta']['rate']:g} req/s (median of {result['meta']['repeats']})"
    )
    ax.legend()
    for ax, col, label in (
        (axes[1], "achieved_rps", "achieved req/s"),
        (axes[2], "p99_ms", "p99 latency (ms)"),
    ):
        for stream in (False, True):
            for t in RAMP_TARGETS:
                rows = [r for r in result["ramp"] if r["target"] == t and r["stream"] == stream]
                last = {r["rate"]: r for r in rows}  # the retry replaces a failed first attempt
                if last:
                    xs = sorted(last)
                    ax.plot(
                        xs,
                        [last[v][col] for v in xs],
                        "o-" if not stream else "s--",
                        label=f"{t} {'stream' if stream else 'json'}",
                    )
        ax.set_xlabel("offered req/s")
        ax.set_ylabel(label)
        ax.legend(fontsize=8)
    axes[1].plot(
        [0, max(result["meta"]["ramp_rates"])],
        [0, max(result["meta"]["ramp_rates"])],
        color="grey",
        lw=0.8,
        ls=":",
    )
    axes[1].set_title("ramp: throughput")
    axes[2].axhline(result["meta"]["p99_limit_ms"], color="grey", lw=0.8, ls=":")
    axes[2].set_yscale("log")
    axes[2].set_title("ramp: p99")
    fig.suptitle(f"presched gateway overhead — upstream: {UPSTREAM}; 2 shared cores", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "gateway_overhead.png", dpi=120)
    plt.close(fig)
