"""Online learning under two distribution shifts: frozen vs online vs retrained text-gbm.

    python benchmarks/online.py [--quick] [--out benchmarks/results] [--gateway]

Streams and runs: `online_streams.py` (shift (a) code sources -> Dolly + Alpaca + ShareGPT,
shift (b) Llama-3.1-8B answers -> Qwen2.5-14B answers mid-stream). Each stream is scored in
windows of 200 requests (tau-b of rank score vs the served length; coverage error of q10..q90 in
points). Writes `<out>/online.json` and `<out>/online.png` (tau-b and coverage per window, the
three predictors, both shifts), then prints:

    figure: online_tau_gap_after_1000 = …    shift (a): retrained - online tau-b, window after 1,000
    figure: online_coverage_err_after_500 = …   shift (a): online, max |coverage - level| over
                                               q10..q90 (pts) in the window after 500 completions
    figure: drift_alarm_delay_requests = …    shift (b): completions from the swap to the first alarm
                                               (nan: none; the same for a Llama -> Gemma-3-12B swap,
                                               shift (c), on a line of its own)
    figure: online_update_us = …              CPU per learned completion (observe), refits apart

A 200-request window has sampling noise: a perfectly calibrated predictor's max |error| over the
nine levels is ~5 pts there (`coverage_noise_floor_pts`, simulated and printed beside), and
`calibrated_coverage_err_after_500` is the same figure, in the same window of the same stream,
for a reference calibrated by construction (each request's quantiles are the order statistics of
the other 9 CASTILLO samples of its answer: `online_streams.calibrated_reference`). `--quick`
runs small streams (a smoke run; the figures need the full streams). `--gateway` also drives a
short stream through `presched serve --learn` against the stub (`online_gateway.py`).
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from online_streams import calibrated_reference, predict_all, run_online, score, sources_shift, swap_shift, window_scores  # noqa: E402

from presched.predict.metrics import coverage_noise_floor_pts  # noqa: E402
from presched.predict.online import OnlineConfig  # noqa: E402
from presched.predict.text_gbm import TextGBM  # noqa: E402

WINDOW = 200
QUICK_GBM = {"folds": 2, "svd": 8, "max_rounds": 60, "scale_folds": 2}


def run_shift(shift, gbm_params: dict, cfg: OnlineConfig, inflight: int, batch: int) -> dict:
    y = np.array([r.output_tokens for r in shift.stream], dtype=float)
    t0 = time.perf_counter()
    frozen = TextGBM(**gbm_params).fit(shift.base_train)
    retrained = TextGBM(**gbm_params).fit(shift.retrain_train)
    fit_s = time.perf_counter() - t0
    online = run_online(frozen, shift, cfg, inflight, batch)
    est = {"frozen": predict_all(frozen, shift.stream), "online": online.pop("estimate"),
           "retrained": predict_all(retrained, shift.stream)}  # fmt: skip
    rows = {k: window_scores(e, y, WINDOW) for k, e in est.items()}
    starts = (500, 1000, *((shift.change_at,) if shift.change_at is not None else ()))
    after = {k: {str(lo): score(e, y, lo, WINDOW) for lo in starts} for k, e in est.items()}
    ref, y_ref = calibrated_reference(shift)  # the coverage's noise floor, window by window
    reference = {"windows": window_scores(ref, y_ref, WINDOW), "after": {str(lo): score(ref, y_ref, lo, WINDOW) for lo in starts}}
    return {"shift": shift.name, "n": len(y), "change_at": shift.change_at, "windows": rows, "after": after,
            "calibrated_reference": reference, "fit_seconds": fit_s, **online}  # fmt: skip


def alarm_delay(res: dict) -> tuple[float, int]:
    """(completions from the change to the first alarm after it (nan: none), alarms before it)."""
    t0 = res["change_at"]
    after = [t for t in res["alarms"] if t > t0]
    return (float(after[0] - t0) if after else math.nan), len(res["alarms"]) - len(after)


def figures(a: dict, b: dict, c: dict) -> dict[str, float]:
    wa = a["after"]

    def at(rows: dict, start: int, key: str) -> float:
        return rows[str(start)][key]

    delay_b, before_b = alarm_delay(b)
    delay_c, before_c = alarm_delay(c)
    runs = (a, b, c)
    upd = [r["observe_us"] for r in runs]
    refit_cpu = sum(sum(r["refit_seconds"]) for r in runs)
    learned = sum(r["status"].get("learned", 0) for r in runs)
    return {
        "online_tau_gap_after_1000": at(wa["retrained"], 1000, "tau_b") - at(wa["online"], 1000, "tau_b"),
        "online_coverage_err_after_500": at(wa["online"], 500, "coverage_err_max_pts"),
        "drift_alarm_delay_requests": delay_b,
        "online_update_us": float(np.mean(upd)),
        # context, not goals
        "frozen_tau_after_1000": at(wa["frozen"], 1000, "tau_b"),
        "online_tau_after_1000": at(wa["online"], 1000, "tau_b"),
        "retrained_tau_after_1000": at(wa["retrained"], 1000, "tau_b"),
        "frozen_coverage_err_after_500": at(wa["frozen"], 500, "coverage_err_max_pts"),
        "online_coverage_err_mean_after_500": at(wa["online"], 500, "coverage_err_mean_pts"),
        "online_coverage_err_after_500_swap": at(b["after"]["online"], 500, "coverage_err_max_pts"),
        "coverage_noise_floor_pts": coverage_noise_floor_pts(WINDOW),
        "calibrated_coverage_err_after_500": at(a["calibrated_reference"]["after"], 500, "coverage_err_max_pts"),
        "calibrated_coverage_err_windows_mean": float(np.nanmean([w["coverage_err_max_pts"] for w in a["calibrated_reference"]["windows"]])),
        "false_alarms_before_swap": float(before_b + before_c),
        "drift_alarm_delay_requests_gemma": delay_c,
        "frozen_coverage_err_after_swap": at(b["after"]["frozen"], b["change_at"], "coverage_err_max_pts"),
        "frozen_coverage_err_after_swap_gemma": at(c["after"]["frozen"], c["change_at"], "coverage_err_max_pts"),
        "refit_cpu_us_per_completion": 1e6 * refit_cpu / max(1, learned),
    }


def plot(results: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, len(results), figsize=(6 * len(results), 7), squeeze=False)
    for col, res in enumerate(results):
        for name, rows in res["windows"].items():
            x = [w["start"] + WINDOW / 2 for w in rows]
            axes[0][col].plot(x, [w["tau_b"] for w in rows], marker="o", label=name)
            axes[1][col].plot(x, [w["coverage_err_max_pts"] for w in rows], marker="o", label=name)
        ref = res["calibrated_reference"]["windows"]
        axes[1][col].plot([w["start"] + WINDOW / 2 for w in ref], [w["coverage_err_max_pts"] for w in ref],
                          color="grey", ls=":", marker=".", label="calibrated reference (noise floor)")  # fmt: skip
        for row in (0, 1):
            for t in res["alarms"]:
                axes[row][col].axvline(t, color="red", alpha=0.3, lw=1)
            if res["change_at"] is not None:
                axes[row][col].axvline(res["change_at"], color="black", ls="--", lw=1)
        axes[0][col].set_title(f"{res['shift']} (red: drift alarms)")
        axes[0][col].set_ylabel("Kendall tau-b per window")
        axes[1][col].set_ylabel("max coverage error q10..q90 (pts)")
        axes[1][col].set_xlabel("request (arrival order)")
        axes[0][col].legend()
        axes[1][col].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small streams and a small text-gbm (smoke run)")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    ap.add_argument("--inflight", type=int, default=64, help="requests in flight between prediction and completion")
    ap.add_argument("--batch", type=int, default=16, help="requests per prediction batch")
    ap.add_argument("--gateway", action="store_true", help="also drive a short stream through the gateway")
    args = ap.parse_args(argv)
    limit = 450 if args.quick else None
    gbm = QUICK_GBM if args.quick else {}
    cfg = OnlineConfig(enabled=True, tenant_rate=1e9, tenant_burst=10**9,
                       **({"refit_every": 200, "min_refit": 150, "holdout": 50, "anchor_rows": 200} if args.quick else {}))  # fmt: skip
    t0 = time.perf_counter()
    a = run_shift(sources_shift(limit=limit), gbm, cfg, args.inflight, args.batch)
    swap_at = 225 if args.quick else 1200
    b = run_shift(swap_shift(swap_at=swap_at, limit=limit), gbm, cfg, args.inflight, args.batch)
    c = run_shift(swap_shift(swap_to="gemma-3-12b", swap_at=swap_at, limit=limit), gbm, cfg, args.inflight, args.batch)
    figs = figures(a, b, c)
    doc = {"figures": figs, "shifts": [a, b, c], "config": cfg.model_dump(), "quick": args.quick, "window": WINDOW,
           "inflight": args.inflight, "batch": args.batch, "cpu": platform.processor() or platform.machine(),
           "seconds": time.perf_counter() - t0}  # fmt: skip
    if args.gateway:
        from online_gateway import drive_gateway

        shift = sources_shift(limit=limit)
        frozen = TextGBM(**gbm).fit(shift.base_train)
        small = cfg.model_copy(update={"refit_every": 100, "min_refit": 60, "holdout": 20, "anchor_rows": 200})
        doc["gateway"] = g = drive_gateway(frozen, shift.stream, small)
        print(f"gateway: {g['status_200']}/{g['requests']} answered in {g['wall_s']:.1f} s; versions logged "
              f"{g['versions_logged']}; learner {g['counts']}")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "online.json").write_text(json.dumps(doc, indent=1, default=float))
    plot([a, b, c], args.out / "online.png")
    for res in (a, b, c):
        for name, rows in res["windows"].items():
            print(f"{res['shift']:<34} {name:<9} tau " + " ".join(f"{w['tau_b']:.2f}" for w in rows))
        print(f"{res['shift']:<34} alarms at {res['alarms']}; refits {len(res['refit_seconds'])}")
    for k, v in figs.items():
        print(f"figure: {k} = {v:.4g}")
    return doc


if __name__ == "__main__":
    main()
