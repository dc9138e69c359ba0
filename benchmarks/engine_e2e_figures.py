"""benchmarks/engine_e2e.py's summaries and figures: medians over repeats, per-repeat paired ratios
(the spread a median must clear), gain capture, and the headline `figure:` values."""

from __future__ import annotations

import statistics
from typing import Any

import numpy as np

from engine_e2e_configs import CONFIGS, PLUGINS


# --- summaries ---------------------------------------------------------------------------------
def med(xs) -> float:
    xs = [x for x in xs if x is not None and np.isfinite(x)]
    return float(statistics.median(xs)) if xs else float("nan")


def summarize_runs(runs: list[dict]) -> dict[str, dict[str, Any]]:
    """Per configuration: medians over repeats (and the per-repeat values) of the measured
    figures, the simulator's, and its signed error on mean E2E."""
    out: dict[str, dict[str, Any]] = {}
    for name, (_, policy) in CONFIGS.items():
        rows = [r for r in runs if r["config"] == name]
        if not rows:
            continue
        s: dict[str, Any] = {"policy_simulated": policy, "repeats": len(rows)}
        for k in ("mean_e2el_ms", "p99_e2el_ms", "short_p99_e2el_ms", "output_throughput", "mean_ttft_ms"):
            vals = [r["summary"][k] for r in rows]
            sim = [r["sim"].get(k) for r in rows]
            s[k], s[f"{k}_each"], s[f"sim_{k}"] = med(vals), vals, med(sim)
        err = [100 * (r["sim"]["mean_e2el_ms"] / r["summary"]["mean_e2el_ms"] - 1) for r in rows]
        s["sim_mean_e2e_error_pct_each"] = err
        prior = [100 * (r["sim_a_priori"]["mean_e2el_ms"] / r["summary"]["mean_e2el_ms"] - 1) for r in rows]
        s["sim_a_priori_mean_e2e_error_pct_each"] = prior
        s["sim_a_priori_mean_e2e_abs_error_pct"] = med([abs(e) for e in prior])
        s["speed_factor_each"] = [r["speed_factor"] for r in rows]
        s["sim_e2e_pct_per_5pct_slower_each"] = [
            100 * (r["sim_slower"]["mean_e2el_ms"] / r["sim"]["mean_e2el_ms"] - 1) for r in rows]  # fmt: skip
        s["sim_mean_e2e_error_pct"] = med(err)
        s["sim_mean_e2e_abs_error_pct"] = med([abs(e) for e in err])
        s["engine_decode_ms_per_token"] = 1e3 * med([r["engine_decode_s_per_token"] for r in rows])
        s["others_cores"] = med([r["others_cores"] for r in rows])
        s["failed"] = sum(r["summary"]["failed"] for r in rows)
        out[name] = s
    return out


def paired_ratios(runs: list[dict], a: str, b: str, key: str = "mean_e2el_ms") -> list[float]:
    """Per repeat, a's figure / b's figure within that repeat."""
    by = {(r["config"], r["repeat"]): r["summary"][key] for r in runs}
    reps = sorted({r["repeat"] for r in runs})
    return [by[(a, k)] / by[(b, k)] for k in reps if (a, k) in by and (b, k) in by]


def paired_ratio(runs: list[dict], a: str, b: str, key: str = "mean_e2el_ms") -> float:
    """Median over repeats of (a's figure / b's figure) within the same repeat."""
    return med(paired_ratios(runs, a, b, key))


def captures(runs: list[dict], policy: str) -> list[float]:
    """Per repeat, (FCFS - policy) / (FCFS - plugin-oracle) on mean E2E (FCFS: stock vLLM)."""
    by = {(r["config"], r["repeat"]): r["summary"]["mean_e2el_ms"] for r in runs}
    out = []
    for k in sorted({r["repeat"] for r in runs}):
        if all((c, k) in by for c in ("direct-fcfs", policy, "plugin-oracle")):
            f, d, o = by[("direct-fcfs", k)], by[(policy, k)], by[("plugin-oracle", k)]
            if f != o:
                out.append((f - d) / (f - o))
    return out


