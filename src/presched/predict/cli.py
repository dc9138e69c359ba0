"""The output-length predictors' commands: `presched train`, `presched eval`, `presched predict`.

These are typer command FUNCTIONS, registered by `presched.cli` on its app under those names:

    from presched.predict.cli import eval_, predict, train
    app.command()(train); app.command()(predict); app.command("eval")(eval_)

This module does not import `presched.cli` (so either may be imported first, and `python -m
presched.cli` does not load cli.py twice). Bad input raises `UserError` naming the option, which
`presched.cli.main` prints and ends with exit code 2, never a traceback. Heavy parts (LightGBM,
the encoders, the CASTILLO loader) are imported inside the commands, when they run.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Optional

import typer
import yaml
from rich.console import Console

from presched.cliutil import csv_list as _csv
from presched.cliutil import err
from presched.cliutil import progress_bar as _progress
from presched.config import UserError

DataOpt = typer.Option("castillo", "--data", "-d", help="Where the labelled requests come from: `castillo` (the shared CASTILLO data: 13 models x 10 sampled lengths per prompt, with its own train/validate/test splits) or a PATH to your own log in the generic schema (JSONL or CSV, optionally .gz: prompt text, model, output_tokens and/or output_samples; see docs/workloads.md).")
SeedPredOpt = typer.Option(0, "--seed", help="Seed of every random split (which prompts go to validation/calibration/test) and of the latency sample.")
SeedTrainOpt = typer.Option(0, "--seed", help="Seed of the random validation split (which prompts are held out) and of the predictor's own randomness.")


def _params(items: list[str], scoped: bool) -> dict:
    """KEY=VALUE (train) or PREDICTOR.KEY=VALUE (eval) items to predictor constructor arguments."""
    out: dict = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            want = "PREDICTOR.KEY=VALUE, e.g. text-gbm.num_trees=200" if scoped else "KEY=VALUE, e.g. num_trees=200"
            raise UserError(f"--param {item!r}: expected {want}")
        value = yaml.safe_load(raw)
        if scoped:
            name, dot, k = key.strip().partition(".")
            if not dot or not k:
                raise UserError(f"--param {item!r}: expected PREDICTOR.KEY=VALUE, e.g. text-gbm.num_trees=200")
            out.setdefault(name, {})[k] = value
        else:
            out[key.strip()] = value
    return out


def _check_predictor(name: str) -> str:
    """The registered name (`default`: the recommended predictor, evaluate.DEFAULT); a clear
    error for an unknown one."""
    from presched.predict import PREDICTORS
    from presched.predict.evaluate import DEFAULT, ensure_registered

    name = DEFAULT if name == "default" else name
    ensure_registered([name])
    if name not in PREDICTORS:
        known = ", ".join(sorted(PREDICTORS.names()))
        raise UserError(f"predictor: unknown predictor {name!r}; known: default, {known}")
    return name


def _load_data(data: str, split: Optional[str]) -> tuple[list, bool]:
    """(requests, is_castillo). CASTILLO: the given splits (default train,validate); a PATH: all
    rows, or those whose `split` column is in --split."""
    from presched.predict.data import castillo_requests
    from presched.workload.loaders.generic import load_generic

    wanted = _csv(split)
    if data.lower() == "castillo":
        splits = wanted or ["train", "validate"]
        bad = [s for s in splits if s not in ("train", "validate", "test")]
        if bad:
            raise UserError(f"--split: {bad[0]!r} is not a CASTILLO split (train, validate, test)")
        return castillo_requests(splits), True
    path = Path(data)
    if not path.exists():
        raise UserError(f"--data: file not found: {path} (give `castillo` or a JSONL/CSV file in the generic schema)")
    reqs = load_generic(path)
    if wanted:
        reqs = [r for r in reqs if r.metadata.get("split") in wanted]
        if not reqs:
            raise UserError(f"--split: no row of {path} has field 'split' in {', '.join(wanted)}")
    if not reqs:
        raise UserError(f"--data: {path} has no requests")
    return reqs, False


def _load_model(path: Path):
    """load_predictor, importing the optional predictor modules only when the file names a
    predictor that is not registered yet."""
    from presched.predict import load_predictor
    from presched.predict.evaluate import discover_predictors
    from presched.registry import UnknownNameError

    try:
        return load_predictor(path)
    except UnknownNameError:
        missing = discover_predictors()
        try:
            return load_predictor(path)
        except UnknownNameError as e:
            hint = f" (not importable here: {'; '.join(f'{m}: {w}' for m, w in missing.items())})" if missing else ""
            raise UserError(f"{path}: {e}{hint}") from None


def _resolve_models(pred, reqs: list) -> list:
    """Requests with model names matched to the predictor's fitted ones; a `warning:` line on
    stderr for each served model it was not fitted on (docs/predictors.md, unseen models)."""
    import warnings

    from presched.predict.served_models import resolve_for

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reqs, _ = resolve_for(pred, reqs)
    for w in caught:
        err.print(f"[yellow]warning:[/yellow] {w.message}", highlight=False, soft_wrap=True)
    return reqs


def train(
    predictor: str = typer.Option(..., "--predictor", "-p", help="Predictor to train, by name (e.g. text-gbm, text-gbm-static, lexical-gbm, model-median, linear-prompt; `presched eval --help` and docs/predictors.md list them), or `default`: the recommended one (text-gbm)."),
    out: Path = typer.Option(..., "--out", "-o", help="Where to write the trained model (a single .npz file; `presched predict --model-file` and `presched eval --model-file` read it)."),
    data: str = DataOpt,
    split: Optional[str] = typer.Option(None, "--split", help="Comma-separated splits to train on. CASTILLO: train, validate, test (default train,validate, i.e. everything but the test split). Your own file: values of its `split` column (default: every row)."),
    validation_fraction: float = typer.Option(0.25, "--validation-fraction", help="Share of the prompts held out of training and passed to the predictor as validation data (early stopping, conformal calibration), grouped by prompt. For CASTILLO it is taken from the validate split when that is used. 0 = none."),
    seed: int = SeedTrainOpt,
    param: list[str] = typer.Option([], "--param", metavar="KEY=VALUE", help="Predictor constructor argument KEY=VALUE (value read as YAML); repeatable, e.g. --param max_rounds=200."),
    from_log: Optional[Path] = typer.Option(None, "--from-log", help="Train on the gateway's request log (the SQLite file `presched serve` writes, log.path) instead of --data: requests that succeeded (status 200) with a known output length. Requests cut by max_tokens, the context window or vLLM's repetition detector are left out (their true length is unknown). Predictors that read prompt text (text-gbm, lexical-gbm, encoders) need prompt logging (log.store_prompts) to have been on; model-median and linear-prompt train on any log."),
    keep_censored: bool = typer.Option(False, "--keep-censored", help="--from-log: also train on requests cut by max_tokens, the context window or a repetition stop (forced lengths, e.g. replayed with ignore_eos), taking the cut length as the truth. Off by default: a cut length is only a lower bound of the true one."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress lines; only the final summary line."),
) -> None:
    """Train one output-length predictor on labelled requests (CASTILLO, your own file, or the
    gateway's request log) and save it as a .npz model file."""
    import time

    from presched.predict import PREDICTORS
    from presched.predict.evaluate import check_labelled, group_split

    predictor = _check_predictor(predictor)
    if not 0 <= validation_fraction < 1:
        raise UserError(f"--validation-fraction: expected a number in [0, 1), got {validation_fraction}")
    kwargs = _params(param, scoped=False)
    if keep_censored and from_log is None:
        raise UserError("--keep-censored: only with --from-log")
    if from_log is not None:
        if data != "castillo" or split is not None:
            raise UserError("--from-log: give either --from-log or --data/--split, not both")
        from presched.serve.train_log import train_from_log

        try:
            path, rep = train_from_log(from_log, predictor, out, params=kwargs,
                                       validation_fraction=validation_fraction, seed=seed,
                                       keep_censored=keep_censored)  # fmt: skip
        except ValueError as e:  # the log, its rows or the parameters: messages name them
            raise UserError(str(e)) from None
        Console().print(f"trained {predictor} on {rep['fit_requests']:,} logged requests "
                        f"({rep['validation_requests']:,} for validation) in {rep['fit_s']:.1f} s; "
                        f"{rep['summary']}; wrote {path} ({rep['bytes'] / 1024:,.0f} KB)")  # fmt: skip
        return
    try:  # before loading any data: a bad --param is refused at once
        pred = PREDICTORS.create(predictor, **kwargs)
    except (TypeError, ValueError) as e:  # an unknown parameter, or one of the wrong kind
        raise UserError(f"--param: {e}") from None
    say = (lambda msg: None) if quiet else (lambda msg: err.print(msg, highlight=False, soft_wrap=True))
    say(f"loading {data}" + (f" ({split})" if split else ""))
    reqs, is_castillo = _load_data(data, split)
    check_labelled(reqs, "training data")
    if is_castillo and any(r.metadata.get("split") == "validate" for r in reqs):
        val_pool = [r for r in reqs if r.metadata.get("split") == "validate"]
        rest, validation = group_split(val_pool, validation_fraction, seed)
        fit_on = [r for r in reqs if r.metadata.get("split") != "validate"] + rest
    else:
        fit_on, validation = group_split(reqs, validation_fraction, seed)
    say(f"fitting {predictor} on {len(fit_on):,} requests ({len(validation):,} for validation)")
    t0 = time.perf_counter()
    pred.fit(fit_on, validation=validation or None)
    took = time.perf_counter() - t0
    path = pred.save(out)
    Console().print(f"trained {predictor} on {len(fit_on):,} requests ({len(validation):,} for validation) "
                    f"in {took:.1f} s; wrote {path} ({path.stat().st_size / 1024:,.0f} KB)", soft_wrap=True)  # fmt: skip


def _check_fractions(test_fraction: float, validation_fraction: float) -> None:
    """eval's random split: --test-fraction in (0, 1), --validation-fraction in [0, 1), sum < 1."""
    if not 0 < test_fraction < 1:
        raise UserError(f"--test-fraction: expected a number in (0, 1), got {test_fraction:g}")
    if not 0 <= validation_fraction < 1:
        raise UserError(f"--validation-fraction: expected a number in [0, 1), got {validation_fraction:g}")
    if test_fraction + validation_fraction >= 1:
        raise UserError(f"--test-fraction + --validation-fraction: expected below 1, got "
                        f"{test_fraction:g} + {validation_fraction:g}")  # fmt: skip


def predict(
    model_file: Path = typer.Option(..., "--model-file", "-m", help="A model saved by `presched train` (.npz)."),
    input: Path = typer.Option(..., "--input", "-i", help="Requests to predict, in the generic schema (JSONL or CSV): prompt text (and/or prompt_tokens) and model; output lengths, if present, are ignored."),
    output: Optional[Path] = typer.Option(None, "--output", "-o", help="Write one JSON line per request here (default: standard output)."),
    thresholds: str = typer.Option("256,512,1024,2048", "--thresholds", help="Comma-separated token counts x for which to report P(length > x)."),
) -> None:
    """Predict the output-length distribution of each request: point estimate, quantiles
    q10…q99, P(length > x) for a few x, and the rank score (larger = predicted longer)."""
    from presched.predict import LEVELS
    from presched.workload.loaders.generic import load_generic

    xs = _csv(thresholds, float, "--thresholds") or []
    if any(not math.isfinite(x) or x < 0 for x in xs):  # NaN failed `x < 0` and crashed later
        raise UserError(f"--thresholds: token counts must be finite numbers >= 0, got {thresholds!r}")
    pred = _load_model(model_file)
    if not input.exists():
        raise UserError(f"--input: file not found: {input}")
    reqs = load_generic(input, ignore=("output_tokens", "output_samples"))
    if not reqs:
        raise UserError(f"--input: {input} has no requests")
    est = pred.predict(_resolve_models(pred, reqs))  # the rows keep the names as given
    surv = {x: est.survival(x) for x in xs}
    lines = []
    for i, r in enumerate(reqs):
        row = {"id": r.id, "model": r.model, "point": round(float(est.point[i]), 2),
               "rank_score": float(est.rank_score[i]),
               "quantiles": {f"q{round(lv * 100)}": round(float(v), 2) for lv, v in zip(LEVELS, est.quantiles[i])},
               "p_longer": {f"{x:g}": round(float(surv[x][i]), 4) for x in xs}}  # fmt: skip
        lines.append(json.dumps(row))
    text = "\n".join(lines) + "\n"
    if output is None:
        sys.stdout.write(text)
    else:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text)
        err.print(f"wrote {len(lines):,} predictions to {output}")


