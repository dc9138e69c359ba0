"""The leave-one-source-out (LOSO) view: does a predictor hold up on a prompt source it never saw?

    splits = loso_splits(seed=0, quick=None)        # 7 Splits, one per CASTILLO prompt source
    result = evaluate_loso(["text-gbm"], splits)    # fit 7 times, score each on its held-out source
    loso_summary(result, "text-gbm")                # per source and mean τ-b, MAE, coverage error
    loso_figures(result)                            # {"loso_mean_tau": …, "loso_max_coverage_error_pts": …}

CASTILLO's prompts come from 7 sources (`SOURCES`: Alpaca, Apps, BigCodeBench, DS1000,
DollyDataset, Mbpp, ShareGPT). Fold `loso-<source>` is the in-dist view (`castillo_view`) with
that source removed from train and calibration, and test = that source's rows of the CASTILLO
test split (all 13 models). So the same test rows are scored in-distribution by the in-dist view,
which gives the per-source drop; the ShareGPT fold is the `cross-dataset` view.

The summary's mean is the unweighted mean over the 7 sources (each source counts once, however
many rows it has); the coverage figure is the worst source's max |coverage − τ| over q10…q90.
A fold the predictor failed is listed (`failed`, "failed" in the tables) and makes its means
and worst coverage nan ("— (6/7 folds)" in the tables): over the folds left they would read
better than the predictor is, having dropped the fold it failed.
Latency is not timed here (the in-dist view times the same predictor); `evaluate_loso` fits and
scores only.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from presched.plotting import pyplot, save
from presched.predict.evaluate import DEFAULT, Evaluation, Split, castillo_view, evaluate, subsample

SOURCES = ("Alpaca", "Apps", "BigCodeBench", "DS1000", "DollyDataset", "Mbpp", "ShareGPT")
"""CASTILLO's prompt sources (the `dataset` field of its rows)."""
PREFIX = "loso-"
"""A fold's view name is PREFIX + source."""
METRICS = ("kendall_tau_b", "mae", "max_coverage_error_pts")


def is_loso(view: str) -> bool:
    return view.startswith(PREFIX)


def loso_splits(seed: int = 0, quick: int | None = None, path: str | Path | None = None,
                sources: Sequence[str] = SOURCES) -> list[Split]:  # fmt: skip
    """One `Split` per source in `sources` (see the module doc). `quick=N` keeps about N requests
    per side of each fold (whole prompts, seeded), as `castillo_view` does."""
    bad = [s for s in sources if s not in SOURCES]
    if bad:
        raise ValueError(f"sources: {bad[0]!r} is not a CASTILLO prompt source ({', '.join(SOURCES)})")
    base = castillo_view("in-dist", seed=seed, path=path)
    out = []
    for src in sources:
        other = lambda reqs: [r for r in reqs if r.metadata.get("dataset") != src]  # noqa: E731
        train, calib = other(base.train), other(base.calibration)
        test = [r for r in base.test if r.metadata.get("dataset") == src]
        desc = f"train/calibration on the 6 other sources; test = {src} rows of CASTILLO test"
        if quick:
            train, calib, test = (subsample(x, quick, seed) for x in (train, calib, test))
            desc += f" [quick: ~{quick} requests per side]"
        out.append(Split(PREFIX + src, train, calib, test, desc))
    return out


def evaluate_loso(predictor_names: Sequence[str], splits: Sequence[Split], *,
                  params: dict[str, dict[str, Any]] | None = None, seed: int = 0,
                  on_step: Callable[[str], None] | None = None) -> Evaluation:  # fmt: skip
    """`evaluate` on the folds without the latency sample (no timed calls)."""
    return evaluate(predictor_names, splits, params=params, batches=0, single_calls=0, seed=seed, on_step=on_step)


def merge(*results: Evaluation) -> Evaluation:
    """One `Evaluation` holding the rows, arrays and views of all `results`."""
    out = Evaluation()
    for r in results:
        out.rows.extend(r.rows)
        out.arrays.update(r.arrays)
        out.splits.update(r.splits)
    return out


def _rows(result: Evaluation, name: str) -> dict[str, dict[str, Any]]:
    """{LOSO view: `name`'s row there}, the ok row where there are several."""
    out: dict[str, dict[str, Any]] = {}
    for row in result.rows:
        if row["predictor"] == name and is_loso(row["view"]) and out.get(row["view"], {}).get("status") != "ok":
            out[row["view"]] = row
    return out


def loso_summary(result: Evaluation, name: str) -> dict[str, Any]:
    """{"per_source": {source: {n, kendall_tau_b, mae, max_coverage_error_pts}}, "folds",
    "of", "failed": {source: error}, "mean_kendall_tau_b", "mean_mae", "mean_coverage_error_pts",
    "max_coverage_error_pts"}: `per_source` holds the LOSO folds in `result` where `name`
    succeeded (`folds` of them, of the `of` folds run); the means and the worst coverage are
    over all `of` folds, so nan when a fold failed (a mean over the folds left would leave out
    the one it failed, often the hardest) or when `name` ran no fold."""
    rows = _rows(result, name)
    views = [v for v in result.splits if is_loso(v)] if rows else []
    per: dict[str, dict[str, float]] = {}
    failed: dict[str, str] = {}
    for view in views:
        row = rows.get(view)
        if row is not None and row.get("status") == "ok":
            per[view[len(PREFIX):]] = {"n": row.get("n"), **{k: _num(row.get(k)) for k in METRICS}}
        else:
            failed[view[len(PREFIX):]] = str(row.get("error", "failed")) if row is not None else "not run"
    whole = bool(per) and not failed
    mean = lambda k: float(np.mean([v[k] for v in per.values()])) if whole else math.nan  # noqa: E731
    worst = max(v["max_coverage_error_pts"] for v in per.values()) if whole else math.nan
    return {"per_source": per, "folds": len(per), "of": len(views), "failed": failed,
            "mean_kendall_tau_b": mean("kendall_tau_b"), "mean_mae": mean("mae"),
            "mean_coverage_error_pts": mean("max_coverage_error_pts"), "max_coverage_error_pts": worst}  # fmt: skip