def inengine_spreads(runs: list[dict], source: str) -> dict[str, list[float]]:
    """Each in-engine figure per repeat (its spread: a median inside it is not a gain)."""
    sfx = "_code" if source == "azure-code" else "_conv"
    return {
        # the definition: stock FCFS output tok/s over the plugin's (fcfs), - 1, in %
        "engine_plugin_overhead_pct": [100 * (x - 1) for x in
                                       paired_ratios(runs, "direct-fcfs", "plugin-fcfs", "output_throughput")],
        "engine_plugin_overhead_mean_e2e_pct": [100 * (x - 1) for x in paired_ratios(runs, "plugin-fcfs", "direct-fcfs")],
        f"engine_fcfs_over_default_mean_e2e{sfx}": paired_ratios(runs, "direct-fcfs", "plugin-default"),
        f"engine_gain_capture{sfx}": captures(runs, "plugin-default"),
        f"engine_default_p99_vs_fcfs{sfx}": paired_ratios(runs, "plugin-default", "direct-fcfs", "p99_e2el_ms"),
        f"engine_gateway_sjf_over_default_mean_e2e{sfx}": paired_ratios(runs, "gateway-sjf", "plugin-default"),
        f"engine_fcfs_over_mlfq_np_mean_e2e{sfx}": paired_ratios(runs, "direct-fcfs", "plugin-mlfq-np"),
        f"engine_gain_capture_mlfq_np{sfx}": captures(runs, "plugin-mlfq-np"),
        f"engine_plugin_fcfs_over_oracle_mean_e2e{sfx}": paired_ratios(runs, "plugin-fcfs", "plugin-oracle"),
    }


def inengine_figures(runs: list[dict], summary: dict, source: str) -> dict[str, float | None]:
    """The in-engine scheduler's figures (module doc): medians over repeats; none without its
    configurations."""
    errs = [summary[c]["sim_mean_e2e_abs_error_pct"] for c in PLUGINS if c in summary]
    figs = {k: med(v) for k, v in inengine_spreads(runs, source).items()}
    figs["engine_inengine_sim_error_pct"] = med(errs)
    return figs


def figures_of(runs: list[dict], summary: dict, sims: list[dict], source: str = "azure-conv") -> dict[str, float]:
    """The headline figures (module doc), then extras; a configuration not run gives none."""

    def err(name: str) -> float | None:
        return summary[name]["sim_mean_e2e_abs_error_pct"] if name in summary else None

    f = {
        "engine_fcfs_over_sjf_mean_e2e": paired_ratio(runs, "direct-fcfs", "gateway-sjf"),
        "sim_vs_engine_mean_e2e_error_pct": err("direct-fcfs"),
        "engine_fcfs_over_passthrough_mean_e2e": paired_ratio(runs, "direct-fcfs", "passthrough"),
        "engine_fcfs_over_oracle_mean_e2e": paired_ratio(runs, "direct-fcfs", "gateway-oracle"),
        "engine_fcfs_over_sjf_short_p99_e2e": paired_ratio(runs, "direct-fcfs", "gateway-sjf", "short_p99_e2el_ms"),
        "gateway_fcfs_over_direct_mean_e2e": paired_ratio(runs, "gateway-fcfs", "direct-fcfs"),
        "gateway_fcfs_over_sjf_mean_e2e": paired_ratio(runs, "gateway-fcfs", "gateway-sjf"),
        "sim_fcfs_over_sjf_mean_e2e": med([s["fcfs"]["mean_e2el_ms"] / s["sjf"]["mean_e2el_ms"] for s in sims]),
        "sim_vs_engine_mean_e2e_error_pct_sjf": err("gateway-sjf"),
        "sim_vs_engine_mean_e2e_error_pct_oracle": err("gateway-oracle"),
        "sim_vs_engine_mean_e2e_error_pct_gateway_fcfs": err("gateway-fcfs"),
        "sim_vs_engine_mean_e2e_error_pct_passthrough": err("passthrough"),
        "engine_fcfs_over_aging_mean_e2e": paired_ratio(runs, "direct-fcfs", "gateway-aging"),
        "engine_fcfs_over_aging_short_p99_e2e": paired_ratio(runs, "direct-fcfs", "gateway-aging", "short_p99_e2el_ms"),
        "sim_vs_engine_mean_e2e_error_pct_aging": err("gateway-aging"),
        "sim_vs_engine_mean_e2e_error_pct_a_priori": summary["direct-fcfs"]["sim_a_priori_mean_e2e_abs_error_pct"],
        "sim_vs_engine_mean_e2e_error_pct_a_priori_sjf": summary["gateway-sjf"]["sim_a_priori_mean_e2e_abs_error_pct"],
        "sim_mean_e2e_pct_per_5pct_slower": med(summary["direct-fcfs"]["sim_e2e_pct_per_5pct_slower_each"]),
        "engine_speed_vs_calibration_range": (max(r["speed_factor"] for r in runs)
                                              / min(r["speed_factor"] for r in runs)),
        **inengine_figures(runs, summary, source),
    }  # fmt: skip
    return {k: float(v) for k, v in f.items() if v is not None and np.isfinite(v)}


# --- the JSON --------------------------------------------------------------------------------
PER_REQUEST = ("e2e_s", "ttft_s", "sent_s", "send_lag_ms", "queue_wait_s")


def compact(run: dict, ids: list[str]) -> None:
    """Per-request maps of a run -> lists in `ids` order (None where a request failed), and the
    prompt counts dropped (they are the same in every run: meta.prompt_tokens_engine)."""
    for k in PER_REQUEST:
        m = run.pop(k)
        run[k] = [m.get(i) for i in ids]
    run.pop("prompt_tokens", None)