def eval_(
    predictors: Optional[str] = typer.Option(None, "--predictors", "-p", help="Comma-separated predictor names (default: every registered predictor that needs no serving model: the default text-gbm, the anchors s3, ssjf, listmle, lexical-gbm, encoder-l1 where installed, the baselines global-median, model-median, linear-prompt, stack, and text-gbm-static with its extra installed)."),
    view: str = typer.Option("all", "--view", help="CASTILLO view: in-dist (fit on train + validate, test on test), cross-model (train on 9 models, test on 4 others), cross-dataset (train without ShareGPT, test on ShareGPT), loso (leave-one-source-out: 7 fits, each trained on 6 of CASTILLO's prompt sources and tested on the seventh; per-source and mean τ-b, MAE, coverage error; not timed), or all (in-dist, cross-model, cross-dataset; not loso). Comma-separated views are run together. Your own --data file: in-dist only (a random prompt-disjoint split)."),
    data: str = DataOpt,
    model_file: Optional[Path] = typer.Option(None, "--model-file", "-m", help="Score this saved model on every row of --data (a held-out file) instead of training predictors."),
    out: Path = typer.Option(Path("presched-results/predictors"), "--out", "-o", help="Folder for predictors.json and the PNGs (calibration and predicted-vs-true per view)."),
    quick: Optional[int] = typer.Option(None, "--quick", help="Smoke run: keep about N requests (whole prompts, seeded) in each of train, calibration and test, and time 50 single calls instead of 200."),
    test_fraction: float = typer.Option(0.2, "--test-fraction", help="Your own --data file: share of prompts held out for testing, in (0, 1) (ignored when the file has a `split` column: then every row's must be train, validate or test)."),
    validation_fraction: float = typer.Option(0.1, "--validation-fraction", help="Your own --data file: share of prompts held out for calibration / early stopping."),
    seed: int = SeedPredOpt,
    param: list[str] = typer.Option([], "--param", metavar="PREDICTOR.KEY=VALUE", help="Predictor constructor argument PREDICTOR.KEY=VALUE (value read as YAML); repeatable."),
    quiet: bool = typer.Option(False, "--quiet", "-q", help="No progress bar and no table; still writes the files."),
) -> None:
    """Evaluate output-length predictors: fit each on a prompt-disjoint training side, score it
    on the test side (MAE, RMSE, Acc-50/100, SSJF 5-class accuracy, Kendall τ-b, Spearman,
    pairwise accuracy, coverage per quantile level, pinball loss, under-prediction at q90,
    single and batched latency, size on disk). Prints tables, writes predictors.json and PNGs."""
    from presched.predict import PREDICTORS
    from presched.predict.evaluate import (
        VIEWS,
        available_predictors,
        castillo_view,
        check_labelled,
        discover_predictors,
        ensure_registered,
        evaluate,
        evaluate_saved,
        generic_split,
    )
    from presched.predict.loso import evaluate_loso, loso_splits, merge
    from presched.predict.report import full_width, render_table, write_all

    explicit = _csv(predictors)
    missing = ensure_registered(explicit) if explicit and model_file is None else (
        {} if model_file is not None else discover_predictors())  # fmt: skip
    if quick is not None and quick < 10:
        raise UserError(f"--quick: expected at least 10 requests, got {quick}")
    single_calls = 50 if quick else 200
    console = Console()
    is_castillo = data.lower() == "castillo"
    if model_file is not None:
        if view not in ("all", "in-dist"):  # the other views train their predictors
            raise UserError(f"--view: a --model-file is scored as saved, on every row of --data (CASTILLO: "
                            f"the in-dist test rows); view {view!r} trains predictors: drop --model-file")
        if is_castillo:
            reqs = castillo_view("in-dist", seed=seed, quick=quick).test
        else:
            reqs, _ = _load_data(data, None)
        pred = _load_model(model_file)
        reqs = _resolve_models(pred, reqs)  # as `presched predict` scores them: org/name = org--name
        result = evaluate_saved(pred, reqs, f"{pred.name} ({model_file.name})", single_calls=single_calls, seed=seed)
        names = [pred.name]
    else:
        names = explicit or available_predictors()
        for n in names:
            if n not in PREDICTORS:
                hint = f"; not importable here: {', '.join(missing)}" if missing else ""
                raise UserError(f"--predictors: unknown predictor {n!r}; known: {', '.join(PREDICTORS.names())}{hint}")
        views = list(VIEWS) if view == "all" else _csv(view) or []
        bad = [v for v in views if v not in (*VIEWS, "loso")]
        if bad or not views:
            raise UserError(f"--view: expected one of {', '.join(VIEWS)}, loso or all, got {view!r}")
        loso = "loso" in views
        views = [v for v in views if v != "loso"]
        if is_castillo:
            if not quiet and not console.is_terminal:  # the views take a while to build
                names_built = ", ".join(views + ["loso"] * loso)
                err.print(f"building the CASTILLO views: {names_built}", highlight=False, soft_wrap=True)
            splits = [castillo_view(v, seed=seed, quick=quick) for v in views]
            loso_folds = loso_splits(seed=seed, quick=quick) if loso else []
        else:
            if view not in ("all", "in-dist"):
                raise UserError(f"--view: {view} needs CASTILLO (--data castillo); a file of your own has only in-dist")
            reqs, _ = _load_data(data, None)
            check_labelled(reqs, "--data")
            if not any(r.metadata.get("split") is not None for r in reqs):  # a random split: its fractions
                _check_fractions(test_fraction, validation_fraction)
            try:
                splits = [generic_split(reqs, test_fraction, validation_fraction, seed)]
            except ValueError as e:
                raise UserError(str(e)) from None
            loso_folds = []
        kwargs = _params(param, scoped=True)
        with _progress(console, quiet, lines=True) as prog:
            task = prog.add_task("evaluating", total=(len(splits) + len(loso_folds)) * len(names))
            step = lambda label: prog.update(task, advance=1, description=label)  # noqa: E731
            result = merge(evaluate(names, splits, params=kwargs, single_calls=single_calls, seed=seed, on_step=step),
                           evaluate_loso(names, loso_folds, params=kwargs, seed=seed, on_step=step))  # fmt: skip
    if not quiet:
        if not console.is_terminal:  # logs and pipes: whole rows, headers on one line
            console.width = max(console.width, full_width(result))
        render_table(result, console)
        for mod, why in missing.items():
            console.print(f"[yellow]not available:[/yellow] {mod} ({why})", highlight=False)
    meta = {"data": data, "view": view, "quick": quick, "seed": seed, "predictors": names,
            "model_file": str(model_file) if model_file else None, "not_available": missing}  # fmt: skip
    paths = write_all(result, out, meta=meta)
    console.print("wrote " + ", ".join(str(p) for p in paths.values()))
    failed = [r for r in result.rows if r.get("status") != "ok"]
    if failed and len(failed) == len(result.rows):
        raise UserError("every predictor failed: " + "; ".join(f"{r['predictor']}: {r['error']}" for r in failed[:3]))
