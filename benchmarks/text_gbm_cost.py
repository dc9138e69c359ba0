"""Where text-gbm's prediction time goes, and what fewer trees would buy.

    python benchmarks/text_gbm_cost.py                    # trains the default (~20 s), then ~1 min
    python benchmarks/text_gbm_cost.py --model m.npz      # a model saved by `presched train`

Per-request cost of each stage of `TextGBM.predict`, batched as `benchmarks/predictors.py`
measures it (calls of 64 never-seen CASTILLO test prompts, `evaluate.fresh`, one core), timed
*inside* whole calls (`staged_predict`: the same calls in the same order as `predict`, a clock
read between stages), so each stage pays the cache misses the others cause, as in a server:
timed alone in a loop, a stage looks up to 2x cheaper than it is. Stages: checks (and
de-duplicating prompts), one o200k encoding (which also gives the exact token count), n-gram
hashing, the LSA projection, the ridge text score, the lexical cues, feature assembly, the point
and spread boosters, the conformal quantiles. `staged` is their sum per call, `whole` the plain
`predict` on other never-seen prompts. Medians over `--batches` calls.

Then the point booster truncated to its first k trees (no refit, so the conformal quantiles are
not recalibrated): Kendall tau-b of mu and MAE of exp(mu) against the per-prompt mean on the
in-dist test split (docs/predictors.md), with the booster's cost per request.

Last, the whole predictor against the fast configuration `cues=False` (no lexical cues; fitted
here on the same split), both scored by `presched eval`'s harness (`evaluate.score_predictor`):
Kendall tau-b, MAE, worst coverage error, batched and single latency.

Writes benchmarks/results/text_gbm_cost.json; prints `figure: batched_ms_per_request = ...`
(the plain call), one figure per stage (`figure: stage_us_<name> = ...`) and the fast
configuration's (`figure: no_cues_<metric> = ...`).
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from presched.predict import features as F
from presched.predict.base import load_predictor, training_targets
from presched.predict.evaluate import castillo_view, fresh, score_predictor
from presched.predict.metrics import kendall_tau_b, ssjf_edges

OUT = Path(__file__).parent / "results"
TREES = (25, 50, 75, 100, 150)
COMPARED = ("kendall_tau_b", "mae", "max_coverage_error_pts", "latency_batch_p50_ms", "latency_single_p50_ms")


STAGES = ("checks", "encode", "hashing", "lsa", "ridge", "cues", "assemble", "point_booster", "spread_booster",
          "conformal")  # fmt: skip


def per_request_us(fn, batches) -> float:
    """Median over batches of (call time / batch size), in microseconds."""
    times = []
    for b in batches:
        t = time.perf_counter()
        fn(b)
        times.append((time.perf_counter() - t) * 1e6 / len(b))
    return statistics.median(times)


def staged_predict(pred, requests, spent: dict[str, float]) -> np.ndarray:
    """`pred.predict(requests).quantiles`, computed by the same calls in the same order as
    `TextGBM.predict`, with each stage's seconds added to `spent` (tests check both agree)."""
    from presched.predict.base import check_requests

    clock = [time.perf_counter()]

    def lap(stage: str) -> None:
        now = time.perf_counter()
        spent[stage] = spent.get(stage, 0.0) + now - clock[0]
        clock[0] = now

    pred.check_fitted()
    check_requests(requests, need_text=True)
    text_idx: dict[str, int] = {}
    inv = np.array([text_idx.setdefault(r.prompt, len(text_idx)) for r in requests])
    texts = list(text_idx)
    lap("checks")
    ids, off = F.encode(texts)
    lap("encode")
    X = pred.hasher.from_ids(ids, off)
    lap("hashing")
    proj = pred._project(X)
    lap("lsa")
    score = (X @ pred.coef).astype(np.float64) + pred.intercept
    lap("ridge")
    cues = pred._cues(texts)
    lap("cues")
    D = pred._dense(score, proj, np.diff(off), cues, inv, requests)
    lap("assemble")
    mu = pred.booster.predict(D, num_threads=1)
    lap("point_booster")
    sig = np.ones_like(mu)
    if pred.scale_booster is not None:
        sig = np.maximum(pred.scale_booster.predict(np.column_stack([D, mu]), num_threads=1), pred.params["sigma_floor"])
    lap("spread_booster")
    q = pred.conformal.apply(np.exp(mu), [r.model for r in requests] if pred.conformal.groups else None, sig)
    lap("conformal")
    return q