def _num(v: Any) -> float:
    return float(v) if v is not None else math.nan


def loso_figures(result: Evaluation, default: str = DEFAULT) -> dict[str, float]:
    """The benchmark's LOSO lines for the default predictor: nan if it has no LOSO folds or
    failed on one (`loso_summary`); a run that left some sources out (a subset) reports over
    the folds it ran."""
    s = loso_summary(result, default)
    return {"loso_mean_tau": s["mean_kendall_tau_b"], "loso_max_coverage_error_pts": s["max_coverage_error_pts"]}


def loso_summaries(result: Evaluation) -> dict[str, dict[str, Any]]:
    """`loso_summary` of every predictor with a LOSO row, for the JSON file."""
    names = dict.fromkeys(r["predictor"] for r in result.rows if is_loso(r["view"]))
    return {n: loso_summary(result, n) for n in names}


def loso_cells(result: Evaluation) -> tuple[list[str], list[list[str]]]:
    """(headers, one row of cells per predictor) of the LOSO table."""
    sources = [v[len(PREFIX):] for v in result.splits if is_loso(v)]
    heads = ["predictor", *sources, "mean τ-b", "mean MAE", "max cov-err pts"]
    return heads, [[name, *_cells(s, sources)] for name, s in loso_summaries(result).items()]


def loso_tables(result: Evaluation, width: int) -> list:
    """Rich tables: τ-b per held-out source, then mean τ-b, mean MAE and worst coverage error;
    folded into several (each repeating the predictor) when `width` characters are too few, so
    no number is cut."""
    from rich.table import Table

    from presched.fold import fit, wrapped

    heads, rows = loso_cells(result)
    widths, groups = fit(heads, rows, keys=1, width=width)
    tables = []
    for k, group in enumerate(groups):
        table = Table(title="leave-one-source-out: τ-b on the held-out source (train on the other 6)" if k == 0 else None,
                      caption="mean = unweighted over sources; cov-err = the worst source's max |coverage − τ|, "
                      "q10…q90" if k == len(groups) - 1 else None)  # fmt: skip
        for i in group:
            table.add_column(wrapped(heads[i], widths[i]), width=widths[i], justify="left" if i == 0 else "right")
        for row in rows:
            table.add_row(*[row[i] for i in group])
        tables.append(table)
    return tables


def loso_markdown(result: Evaluation) -> str:
    """The `loso_table` numbers as Markdown (for docs)."""
    sources = [v[len(PREFIX):] for v in result.splits if is_loso(v)]
    heads = [*sources, "mean τ-b", "mean MAE", "max cov-err pts"]
    lines = ["**leave-one-source-out** (τ-b on the held-out source; train and calibrate on the other 6)\n",
             "| predictor | " + " | ".join(heads) + " |", "|---|" + "---:|" * len(heads)]
    for name, s in loso_summaries(result).items():
        lines.append(f"| {name} | " + " | ".join(_cells(s, sources)) + " |")
    return "\n".join(lines) + "\n"


def _cells(s: dict[str, Any], sources: Sequence[str]) -> list[str]:
    """One predictor's row: τ-b per source, mean τ-b, mean MAE, worst coverage error."""
    cells = [_fmt(s["per_source"].get(src, {}).get("kendall_tau_b"), "{:.3f}")
             if src not in s["failed"] else "failed" for src in sources]  # fmt: skip
    short = f" ({s['folds']}/{s['of']} folds)" if s["failed"] else ""  # why the means are missing
    return cells + [_fmt(s["mean_kendall_tau_b"], "{:.3f}") + short, _fmt(s["mean_mae"], "{:.1f}") + short,
                    _fmt(s["max_coverage_error_pts"], "{:.1f}") + short]  # fmt: skip


def _fmt(v: float | None, fmt: str) -> str:
    return "—" if v is None or not math.isfinite(v) else fmt.format(v)


def plot_loso(result: Evaluation, path: str | Path) -> Path | None:
    """Grouped bars: τ-b per held-out source, one colour per predictor (None if no LOSO rows)."""
    summaries = loso_summaries(result)
    sources = [v[len(PREFIX):] for v in result.splits if is_loso(v)]
    if not summaries or not sources:
        return None
    fig, ax = pyplot().subplots(figsize=(1.2 * len(sources) + 3, 4.2))
    width = 0.8 / len(summaries)
    x = np.arange(len(sources) + 1)
    for i, (name, s) in enumerate(summaries.items()):
        vals = [s["per_source"].get(src, {}).get("kendall_tau_b", math.nan) for src in sources]
        ax.bar(x + i * width - 0.4 + width / 2, [*vals, s["mean_kendall_tau_b"]], width, label=name)
    ax.set_xticks(x, [*sources, "mean"], fontsize=8)
    ax.axhline(0, color="0.5", lw=0.8)
    ax.set_ylabel("Kendall τ-b on the held-out source")
    ax.set_title("leave-one-source-out (train on the other 6 CASTILLO sources)", fontsize=9)
    ax.legend(fontsize=7)
    ax.grid(axis="y", alpha=0.3)
    return save(fig, path, dpi=110)
