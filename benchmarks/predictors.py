"""Output-length predictors on CASTILLO: every registered predictor, every view.

    python benchmarks/predictors.py [--quick N] [--views in-dist,cross-model,cross-dataset,loso]
                                    [--predictors a,b] [--out benchmarks/results]

Views (see `presched.predict.evaluate`): in-dist (fit on CASTILLO train + 75 % of validate,
calibrate on the other 25 %, test on the test split, 13 models), cross-model (9 models train,
4 held-out models test), cross-dataset (no ShareGPT in training, ShareGPT test), loso (7 fits,
each trained on 6 of CASTILLO's prompt sources and tested on the seventh; `presched.predict.loso`;
`--loso-predictors` picks who runs it). Targets: the
per-request mean of the 10 sampled lengths (samples at the 14,999-token cap left out); single-
sample scores beside. The default predictor is `text-gbm`; the anchors are `s3`, `ssjf`,
`listmle`, `lexical-gbm` and `encoder-l1` (the encoder family needs the `encoder` extra: torch).
A predictor that fails is reported and the run goes on.

Writes `<out>/predictors.json` (every row, the headline figures, what was not available) and
`<out>/predictors-{calibration,scatter}-<view>.png` and `<out>/predictors-loso.png`, prints the
tables, then exactly:

    figure: default_kendall_tau = …       in-dist τ-b of text-gbm
    figure: best_anchor_kendall_tau = …   best in-dist τ-b among the anchors
    figure: default_mae = …               in-dist MAE of text-gbm (tokens)
    figure: best_anchor_mae = …           best (lowest) in-dist MAE among the anchors
    figure: max_coverage_error_pts = …    text-gbm, in-dist: max |empirical − nominal| over q10…q90
    figure: cross_model_tau_drop = …      text-gbm: τ-b on the 4 held-out models when trained on
                                          them (in-dist) minus τ-b when not (cross-model)
    figure: default_single_latency_ms = … text-gbm, one request per call, p50 (this CPU)
    figure: loso_mean_tau = …             text-gbm: τ-b on the held-out source, mean over the 7 folds
    figure: loso_max_coverage_error_pts = … text-gbm: the worst fold's max coverage error (q10…q90)

A figure that cannot be computed (its predictor missing or failed) prints as `nan`.
`--quick N` keeps about N requests per side (seeded whole prompts) for a smoke run.
"""

from __future__ import annotations

import argparse
import math
import platform
import sys
import time
from pathlib import Path

import yaml
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from presched import __version__
from presched.predict.evaluate import (
    ANCHORS,
    BASELINES,
    DEFAULT,
    VIEWS,
    available_predictors,
    castillo_view,
    discover_predictors,  # fmt: skip
    evaluate,
)
from presched.predict.figures import headline_figures
from presched.predict.loso import evaluate_loso, loso_figures, loso_splits, merge
from presched.predict.report import markdown_table, render_table, write_all

QUICK_ENCODER = {"finetune_max_seconds": 20.0}
"""--quick caps the encoder family's stage-1 fine-tuning (default up to 300 s per fit)."""
FULL_ENCODER = {"finetune_epochs": 0}
"""The full run trains the encoder family's heads on the frozen pretrained encoder (stage 2
only) unless --finetune is given: on this 2-core CPU, stage 1 got through 0.075 epoch in 300 s
and then re-embedding every prompt took ~10 min, for no measurable gain on encoder-l1 (MAE 153.1
/ τ-b 0.510 fine-tuned vs 152.5 / 0.503 frozen; docs/predictors/encoder-l1.md)."""


