"""Rendering a bench: a rich table, JSON + CSV files, and a latency-vs-load PNG."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table

from presched.bench.runner import BenchResult

# (column title, row key, format)
COLUMNS = [
    ("load", "load", "{:.2f}"),
    ("policy", "policy", "{}"),
    ("req/s", "request_throughput", "{:.2f}"),
    ("tok/s", "output_throughput", "{:.0f}"),
    ("E2EL mean s", "mean_e2el_ms", "{:.2f}", 1e-3),
    ("E2EL p99 s", "p99_e2el_ms", "{:.2f}", 1e-3),
    ("TTFT mean s", "mean_ttft_ms", "{:.2f}", 1e-3),
    ("TPOT mean ms", "mean_tpot_ms", "{:.1f}"),
    ("short p99 s", "short_p99_e2el_ms", "{:.2f}", 1e-3),
    ("long p99 wait s", "long_p99_queue_wait_ms", "{:.2f}", 1e-3),
    ("goodput req/s", "request_goodput", "{:.2f}"),
    ("preempt", "preemptions", "{}"),
]


def _cell(row: dict, col: tuple) -> str:
    v = row.get(col[1])
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if len(col) > 3:
        v = v * col[3]
    return col[2].format(v)


def _layout(cfg) -> str:
    """How many instances: "4×", or "1P+3D" for a prefill/decode-disaggregated deployment."""
    d = cfg.sim.disaggregated
    return f"{d.num_prefill}P+{d.num_decode}D" if d else f"{cfg.sim.num_instances}×"


def render_table(result: BenchResult, console: Console | None = None) -> Table:
    cfg = result.config
    st = cfg.sim.step_time
    title = (f"presched bench — {len(cfg.policies)} policies × {len(cfg.loads)} loads; "
             f"{_layout(cfg)} {st.model_spec().name} on {st.hardware_spec().name}; "
             f"capacity {result.capacity_tok_s:.0f} output tok/s")  # fmt: skip
    table = Table(title=title, show_lines=False)
    for col in COLUMNS:
        table.add_column(col[0], justify="left" if col[1] == "policy" else "right")
    last_load = None
    for row in result.rows:
        if last_load is not None and row["load"] != last_load:
            table.add_section()
        last_load = row["load"]
        table.add_row(*[_cell(row, c) for c in COLUMNS])
    console = console or Console()
    if not console.is_terminal and console.width < 150:
        console.width = 150  # logs and pipes: print whole rows
    console.print(table)
    return table


def write_files(result: BenchResult, out_dir: Path) -> dict[str, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "bench.json", "csv": out_dir / "bench.csv", "png": out_dir / "bench.png"}
    doc = {
        "config": json.loads(result.config.model_dump_json()),
        "capacity_output_tok_s": result.capacity_tok_s,
        "mean_output_tokens": result.mean_output_tokens,
        "wall_seconds": result.wall_seconds,
        "rows": result.rows,
    }
    paths["json"].write_text(json.dumps(doc, indent=2, default=_jsonable))
    pd.DataFrame(result.rows).to_csv(paths["csv"], index=False)
    plot(result, paths["png"])
    return paths


def _jsonable(x):
    if isinstance(x, float) and math.isnan(x):
        return None
    return str(x)


def plot(result: BenchResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FormatStrFormatter, LogLocator

    df = pd.DataFrame(result.rows)
    panels = [("mean_e2el_ms", "mean E2E latency (s)"), ("p99_e2el_ms", "P99 E2E latency (s)"),
              ("mean_ttft_ms", "mean TTFT (s)"), ("short_p99_e2el_ms", "short-request P99 E2E (s)")]  # fmt: skip
    fig, axes = plt.subplots(2, 2, figsize=(10, 7.5))
    for ax, (key, label) in zip(axes.flat, panels):
        for policy, g in df.groupby("policy", sort=False):
            ax.plot(g["load"], g[key] / 1e3, marker="o", label=policy)
        ax.set_xlabel("load (offered output tokens / capacity)")
        ax.set_ylabel(label)
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(FormatStrFormatter(""))
        ax.grid(True, which="both", alpha=0.3)
    axes.flat[0].legend(fontsize=9)
    cfg = result.config
    st = cfg.sim.step_time
    fig.suptitle(f"{cfg.workload.source} workload, {_layout(cfg)} {st.model_spec().name} on "
                 f"{st.hardware_spec().name}, max_num_seqs {cfg.sim.engine.max_num_seqs}; "
                 f"capacity {result.capacity_tok_s:.0f} output tok/s", fontsize=10)  # fmt: skip
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
