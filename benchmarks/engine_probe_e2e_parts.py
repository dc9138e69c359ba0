"""benchmarks/engine_probe_e2e.py's pieces: the configurations, the workload, the figures, the
table and the plot (importable without an engine, for tests)."""

from __future__ import annotations

import dataclasses
import sqlite3
import statistics
from pathlib import Path
from typing import Any

import numpy as np

from presched.bench.config import RECOMMENDED, RECOMMENDED_PARAMS
from presched.predict.metrics import kendall_tau_b
from presched.workload.loaders.castillo import castillo_prompts
from presched.workload.request import Request

CONFIGS = ["fcfs", "textgbm", "probe"]
REFINE_AT = [16, 64, 256]
MAX_PROMPT_CHARS = 4 * 1500  # ~1,500 tokens: prompt + answer cap inside max_model_len 2048


def plugin_config(name: str, folder: Path, preds: dict[str, Path]) -> dict[str, Any]:
    """The plugin config of one configuration ('train': the training traffic's engine, fcfs);
    every engine pools the same features and keeps records (its own file, NAME.sqlite), so the
    configurations differ only in policy and predictors."""
    cfg: dict[str, Any] = {
        "policy": "fcfs", "records": str(folder / f"{name}.sqlite"), "store_prompts": True,
        "stats": str(folder / f"{name}-stats.json"),
        "features": {"sink_tokens": 1, "record_steps": REFINE_AT},
    }  # fmt: skip
    if name in ("fcfs", "train"):
        return cfg
    cfg |= {"policy": RECOMMENDED, "params": dict(RECOMMENDED_PARAMS), "predictor": str(preds["text-gbm"])}
    if name == "probe":
        cfg |= {"probe": str(preds["probe"]), "refine": str(preds["probe-refine"]), "refine_at": REFINE_AT}
    return cfg


def load_prompts(path: Path, split: str) -> list[dict]:
    """CASTILLO prompts of one split in `castillo_prompts`' hash order (as
    scripts/smollm2_lengths.py: a fair slice across the seven prompt sets); very long ones left out."""
    return [p for p in castillo_prompts(path, [split]) if len(p["prompt_text"]) <= MAX_PROMPT_CHARS]


def training_records(src: Path, dst: Path, prompts_path: Path, splits=("train", "validate")) -> dict[str, int]:
    """`--train-records`: a copy of the records file `src` at `dst` holding only its answers to
    CASTILLO prompts of `splits` (matched by the user message, as benchmarks/probes_records.py
    matches them), each feature table keeping the rows of those answers, so that nothing learned
    comes from a measured (test) prompt. Returns {'kept': answers, 'dropped': answers}."""
    import sys
    from contextlib import closing

    from presched.serve.log_format import TABLE

    if str(Path(__file__).parent) not in sys.path:
        sys.path.append(str(Path(__file__).parent))
    from probes_records import user_text

    keep = {p["prompt_text"].strip() for p in castillo_prompts(prompts_path, list(splits))}
    with closing(sqlite3.connect(src)) as s, closing(sqlite3.connect(dst)) as d:
        s.backup(d)
    with closing(sqlite3.connect(dst)) as c:
        rows = c.execute(f"SELECT id, prompt FROM {TABLE}").fetchall()
        drop = [(rid,) for rid, prompt in rows if user_text(prompt) not in keep]
        c.executemany(f"DELETE FROM {TABLE} WHERE id = ?", drop)
        for (t,) in c.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
            if t != TABLE and "id" in {r[1] for r in c.execute(f"PRAGMA table_info({t})")}:
                c.execute(f"DELETE FROM {t} WHERE id NOT IN (SELECT id FROM {TABLE})")
        c.commit()
    return {"kept": len(rows) - len(drop), "dropped": len(drop)}


