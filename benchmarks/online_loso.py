"""Leave one source out, served online: how far online learning closes the gap that the
leave-one-source-out view (`presched eval --view loso`) leaves open.

    python benchmarks/online_loso.py [--quick] [--sources Apps,DS1000] [--out benchmarks/results]

For each of CASTILLO's 7 prompt sources (`online_streams.loso_shift`): text-gbm (default
parameters) trained on the other six sources, then served 70 % of the held-out source's prompts
(three models, each prompt once, in a seeded order) frozen, online (`OnlineLearner`, the
gateway's `--learn` defaults: recalibration, refits, drift alarm) and "retrained" (fitted
offline on the other 30 % of the source's prompts), exactly as `benchmarks/online.py` runs its
shifts (`online.run_shift`). Scored in windows of 200 requests against the served answer (one
sample: tau-b runs lower than the LOSO view's, which scores the mean of 10 samples). The streams
hold 420-800 requests, so the figures read each stream's *last full window*:

    figure: online_loso_frozen_tau = …       mean over the sources of the last window's tau-b
    figure: online_loso_online_tau = …
    figure: online_loso_retrained_tau = …
    figure: online_loso_frozen_coverage_err = …   the same for max |coverage - level| over q10..q90 (pts)
    figure: online_loso_online_coverage_err = …
    figure: online_loso_streams = …

Writes `<out>/online_loso.json` and `<out>/online_loso.png` (last-window tau-b and coverage
error per source, the three predictors).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from online import QUICK_GBM, run_shift  # noqa: E402
from online_streams import loso_shift  # noqa: E402

from presched.predict.loso import SOURCES  # noqa: E402
from presched.predict.online import OnlineConfig  # noqa: E402

WHO = ("frozen", "online", "retrained")


def last_windows(res: dict) -> dict[str, dict[str, float]]:
    """Per predictor, the scores of the stream's last full window."""
    return {who: res["windows"][who][-1] for who in WHO}


def figures(per_source: dict[str, dict[str, dict[str, float]]]) -> dict[str, float]:
    mean = lambda who, key: float(np.mean([s[who][key] for s in per_source.values()]))  # noqa: E731
    f = {f"online_loso_{who}_tau": mean(who, "tau_b") for who in WHO}
    f.update({f"online_loso_{who}_coverage_err": mean(who, "coverage_err_max_pts") for who in ("frozen", "online")})
    f["online_loso_streams"] = len(per_source)
    return f


def plot(per_source: dict, path: Path) -> None:
    from presched.plotting import pyplot, save

    fig, axes = pyplot().subplots(1, 2, figsize=(11, 3.8))
    names = list(per_source)
    x = np.arange(len(names))
    for ax, key, label in ((axes[0], "tau_b", "tau-b, last window"), (axes[1], "coverage_err_max_pts", "max coverage error (pts), last window")):
        for i, who in enumerate(WHO):
            ax.bar(x + (i - 1) * 0.27, [per_source[n][who][key] for n in names], 0.27, label=who)
        ax.set_xticks(x, names, fontsize=7)
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle("each CASTILLO source held out of training, then served: frozen vs online vs retrained", fontsize=9)
    save(fig, path, dpi=110)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short streams and a small text-gbm (smoke run)")
    ap.add_argument("--sources", default=",".join(SOURCES), help="comma-separated subset of " + ", ".join(SOURCES))
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = ap.parse_args(argv)
    sources = [s.strip() for s in args.sources.split(",") if s.strip()]
    bad = [s for s in sources if s not in SOURCES]
    if bad or not sources:
        ap.error(f"--sources: {bad[0] if bad else '(none)'!r} is not a CASTILLO prompt source ({', '.join(SOURCES)})")
    limit, gbm = (420, QUICK_GBM) if args.quick else (None, {})
    cfg = OnlineConfig(enabled=True, tenant_rate=1e9, tenant_burst=10**9,
                       **({"refit_every": 200, "min_refit": 150, "holdout": 50, "anchor_rows": 200} if args.quick else {}))  # fmt: skip
    t0 = time.perf_counter()
    runs, per_source = {}, {}
    for src in sources:
        runs[src] = res = run_shift(loso_shift(src, limit=limit), gbm, cfg, 64, 16)
        per_source[src] = last_windows(res)
        print(f"{src:<13} n {res['n']:>4}  " + "  ".join(
            f"{who} tau {per_source[src][who]['tau_b']:.3f} cov {per_source[src][who]['coverage_err_max_pts']:.1f}" for who in WHO))
    figs = figures(per_source)
    doc = {"figures": figs, "last_windows": per_source, "runs": runs, "quick": args.quick,
           "config": cfg.model_dump(), "seconds": time.perf_counter() - t0}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "online_loso.json").write_text(json.dumps(doc, indent=1, default=float))
    plot(per_source, args.out / "online_loso.png")
    for k, v in figs.items():
        print(f"figure: {k} = {v:.4g}")
    return doc


if __name__ == "__main__":
    main()
