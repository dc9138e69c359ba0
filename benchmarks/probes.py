"""Hidden-state probes vs text-gbm on SmolLM2-135M's natural lengths (issue 15), test prompts only.

Reads the dataset `scripts/smollm2_lengths.py` writes (one line per CASTILLO prompt with its
split and 4 sampled answer lengths; whatever part of it exists: the script is resumable and the
prompt count is printed), the prompts' text from CASTILLO, and computes each prompt's layer-15
features with the transformers reference (`PromptFeaturizer`: sink-free mean and EGTP's
entropy-weighted pool; cached in `--feature-cache` by prompt_id, so a rerun on a grown dataset
computes only the new prompts). Then, side by side on the same split (train: fit, validate:
conformal calibration, test: scored): `text-gbm` fitted on the SmolLM2 lengths, `probe` (step 0)
and `egtp`. Metrics as `presched eval` (tau-b on the mean of each prompt's samples, MAE, coverage
q10..q90 against that mean, max coverage error). Answers stopped by the 512-token cap count as
512 (a lower bound; the capped fraction is printed). Latency: one request per call on the test
prompts, the probes' head only (their features come from the engine's forward pass).

    PYTHONPATH=src python benchmarks/probes.py            # needs torch + transformers (.[all])

Then `probe-refine` (probes_refine.py): answers still running after 16 / 64 / 256 tokens, their
remaining length from the state at that token, against the step-0 probe's and text-gbm's own
E[L - g | L > g] on the same answers; it needs the answers' token ids (`--answers`, written by
`scripts/smollm2_lengths.py --ids-out`) and is skipped without them.

`draft-probe` (OUTLETS) reads a draft model's pooled prompt state. The only model offline with
SmolLM2's tokenizer is SmolLM2 itself, so the draft here is SmolLM2 drafting for itself (what
the engine's `draft_model` speculative decoding runs in tests/engine/test_draft_hook.py, where
the draft's pooled states equal the served model's): at `--draft-layer` (default: `--layer`,
where its vectors are the probe's, so its row measures only that the pipeline carries them; a
shallower layer is what a cheaper draft would offer). `self-report` has its own script
(benchmarks/self_report.py); the real-engine run is not here; see docs/predictors/probe.md.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

from presched.predict.base import predictor_class
from presched.predict.estimate import LEVELS
from presched.predict.evaluate import ensure_registered
from presched.predict.metrics import coverage_noise_floor_pts, score_all, ssjf_edges
from presched.predict.probe import EGTP, DraftProbe, FeatureSpec, Probe
from presched.workload.paths import data_dir
from presched.workload.request import Request

sys.path.append(str(Path(__file__).parent))  # its part: probes_refine.py beside it
import probes_refine  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
MODEL = "smollm2-135m"


def load_dataset(lengths: Path, castillo: Path) -> tuple[dict, list[dict]]:
    lines = lengths.read_text().splitlines()
    config = json.loads(lines[0])["config"]
    rows = [json.loads(x) for x in lines[1:] if x.strip()]
    text = {}
    with gzip.open(castillo / "prompts.jsonl.gz", "rt") as f:
        for line in f:
            r = json.loads(line)
            text.setdefault(r["prompt_id"], r["prompt_text"])
    for r in rows:
        r["prompt"] = text[r["prompt_id"]]
    return config, rows


def features(rows: list[dict], cache: Path, layer: int) -> dict[str, dict[str, np.ndarray]]:
    """prompt_id -> {"mean", "egtp"}: cached vectors, the missing ones computed (rich progress)."""
    have: dict[str, dict[str, np.ndarray]] = {}
    if cache.exists():
        z = np.load(cache, allow_pickle=False)
        if int(z["layer"]) == layer:
            have = {pid: {"mean": m, "egtp": e} for pid, m, e in zip(z["ids"], z["mean"], z["egtp"])}
    todo = [r for r in rows if r["prompt_id"] not in have]
    if todo:
        from rich.progress import Progress

        from presched.engine import models
        from presched.predict.probe.features import PromptFeaturizer

        fz = PromptFeaturizer(models.resolve_model("smollm2"), layer=layer, threads=os.cpu_count() or 1,
                              batch=8, model_name=MODEL)  # fmt: skip
        with Progress() as bar:
            task = bar.add_task("prompt features", total=len(todo))
            for i in range(0, len(todo), 32):
                chunk = todo[i : i + 32]
                out = fz.encode([r["prompt"] for r in chunk])
                for j, r in enumerate(chunk):
                    have[r["prompt_id"]] = {"mean": out["mean"][j], "egtp": out["egtp"][j]}
                bar.advance(task, len(chunk))
        ids = sorted(have)
        cache.parent.mkdir(parents=True, exist_ok=True)
        np.savez(cache, layer=layer, ids=np.array(ids), mean=np.stack([have[i]["mean"] for i in ids]),
                 egtp=np.stack([have[i]["egtp"] for i in ids]))  # fmt: skip
    return have


def requests(rows: list[dict], feats: dict, split: str, layer: int, draft: tuple[dict, int]) -> list[Request]:
    """Requests of `split` carrying their vectors: the served model's mean and egtp pools at
    `layer`, and the draft model's mean pool (`draft` = (its features, its layer))."""
    dfeats, dlayer = draft
    hidden = len(next(iter(feats.values()))["mean"])

    def key(layer: int, pooling: str, role: str = "served") -> str:
        return FeatureSpec(model=MODEL, layer=layer, hidden=hidden, pooling=pooling, sink=1, role=role).key()

    keys = {p: key(layer, p) for p in ("mean", "egtp")}
    dkey = key(dlayer, "mean", "draft")
    out = []
    for r in rows:
        if r["split"] != split:
            continue
        f = feats[r["prompt_id"]]
        meta = {keys[p]: f[p] for p in keys} | {dkey: dfeats[r["prompt_id"]]["mean"]}
        out.append(Request(id=r["prompt_id"], prompt_tokens=r["prompt_tokens"], output_tokens=r["lengths"][0],
                           output_samples=tuple(r["lengths"]), model=MODEL, prompt=r["prompt"],
                           metadata=meta))  # fmt: skip
    return out