def stage_costs(pred, test, n_batches: int, batch: int, seed: int) -> dict[str, float]:
    """µs per request of each stage, timed inside whole staged calls on never-seen prompts (as
    a server meets them: caches hold whatever the previous call left), medians over batches;
    `staged` = their per-call sum, `whole` = `pred.predict` itself on other never-seen prompts."""
    rng = np.random.default_rng(seed)
    picks = [rng.choice(len(test), batch, replace=False) for _ in range(n_batches)]
    staged = [[fresh(test[i], k + 1) for i in p] for k, p in enumerate(picks)]
    plain = [[fresh(test[i], n_batches + k + 1) for i in p] for k, p in enumerate(picks)]
    pred.predict(staged[0][:8])  # warm-up (imports, lookup tables)
    per: dict[str, list[float]] = {s: [] for s in (*STAGES, "staged")}
    for b in staged:
        spent: dict[str, float] = {}
        staged_predict(pred, b, spent)
        for s in STAGES:
            per[s].append(spent.get(s, 0.0) * 1e6 / len(b))
        per["staged"].append(sum(spent.values()) * 1e6 / len(b))
    costs = {"whole": per_request_us(pred.predict, plain)}
    costs.update({s: statistics.median(v) for s, v in per.items()})
    return costs


def tree_tradeoff(pred, test, n_batches: int, batch: int) -> list[dict[str, float]]:
    y, keep = training_targets(test)
    D = pred._features(test)
    rows = []
    total = pred.booster.num_trees()
    chunks = [D[i:i + batch] for i in range(0, min(len(D), n_batches * batch), batch)]
    for k in [t for t in TREES if t < total] + [total]:
        mu = pred.booster.predict(D, num_iteration=k, num_threads=1)
        us = per_request_us(lambda d: pred.booster.predict(d, num_iteration=k, num_threads=1), chunks)
        rows.append({"trees": k, "kendall_tau_b": kendall_tau_b(mu[keep], y[keep]),
                     "mae_exp_mu": float(np.mean(np.abs(np.exp(mu[keep]) - y[keep]))), "booster_us": us})
    return rows


def compare_fast(pred, split) -> dict[str, dict[str, float]]:
    """`pred` and a `cues=False` text-gbm fitted on `split` (the rest of its parameters as
    `pred`'s), each scored on `split.test`."""
    from presched.predict.text_gbm import TextGBM

    y, keep = training_targets(split.train)
    edges = ssjf_edges(y[keep])
    fast = TextGBM(**{**pred.params, "cues": False}).fit(split.train, split.calibration)
    out = {}
    for name, p in (("default", pred), ("cues=False", fast)):
        row, _ = score_predictor(p, split, edges)
        out[name] = {k: float(row[k]) for k in COMPARED} | {"trees": p.booster.num_trees()}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, default=None, help="a text-gbm saved by `presched train` (default: train one)")
    ap.add_argument("--batches", type=int, default=40, help="calls per measurement")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    console = Console()
    split = castillo_view("in-dist")
    if args.model:
        pred = load_predictor(args.model)
    else:
        from presched.predict.base import PREDICTORS

        console.print("training text-gbm as `presched train` does (~20 s) ...")
        pred = PREDICTORS.create("text-gbm").fit(split.train, split.calibration)
    if pred.name != "text-gbm":
        sys.exit(f"--model: expected a text-gbm model, got {pred.name}")
    with console.status("timing the stages ..."):
        costs = stage_costs(pred, split.test, args.batches, args.batch_size, args.seed)
    with console.status("truncating the booster ..."):
        trees = tree_tradeoff(pred, split.test, args.batches, args.batch_size)
    with console.status("fitting and scoring cues=False ..."):
        configs = compare_fast(pred, split)

    t = Table(title=f"text-gbm, µs per request in calls of {args.batch_size} fresh prompts (median of {args.batches})")
    t.add_column("stage")
    t.add_column("µs", justify="right")
    for k, v in costs.items():
        t.add_row(k, f"{v:.1f}")
    console.print(t)
    t = Table(title="point booster truncated to k trees (in-dist test, per-prompt mean target)")
    for c in ("trees", "tau-b", "MAE exp(mu)", "booster µs"):
        t.add_column(c, justify="right")
    for r in trees:
        t.add_row(str(r["trees"]), f"{r['kendall_tau_b']:.4f}", f"{r['mae_exp_mu']:.1f}", f"{r['booster_us']:.1f}")
    console.print(t)

    t = Table(title="the default against cues=False (in-dist test)")
    t.add_column("configuration")
    for c in COMPARED:
        t.add_column(c, justify="right")
    for name, row in configs.items():
        t.add_row(name, *(f"{row[c]:.4g}" for c in COMPARED))
    console.print(t)

    args.out.mkdir(parents=True, exist_ok=True)
    result = {"meta": {"command": " ".join(["python", "benchmarks/text_gbm_cost.py", *sys.argv[1:]]),
                       "batch_size": args.batch_size, "batches": args.batches, "python": platform.python_version(),
                       "fit_info": pred.fit_info, "date": time.strftime("%Y-%m-%d")},
              "stage_us": costs, "trees": trees, "configurations": configs}  # fmt: skip
    (args.out / "text_gbm_cost.json").write_text(json.dumps(result, indent=1))
    print(f"figure: batched_ms_per_request = {costs['whole'] / 1e3:.4g}")
    for k, v in costs.items():
        if k != "whole":
            print(f"figure: stage_us_{k} = {v:.4g}")
    for k in COMPARED:
        print(f"figure: no_cues_{k} = {configs['cues=False'][k]:.4g}")


if __name__ == "__main__":
    main()