def encoder_params(names: list[str], values: dict) -> dict[str, dict]:
    """`values` for every selected predictor of the encoder family that accepts them."""
    try:
        from presched.predict.encoder.predictor import DEFAULTS
    except Exception:  # noqa: BLE001 - encoder family not installed
        return {}
    from presched.predict import PREDICTORS
    from presched.predict.encoder.predictor import EncoderPredictor

    keys = {k: v for k, v in values.items() if k in DEFAULTS}
    return {n: dict(keys) for n in names if n in PREDICTORS and isinstance(PREDICTORS.get(n), type)
            and issubclass(PREDICTORS.get(n), EncoderPredictor) and keys}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", type=int, default=None, help="about N requests per side (smoke run)")
    ap.add_argument("--views", default=",".join((*VIEWS, "loso")), help="comma-separated subset of " + ", ".join((*VIEWS, "loso")))
    ap.add_argument("--loso-predictors", default=None,
                    help="who runs the 7 LOSO fits (default: the default, the anchors and the baselines among --predictors)")
    ap.add_argument("--predictors", default=None, help="comma-separated names (default: all registered)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    ap.add_argument("--param", action="append", default=[],
                    help="predictor argument PREDICTOR.KEY=VALUE (YAML value); repeatable")
    ap.add_argument("--markdown", action="store_true", help="also print the tables as Markdown (for docs)")
    ap.add_argument("--finetune", action="store_true",
                    help="full run: also fine-tune the encoder family's encoder (stage 1; slow on CPU)")
    args = ap.parse_args(argv)

    console = Console(width=max(Console().width, 160))
    missing = discover_predictors()
    for mod, why in missing.items():
        console.print(f"[yellow]NOT AVAILABLE: {mod}[/yellow] ({why}) — its predictors are not evaluated",
                      highlight=False)  # fmt: skip
    if "presched.predict.encoder" in missing:
        console.print("[yellow]the encoder family (s3, ssjf, encoder-l1, listmle) is missing: install the "
                      "`encoder` extra (torch) to evaluate it[/yellow]")  # fmt: skip
    names = [n.strip() for n in args.predictors.split(",")] if args.predictors else available_predictors()
    absent = [n for n in (DEFAULT, *ANCHORS) if n not in names]
    if absent:
        console.print(f"[yellow]not registered / not selected: {', '.join(absent)}[/yellow]")
    views = [v.strip() for v in args.views.split(",") if v.strip()]
    bad = [v for v in views if v not in (*VIEWS, "loso")]
    if bad:
        ap.error(f"--views: {bad[0]!r} is not one of {', '.join((*VIEWS, 'loso'))}")
    loso_names = ([n.strip() for n in args.loso_predictors.split(",")] if args.loso_predictors
                  else [n for n in names if n in (DEFAULT, *ANCHORS, *BASELINES)]) if "loso" in views else []  # fmt: skip
    views = [v for v in views if v != "loso"]
    if args.quick:
        params = encoder_params(names, QUICK_ENCODER)
    else:
        params = {} if args.finetune else encoder_params(names, FULL_ENCODER)
    for item in args.param:
        key, _, raw = item.partition("=")
        name, _, k = key.partition(".")
        params.setdefault(name.strip(), {})[k.strip()] = yaml.safe_load(raw)
    if params:
        console.print(f"predictor arguments: {params}")

    t0 = time.perf_counter()
    splits = [castillo_view(v, seed=args.seed, quick=args.quick) for v in views]
    folds = loso_splits(seed=args.seed, quick=args.quick) if loso_names else []
    load_s = time.perf_counter() - t0
    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=console, transient=True,
                        disable=not console.is_terminal)  # fmt: skip
    started = time.perf_counter()

    def step(label: str) -> None:
        progress.update(task, advance=1, description=label)
        if not console.is_terminal:  # a log file: one line per finished (view, predictor)
            print(f"done {label} ({time.perf_counter() - started:.0f} s)", flush=True)

    with progress:
        task = progress.add_task("evaluating", total=len(splits) * len(names) + len(folds) * len(loso_names))
        result = merge(
            evaluate(names, splits, params=params, seed=args.seed, single_calls=50 if args.quick else 200, on_step=step),
            evaluate_loso(loso_names, folds, params=params, seed=args.seed, on_step=step))
    render_table(result, console)
    if args.markdown:
        print(markdown_table(result))
    figures = {**headline_figures(result), **loso_figures(result)}
    meta = {
        "command": "python benchmarks/predictors.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "quick": args.quick, "params": params, "seed": args.seed, "views": views + ["loso"] * bool(loso_names),
        "predictors": names, "loso_predictors": loso_names,
        "default": DEFAULT, "anchors": list(ANCHORS), "not_available": missing,
        "presched": __version__, "python": platform.python_version(), "machine": platform.processor() or platform.machine(),
        "data_load_s": load_s, "wall_s": time.perf_counter() - t0,
    }  # fmt: skip
    paths = write_all(result, args.out, meta=meta, figures=figures)
    console.print("wrote " + ", ".join(str(p) for p in paths.values()))
    failed = [f"{r['view']}/{r['predictor']}" for r in result.rows if r.get("status") != "ok"]
    if failed:
        console.print(f"[red]failed: {', '.join(failed)}[/red]")
    for name, value in figures.items():
        print(f"figure: {name} = {'nan' if not math.isfinite(value) else f'{value:.4g}'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
