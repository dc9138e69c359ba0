"""Reporting an `Evaluation`: a rich table per view, a JSON file, and two PNGs per view
(calibration: nominal vs empirical coverage, one line per predictor; predicted point vs true
length, log-log, one panel per predictor). The leave-one-source-out folds (`loso-<source>`
views) get one summary table, a `loso` block in the JSON and one bar chart instead
(`presched.predict.loso`)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from presched.fold import column_widths, fit, table_width, wrapped
from presched.plotting import pyplot, save
from presched.predict.estimate import LEVELS
from presched.predict.evaluate import Evaluation
from presched.predict.loso import is_loso, loso_cells, loso_markdown, loso_summaries, loso_tables, plot_loso

ACCURACY: tuple[tuple[str, str, str], ...] = (
    # (row key, header, format)
    ("mae", "MAE", "{:.1f}"),
    ("rmse", "RMSE", "{:.1f}"),
    ("acc50", "Acc-50", "{:.1%}"),
    ("acc100", "Acc-100", "{:.1%}"),
    ("class5_acc", "5-cls", "{:.1%}"),
    ("kendall_tau_b", "τ-b", "{:.3f}"),
    ("kendall_tau_b_within_model", "τ-b/model", "{:.3f}"),
    ("spearman", "ρ", "{:.3f}"),
    ("pairwise_acc", "pair-acc", "{:.1%}"),
    ("mae_single", "MAE₁", "{:.1f}"),
    ("kendall_tau_b_single", "τ-b₁", "{:.3f}"),
)
CALIBRATION_COST: tuple[tuple[str, str, str], ...] = (
    ("max_coverage_error_pts", "cov-err pts", "{:.1f}"),
    ("max_coverage_error_pts_samples", "cov-err₁ pts", "{:.1f}"),
    ("pinball", "pinball", "{:.1f}"),
    ("under_q90", "under@q90", "{:.1%}"),
    ("under_q90_samples", "under@q90₁", "{:.1%}"),
    ("latency_single_p50_ms", "1-req p50 ms", "{:.2f}"),
    ("latency_single_p99_ms", "1-req p99 ms", "{:.2f}"),
    ("latency_batch_p50_ms", "batch p50 ms/req", "{:.3f}"),
    ("latency_batch_p99_ms", "batch p99 ms/req", "{:.3f}"),
    ("size_bytes", "size KB", "size"),
    ("fit_s", "fit s", "{:.1f}"),
)
LEGEND = ("MAE/RMSE/Acc-k/5-cls: point vs per-request mean; τ-b, ρ, pair-acc: rank score vs mean; "
          "cov-err: max |empirical − nominal| coverage over q10…q90 vs the mean (₁: vs every single "
          "sample); under@q90: share of means above q90 (₁: of single samples); MAE₁, τ-b₁: vs one "
          "real sample (sample 0); latency per request on this machine's CPU, on never-seen prompts (batch: "
          "64 a call).")  # fmt: skip


def _fmt(value: Any, fmt: str) -> str:
    if value is None or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    if fmt == "size":
        return f"{value / 1024:,.0f}"
    return fmt.format(value)


def _cells(result: Evaluation, view: str, columns) -> list[list[str]]:
    rows = []
    for row in result.rows:
        if row["view"] != view:
            continue
        if row.get("status") != "ok":
            rows.append([row["predictor"], "failed", *[""] * (len(columns) - 1)])
        else:
            rows.append([row["predictor"], *[_fmt(row.get(k), f) for k, _h, f in columns]])
    return rows


def _tables(result: Evaluation, view: str, title: str, columns, caption: str | None, width: int) -> list[Table]:
    """The view's rows under `columns` as one table, or, when it would not fit in `width`
    characters, as several, each repeating the predictor: a number is never cut."""
    headers = ["predictor", *(h for _, h, _f in columns)]
    cells = _cells(result, view, columns)
    widths, groups = fit(headers, cells, keys=1, width=width)
    tables = []
    for k, group in enumerate(groups):
        table = Table(title=title if k == 0 else None, caption=caption if k == len(groups) - 1 else None)
        for i in group:
            table.add_column(wrapped(headers[i], widths[i]), width=widths[i], justify="left" if i == 0 else "right")
        for rc in cells:
            table.add_row(*[("[red]failed[/red]" if rc[i] == "failed" and i == 1 else rc[i]) for i in group])
        tables.append(table)
    return tables


def full_width(result: Evaluation) -> int:
    """Characters the widest table needs with every header on one line (pipes and logs get it)."""
    widths = [table_width(column_widths(["predictor", *(h for _, h, _f in cols)], _cells(result, view, cols), wrap=False))
              for view in result.splits if not is_loso(view) for cols in (ACCURACY, CALIBRATION_COST)]  # fmt: skip
    if any(is_loso(v) for v in result.splits):
        widths.append(table_width(column_widths(*loso_cells(result), wrap=False)))
    return max(widths, default=80)


def render_table(result: Evaluation, console: Console) -> None:
    """Two tables per view (accuracy; calibration and cost), each folded into several when the
    console is too narrow, one for all LOSO folds, then failures, then a legend."""
    for view, info in result.splits.items():
        if is_loso(view):
            continue
        head = (f"{view}: {info['n_train']:,} train / {info['n_calibration']:,} calibration / "
                f"{info['n_test']:,} test requests")  # fmt: skip
        for title, columns, caption in ((head + " — accuracy", ACCURACY, info.get("description")),
                                        (head + " — calibration and cost", CALIBRATION_COST, None)):  # fmt: skip
            for table in _tables(result, view, title, columns, caption, console.width):
                console.print(table)
    if any(is_loso(v) for v in result.splits):
        for table in loso_tables(result, console.width):
            console.print(table)
    for row in result.rows:
        if row.get("status") != "ok":
            console.print(f"[red]{row['view']} / {row['predictor']} failed:[/red] {row.get('error')}", highlight=False)
    console.print(f"[dim]{LEGEND}[/dim]")


def markdown_table(result: Evaluation) -> str:
    """The same numbers as Markdown (for docs): one accuracy and one calibration/cost table per view."""
    out = []
    for view, info in result.splits.items():
        if is_loso(view):
            continue
        out.append(f"**{view}** ({info['n_train']:,} train / {info['n_calibration']:,} calibration / "
                   f"{info['n_test']:,} test; {info.get('description', '')})\n")  # fmt: skip
        for columns in (ACCURACY, CALIBRATION_COST):
            out.append("| predictor | " + " | ".join(h for _, h, _f in columns) + " |")
            out.append("|---|" + "---:|" * len(columns))
            for row in result.rows:
                if row["view"] != view:
                    continue
                cells = ([_fmt(row.get(k), f) for k, _h, f in columns] if row.get("status") == "ok"
                         else ["failed"] + [""] * (len(columns) - 1))  # fmt: skip
                out.append(f"| {row['predictor']} | " + " | ".join(cells) + " |")
            out.append("")
    if any(is_loso(v) for v in result.splits):
        out.append(loso_markdown(result))
    return "\n".join(out)


def _clean(x: Any) -> Any:
    """JSON-safe: numpy to Python, non-finite floats to None."""
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, np.ndarray):
        return _clean(x.tolist())
    if isinstance(x, (np.floating, float)):
        return float(x) if math.isfinite(x) else None
    if isinstance(x, np.integer):
        return int(x)
    return x


def write_json(result: Evaluation, path: str | Path, meta: dict[str, Any] | None = None,
               figures: dict[str, float] | None = None) -> Path:  # fmt: skip
    """{"meta", "levels", "views", "rows", "figures", "loso"}; non-finite numbers are written as
    null. "loso": `loso_summary` per predictor (empty without LOSO folds)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{k: v for k, v in r.items() if k != "traceback"} for r in result.rows]
    doc = {"meta": meta or {}, "levels": list(LEVELS), "views": result.splits, "rows": rows,
           "figures": figures or {}, "loso": loso_summaries(result)}  # fmt: skip
    path.write_text(json.dumps(_clean(doc), indent=2) + "\n")
    return path