def single_call_ms(pred, test: list[Request], calls: int = 200) -> float:
    ms = []
    for r in test[:calls]:
        t0 = time.perf_counter()
        pred.predict([r])
        ms.append((time.perf_counter() - t0) * 1000)
    return float(np.median(ms))


def plot(results: dict, path: Path) -> None:
    from presched.plotting import pyplot, save

    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 3.8))
    names = list(results)
    a.bar(names, [results[n]["kendall_tau_b"] for n in names], color="tab:blue")
    a.set_ylabel("Kendall tau-b (test prompts)")
    a.set_title("ranking SmolLM2's lengths")
    levels = np.asarray(LEVELS)
    for n in names:
        b.plot(levels, results[n]["coverage"], marker="o", label=n)
    b.plot(levels, levels, "k--", lw=1, label="ideal")
    b.set_xlabel("nominal quantile")
    b.set_ylabel("observed coverage")
    b.legend()
    save(fig, path)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", type=Path, default=RESULTS / "smollm2_lengths.jsonl")
    ap.add_argument("--castillo", type=Path, default=None, help="CASTILLO folder (default: the data dir's)")
    ap.add_argument("--layer", type=int, default=15)
    ap.add_argument("--draft-layer", type=int, default=None,
                    help="layer of the (self-)draft model draft-probe reads (default: --layer)")
    ap.add_argument("--feature-cache", type=Path, default=None,
                    help="npz of computed features (default: the engine cache folder's probe_features.npz)")
    ap.add_argument("--answers", type=Path, default=None,
                    help="answers' token ids for probe-refine (default: the engine cache folder's smollm2_answers.jsonl)")
    ap.add_argument("--step-cache", type=Path, default=None,
                    help="npz of computed answer states (default: the engine cache folder's probe_step_features.npz)")
    ap.add_argument("--out", type=Path, default=RESULTS / "probes.json")
    a = ap.parse_args(argv)

    from presched.engine.models import cache_dir

    config, rows = load_dataset(a.lengths, a.castillo or data_dir() / "castillo")
    fcache = a.feature_cache or cache_dir() / "probe_features.npz"
    feats = features(rows, fcache, a.layer)
    dlayer = a.layer if a.draft_layer is None else a.draft_layer
    # self-draft: the draft's pooled states are the served model's at the draft layer
    dfeats = feats if dlayer == a.layer else features(rows, fcache.with_name(f"{fcache.stem}-L{dlayer}.npz"), dlayer)
    train, val, test = (requests(rows, feats, s, a.layer, (dfeats, dlayer)) for s in ("train", "validate", "test"))
    capped = sum(sum(r["capped"]) for r in rows) / max(1, sum(len(r["capped"]) for r in rows))
    print(f"{len(rows)} prompts ({len(train)} train, {len(val)} validate, {len(test)} test), "
          f"capped fraction {capped:.3f} at {config['max_tokens']}")  # fmt: skip
    ensure_registered(["text-gbm"])
    preds = {"text-gbm": predictor_class("text-gbm")(), "probe": Probe(layer=a.layer), "egtp": EGTP(layer=a.layer),
             "draft-probe": DraftProbe(model=MODEL, layer=dlayer)}  # fmt: skip
    edges = ssjf_edges([np.mean(r.output_samples) for r in train])
    results = {}
    for name, p in preds.items():
        p.fit(train, validation=val or None)
        s = score_all(p.predict(test), test, edges)
        s["latency_single_p50_ms"] = single_call_ms(p, test)
        results[name] = s
        print(f"{name:9s} tau-b {s['kendall_tau_b']:.3f}  MAE {s['mae']:.1f}  "
              f"max coverage err {s['max_coverage_error_pts']:.1f} pts  {s['latency_single_p50_ms']:.2f} ms")  # fmt: skip
    refine = probes_refine.evaluate(rows, feats, {"probe": preds["probe"], "text-gbm": preds["text-gbm"]}, test,
                                    a.answers or cache_dir() / "smollm2_answers.jsonl",
                                    a.step_cache or cache_dir() / "probe_step_features.npz", a.layer, MODEL)  # fmt: skip
    out = {"config": config, "layer": a.layer, "draft": {"model": MODEL, "layer": dlayer, "self_draft": True}, "n_prompts": len(rows), "n_test": len(test), "n_train": len(train),
           "n_validate": len(val), "capped_fraction": capped, "results": results, "refine": refine,
           # what a perfectly calibrated predictor scores on this many test prompts (sampling noise)
           "coverage_noise_floor_pts": coverage_noise_floor_pts(len(test))}  # fmt: skip
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=1))
    plot(results, a.out.with_suffix(".png"))
    print(f"wrote {a.out} and {a.out.with_suffix('.png')}")
    print(f"figure: probe_step0_tau = {results['probe']['kendall_tau_b']:.4f}")
    print(f"figure: textgbm_tau_same = {results['text-gbm']['kendall_tau_b']:.4f}")
    print(f"figure: egtp_tau = {results['egtp']['kendall_tau_b']:.4f}")
    print(f"figure: draft_probe_tau = {results['draft-probe']['kendall_tau_b']:.4f}")
    print(f"figure: probe_coverage_err_pts = {results['probe']['max_coverage_error_pts']:.2f}")
    print(f"figure: coverage_noise_floor_pts = {out['coverage_noise_floor_pts']:.2f}")
    print(f"figure: probes_test_prompts = {len(test)}")
    for step, r in (refine or {}).get("steps", {}).items():
        print(f"figure: probe_refine{step}_tau = {r['refine_tau']:.4f}")
        print(f"figure: probe_prior{step}_tau = {r['probe_prior_tau']:.4f}")
        print(f"figure: probe_refine{step}_test_answers = {r['test_answers']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