def requests_of(prompts: list[dict], cap: int) -> list[Request]:
    return [Request(id=p["prompt_id"], prompt_tokens=max(1, len(p["prompt_text"]) // 4), prompt=p["prompt_text"],
                    max_tokens=cap, arrival=0.0) for p in prompts]  # fmt: skip


def at_once(reqs: list[Request]) -> list[Request]:
    return [dataclasses.replace(r, arrival=0.0) for r in reqs]


def poisson(reqs: list[Request], rate: float, seed: int) -> list[Request]:
    """The requests with Poisson arrivals at `rate` per second (first at 0)."""
    gaps = np.random.default_rng(seed).exponential(1.0 / rate, len(reqs))
    t = np.concatenate([[0.0], np.cumsum(gaps[1:])])
    return [dataclasses.replace(r, arrival=float(x)) for r, x in zip(reqs, t)]


def record_taus(folder: Path, configs: list[str] = CONFIGS) -> dict[str, dict[str, Any]]:
    """Per configuration, from its engine's records: tau-b of the final estimate (pred_mean)
    against the answer's length, and how many estimates came from each source."""
    out = {}
    for name in configs:
        path = folder / f"{name}.sqlite"
        if not path.exists():
            continue
        with sqlite3.connect(path) as c:
            rows = c.execute("SELECT pred_mean, output_tokens, pred_source FROM requests WHERE status = 200").fetchall()
        est = [(p, n) for p, n, _ in rows if p is not None and n]
        sources: dict[str, int] = {}
        for _, _, src in rows:
            sources[str(src)] = sources.get(str(src), 0) + 1
        tau = _tau(*zip(*est)) if len(est) > 2 else None
        out[name] = {"requests": len(rows), "tau_b": tau, "sources": sources}
    return out


def ranking(records: Path, preds: dict[str, Path], at: list[int] = REFINE_AT) -> dict[str, Any]:
    """Offline, on the measured requests' own records (the probe engine's: each prompt once; the
    answers are the same in every configuration): tau-b of text-gbm (prompt text), probe (pooled
    prompt state) and, at each recorded g, of all three and probe-refine (the state at g) on the
    answers still running at g (L > g), against their lengths. Answers cut at the cap count at
    the cap (ties)."""
    from presched.predict.base import load_predictor
    from presched.serve.log_read import load_log_requests

    uniq: dict[str, Request] = {}
    for r in load_log_requests(records, keep_censored=True).requests:
        uniq.setdefault(r.prompt or r.id, r)
    reqs = list(uniq.values())
    L = np.array([r.output_tokens for r in reqs], dtype=float)
    tg, pr = load_predictor(preds["text-gbm"]), load_predictor(preds["probe"])
    rf = load_predictor(preds["probe-refine"])
    score = {"text-gbm": tg.predict(reqs).rank_score, "probe": pr.predict(reqs).rank_score}
    out: dict[str, Any] = {"prompts": len(reqs), "capped_fraction": float(np.mean([r.metadata["censored"] for r in reqs])),
                           "all": {k: _tau(v, L) for k, v in score.items()}}  # fmt: skip
    step_key, prompt_key = (s.key() for s in rf.specs(hidden=1))
    for g in at:
        idx = [i for i, r in enumerate(reqs) if L[i] > g and g in (r.metadata.get(step_key) or {})]
        row: dict[str, Any] = {"running": len(idx)}
        if len(idx) > 2:
            S = np.stack([reqs[i].metadata[step_key][g] for i in idx])
            P = np.stack([reqs[i].metadata[prompt_key] for i in idx])
            rem = L[idx] - g
            row |= {k: _tau(v[idx], rem) for k, v in score.items()}
            row["probe-refine"] = _tau(rf.predict_steps(S, P, np.full(len(idx), float(g))).rank_score, rem)
        out[f"g{g}"] = row
    return out


def _tau(x, y) -> float | None:
    t = kendall_tau_b(x, y)
    return t if np.isfinite(t) else None


def complete_repeats(runs: list[dict]) -> set[int]:
    """Repeats in which every configuration's run completed every request (a failed request would
    make that run's mean E2E one over other requests)."""
    reps = {r["repeat"] for r in runs}
    return {k for k in reps if all(not r["summary"].get("failed") and r["summary"].get("mean_e2el_ms")
                                   for r in runs if r["repeat"] == k)}  # fmt: skip


def paired(runs: list[dict], a: str, b: str, ids: set[str] | None = None) -> list[float]:
    """a's mean E2E / b's, per complete repeat where both ran; with `ids`, the means over those
    requests only."""
    def mean(r):
        if ids is None:
            return r["summary"]["mean_e2el_ms"]
        xs = [v for rid, v in r["e2e_s"].items() if rid in ids]
        return statistics.fmean(xs) if xs else None

    ok = complete_repeats(runs)
    by = {(r["config"], r["repeat"]): mean(r) for r in runs if r["repeat"] in ok}
    return [by[a, k] / by[b, k] for k in sorted(ok) if by.get((a, k)) and by.get((b, k))]


def same_length_ids(runs: list[dict]) -> tuple[set[str], int]:
    """(ids whose answer had the same length in every run, ids seen)."""
    seen: dict[str, set] = {}
    for r in runs:
        for rid, n in r["lengths"].items():
            seen.setdefault(rid, set()).add(n)
    return {rid for rid, v in seen.items() if len(v) == 1}, len(seen)


def figures_of(runs: list[dict], taus: dict[str, dict], ranked: dict | None = None) -> dict[str, float]:
    figs: dict[str, float] = {}
    same, seen = same_length_ids(runs)
    for name, (a, b) in {"engine_probe_over_textgbm_mean_e2e": ("probe", "textgbm"),
                         "engine_fcfs_over_textgbm_mean_e2e": ("fcfs", "textgbm"),
                         "engine_fcfs_over_probe_mean_e2e": ("fcfs", "probe")}.items():  # fmt: skip
        xs = paired(runs, a, b)
        if xs:  # the median of the paired per-repeat ratios, and their range
            figs[name], figs[name + "_min"], figs[name + "_max"] = statistics.median(xs), min(xs), max(xs)
        if seen and len(same) < seen and (xs := paired(runs, a, b, same)):  # the same answers only
            figs[name + "_same_answers"] = statistics.median(xs)
    for name in ("textgbm", "probe"):  # (probe's final estimate is mostly refine's, given L > g)
        tau = taus.get(name, {}).get("tau_b")
        if tau is not None and np.isfinite(tau):  # (NaN: every estimate or length the same)
            figs[f"engine_final_estimate_tau_{name}"] = tau
    figs["answers_same_length_fraction"] = len(same) / seen if seen else float("nan")
    figs["repeats_complete"] = float(len(complete_repeats(runs)))
    for where, row in (ranked or {}).items():  # the offline ranking on the records (`ranking`)
        if isinstance(row, dict):
            for pred, tau in row.items():
                if pred != "running" and tau is not None:
                    figs[f"records_tau_{pred.replace('-', '_')}_{where}"] = tau
    return figs


def table(runs: list[dict], console) -> None:
    from rich.table import Table

    t = Table(title="SmolLM2 in the engine: median over repeats (per-repeat range)")
    for col in ("config", "mean E2E s", "median E2E s", "P99 E2E s", "mean TTFT s", "output tok/s", "output tokens"):
        t.add_column(col, justify="left" if col == "config" else "right")
    for name in CONFIGS:
        rs = [r["summary"] for r in runs if r["config"] == name]
        if not rs:
            continue

        def cell(key: str, scale: float = 1e-3) -> str:
            xs = [s[key] * scale for s in rs if s.get(key) is not None]
            return f"{statistics.median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})" if xs else "-"

        toks = sorted(sum(r["lengths"].values()) for r in runs if r["config"] == name)
        t.add_row(name, cell("mean_e2el_ms"), cell("median_e2el_ms"), cell("p99_e2el_ms"),
                  cell("mean_ttft_ms"), cell("output_throughput", 1.0), f"{toks[0]}-{toks[-1]}")  # fmt: skip
    console.print(t)


def plot(runs: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(10, 4))
    reps = sorted({r["repeat"] for r in runs})
    for name in CONFIGS:
        ys = {r["repeat"]: r["summary"]["mean_e2el_ms"] / 1e3 for r in runs if r["config"] == name}
        ax[0].plot([k + 1 for k in reps if k in ys], [ys[k] for k in reps if k in ys], "o-", label=name)
    ax[0].set(xlabel="repeat", ylabel="mean E2E (s)", title="mean E2E per repeat")
    ax[0].legend()
    for i, (a, b) in enumerate((("probe", "textgbm"), ("fcfs", "textgbm"), ("fcfs", "probe"))):
        xs = paired(runs, a, b)
        ax[1].scatter([i] * len(xs), xs, alpha=0.7)
        if xs:
            ax[1].hlines(statistics.median(xs), i - 0.25, i + 0.25, color="k")
    ax[1].axhline(1.0, color="grey", lw=0.8, ls="--")
    ax[1].set_xticks(range(3), ["probe / textgbm", "fcfs / textgbm", "fcfs / probe"])
    ax[1].set(ylabel="mean E2E ratio (per repeat; bar: median)", title="paired ratios")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