def plot_calibration(result: Evaluation, view: str, path: str | Path) -> Path | None:
    """Nominal vs empirical coverage (against the per-request mean, solid; against single
    samples, dotted), one colour per predictor, with the diagonal."""
    rows = [r for r in result.rows if r["view"] == view and r.get("status") == "ok"]
    if not rows:
        return None
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 6))
    lv = np.asarray(LEVELS)
    ax.plot([0, 1], [0, 1], color="0.6", lw=1, ls="--", label="ideal")
    for i, r in enumerate(rows):
        c = f"C{i % 10}"
        ax.plot(lv, r["coverage"], marker="o", ms=3, color=c, label=r["predictor"])
        ax.plot(lv, r["coverage_samples"], ls=":", color=c, lw=1)
    ax.set_xlim(0, 1.02)
    ax.set_ylim(0, 1.02)
    ax.set_xlabel("nominal level τ")
    ax.set_ylabel("empirical coverage P(y ≤ q_τ)")
    ax.set_title(f"calibration — {view} (solid: vs mean, dotted: vs single samples)", fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    ax.grid(alpha=0.3)
    return save(fig, path, dpi=120)


def plot_scatter(result: Evaluation, view: str, path: str | Path, max_points: int = 4000, seed: int = 0) -> Path | None:
    """Predicted point vs true (per-request mean) length, log-log, one panel per predictor,
    at most `max_points` random points each."""
    names = [r["predictor"] for r in result.rows if r["view"] == view and r.get("status") == "ok"]
    if not names:
        return None
    plt = pyplot()
    cols = min(4, len(names))
    nrows = math.ceil(len(names) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(3.2 * cols, 3.1 * nrows), squeeze=False)
    rng = np.random.default_rng(seed)
    for ax, name in zip(axes.flat, names):
        a = result.arrays[(view, name)]
        y, p = a["y"], a["point"]
        idx = rng.choice(len(y), size=min(max_points, len(y)), replace=False)
        ax.scatter(y[idx], p[idx], s=2, alpha=0.3, lw=0)
        lo, hi = max(1.0, float(min(y.min(), p.min()))), float(max(y.max(), p.max()))
        ax.plot([lo, hi], [lo, hi], color="0.4", lw=0.8, ls="--")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(name, fontsize=9)
        ax.set_xlabel("true (mean of samples)", fontsize=8)
        ax.set_ylabel("predicted point", fontsize=8)
        ax.tick_params(labelsize=7)
    for ax in list(axes.flat)[len(names):]:
        ax.axis("off")
    fig.suptitle(f"predicted vs true output length — {view}", fontsize=10)
    return save(fig, path, dpi=110)


def write_all(result: Evaluation, out_dir: str | Path, name: str = "predictors", meta: dict[str, Any] | None = None,
              figures: dict[str, float] | None = None) -> dict[str, Path]:  # fmt: skip
    """`<name>.json` plus `<name>-calibration-<view>.png` and `<name>-scatter-<view>.png`, and
    `<name>-loso.png` for the LOSO folds (not one pair per fold)."""
    out = Path(out_dir)
    paths: dict[str, Path] = {"json": write_json(result, out / f"{name}.json", meta, figures)}
    loso = plot_loso(result, out / f"{name}-loso.png")
    if loso is not None:
        paths["loso"] = loso
    for view in result.splits:
        if is_loso(view):
            continue
        for kind, fn in (("calibration", plot_calibration), ("scatter", plot_scatter)):
            p = fn(result, view, out / f"{name}-{kind}-{view}.png")
            if p is not None:
                paths[f"{kind}-{view}"] = p
    return paths
