"""Rendering a bench: a rich table, JSON + CSV files, and a latency-vs-load PNG."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
from rich.console import Console
from rich.table import Table

from presched.bench.runner import BenchResult
from presched.fold import column_widths, fit, table_width, wrapped

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


def notes(cfg) -> list[str]:
    """What the table cannot say in a cell: each policy's parameters, and where the predictions
    come from (the noisy oracle is labelled as such: it reads the true lengths)."""
    from presched.bench.config import RECOMMENDED, RECOMMENDED_PARAMS

    out = []
    for name in cfg.policies:
        params = cfg.policy_params.get(name)
        if params:
            tag = " = mlfq-preempt+sjf, the recommended predictive policy" if (
                name == RECOMMENDED and params == RECOMMENDED_PARAMS) else ""  # fmt: skip
            out.append(f"{name}: " + ", ".join(f"{k} {v}" for k, v in params.items()) + tag)
    p = cfg.predictions
    if p.source == "noisy-oracle":
        out.append(f"predictions: noisy oracle, sigma {p.sigma:g} (true lengths × log-normal error; "
                   "the bench default's sigma is text-gbm's measured accuracy, Kendall tau-b 0.434)")
    elif p.source == "model":
        out.append(f"predictions: the model in {p.path}")
    elif p.source != "none":
        out.append(f"predictions: {p.source}")
    return out


def _cells(result: BenchResult) -> list[list[str]]:
    return [[_cell(row, c) for c in COLUMNS] for row in result.rows]


def _full_width(result: BenchResult) -> int:
    """Columns one table needs with every header on one line."""
    return table_width(column_widths([c[0] for c in COLUMNS], _cells(result), wrap=False))


def _tables(result: BenchResult, width: int) -> list[Table]:
    """The rows as one table, or, when it would not fit in `width` columns, as several, each
    repeating load and policy: a number is never cut (every cell keeps its whole width)."""
    cells = _cells(result)
    widths, groups = fit([c[0] for c in COLUMNS], cells, keys=2, width=width)
    tables = []
    for group in groups:
        table = Table(show_lines=False)
        for i in group:
            col = COLUMNS[i]
            table.add_column(wrapped(col[0], widths[i]), width=widths[i],
                             justify="left" if col[1] == "policy" else "right")  # fmt: skip
        last_load = None
        for row, rc in zip(result.rows, cells):
            if last_load is not None and row["load"] != last_load:
                table.add_section()
            last_load = row["load"]
            table.add_row(*[rc[i] for i in group])
        tables.append(table)
    return tables


def render_table(result: BenchResult, console: Console | None = None) -> list[Table]:
    """Print the title, the table(s) and the notes on `console` (stdout by default). Pipes and
    logs get 150 columns (whole rows); a narrower terminal gets the columns in several tables."""
    cfg = result.config
    st = cfg.sim.step_time
    console = console or Console()
    if not console.is_terminal:  # logs and pipes: whole rows, headers on one line
        console.width = max(console.width, _full_width(result))
    console.print(f"presched bench — {len(cfg.policies)} policies × {len(cfg.loads)} loads; "
                  f"{_layout(cfg)} {st.model_spec().name} on {st.hardware_spec().name}; "
                  f"capacity {result.capacity_tok_s:.0f} output tok/s", highlight=False, soft_wrap=not console.is_terminal)  # fmt: skip
    tables = _tables(result, console.width)
    for table in tables:
        console.print(table)
    for line in notes(cfg):
        console.print(line, highlight=False, soft_wrap=not console.is_terminal)
    return tables


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
    import matplotlib.pyplot as plt

    fig = figure(result)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def figure(result: BenchResult):
    """Latency vs load, four panels, one line per policy: linear axes (every gridline labelled,
    differences read as distances) and a distinct line style and marker per policy, so lines that
    coincide (the two oracles) stay visible."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    df = pd.DataFrame(result.rows)
    panels = [("mean_e2el_ms", "mean E2E latency (s)"), ("p99_e2el_ms", "P99 E2E latency (s)"),
              ("mean_ttft_ms", "mean TTFT (s)"), ("short_p99_e2el_ms", "short-request P99 E2E (s)")]  # fmt: skip
    fig, axes = plt.subplots(2, 2, figsize=(10, 7.5))
    styles = ["-", "--", "-.", ":"]  # lines that coincide (two oracles) stay visible
    markers = ["o", "s", "^", "v", "D", "x", "P", "*"]
    for ax, (key, label) in zip(axes.flat, panels):
        for k, (policy, g) in enumerate(df.groupby("policy", sort=False)):
            ax.plot(g["load"], g[key] / 1e3, marker=markers[k % len(markers)], markersize=7 - k % 3,
                    linestyle=styles[k % len(styles)], linewidth=2.2 - 0.4 * (k % 3), label=policy)  # fmt: skip
        ax.set_xlabel("load (offered output tokens / capacity)")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)  # linear: every gridline labelled, differences read as distances
        ax.grid(True, alpha=0.3)
    axes.flat[0].legend(fontsize=9)
    caption = notes(result.config)
    if caption:
        fig.text(0.01, 0.005, "\n".join(caption), fontsize=7.5, va="bottom")
    cfg = result.config
    st = cfg.sim.step_time
    fig.suptitle(f"{cfg.workload.source} workload, {_layout(cfg)} {st.model_spec().name} on "
                 f"{st.hardware_spec().name}, max_num_seqs {cfg.sim.engine.max_num_seqs}; "
                 f"capacity {result.capacity_tok_s:.0f} output tok/s", fontsize=10)  # fmt: skip
    fig.tight_layout(rect=(0, 0.03 * len(caption), 1, 1))
    return fig
