"""`self-report` (PiA) on SmolLM2-135M's natural lengths (issue 15): the served model asked how
long its answer will be, calibrated on train/validate prompts, scored on the test prompts,
beside text-gbm fitted on the same lengths.

    PYTHONPATH=src python benchmarks/self_report.py                 # ~5-10 min on 2 busy cores
    PYTHONPATH=src python benchmarks/self_report.py --train 100 --validate 60

Starts SmolLM2-135M-Instruct on the vLLM CPU engine (`presched.engine.launch`, 32 sequences at
once), reads the dataset of `scripts/smollm2_lengths.py` (`--lengths`, the prompts' text from
CASTILLO) and asks each prompt once (greedy, 8 tokens, `self_report.QUESTION` after the prompt).
Metrics as benchmarks/probes.py (tau-b against the mean of each prompt's 4 sampled lengths, MAE,
coverage). Also printed: how often the reply held a number at all, and tau-b of the raw numbers.
Writes benchmarks/results/self_report.json; figures `self_report_tau`, `self_report_parsed_fraction`,
`self_report_raw_tau`, `textgbm_tau_same_sr` (text-gbm on the same test prompts).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.append(str(Path(__file__).parent))  # probes.py beside it: the same dataset reader
from probes import MODEL, RESULTS, load_dataset  # noqa: E402

from presched.predict.base import predictor_class  # noqa: E402
from presched.predict.evaluate import ensure_registered  # noqa: E402
from presched.predict.metrics import kendall_tau_b, score_all, ssjf_edges  # noqa: E402
from presched.predict.self_report import SelfReport  # noqa: E402
from presched.workload.paths import data_dir  # noqa: E402
from presched.workload.request import Request  # noqa: E402


def split_requests(rows: list[dict], split: str, limit: int | None) -> list[Request]:
    out = [Request(id=r["prompt_id"], prompt_tokens=r["prompt_tokens"], output_tokens=r["lengths"][0],
                   output_samples=tuple(r["lengths"]), model=MODEL, prompt=r["prompt"])
           for r in rows if r["split"] == split]  # fmt: skip
    return out[:limit] if limit else out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lengths", type=Path, default=RESULTS / "smollm2_lengths.jsonl")
    ap.add_argument("--castillo", type=Path, default=None, help="CASTILLO folder (default: the data dir's)")
    ap.add_argument("--train", type=int, default=200, help="train prompts asked (calibration fit)")
    ap.add_argument("--validate", type=int, default=150, help="validate prompts asked (conformal)")
    ap.add_argument("--test", type=int, default=0, help="test prompts (0: all)")
    ap.add_argument("--base-url", default=None, help="ask this OpenAI-compatible server instead of starting SmolLM2")
    ap.add_argument("--out", type=Path, default=RESULTS / "self_report.json")
    a = ap.parse_args(argv)
    for name in ("train", "validate", "test"):
        if not 0 <= getattr(a, name) <= 100_000:
            ap.error(f"--{name} must be in 0..100000")
    config, rows = load_dataset(a.lengths, a.castillo or data_dir() / "castillo")
    train, val = split_requests(rows, "train", a.train), split_requests(rows, "validate", a.validate)
    test = split_requests(rows, "test", a.test or None)
    print(f"{len(rows)} prompts in the dataset; asking {len(train)} train, {len(val)} validate, {len(test)} test")
    eng = None
    if a.base_url is None:
        from presched.engine import launch, models

        eng = launch.start_engine(models.resolve_model("smollm2"), served_name=MODEL, max_num_seqs=32,
                                  max_model_len=2048, kv_space_gib=2)  # fmt: skip
    try:
        pred = SelfReport(base_url=a.base_url or eng.url, model=MODEL, concurrency=16)
        t0 = time.perf_counter()
        pred.fit(train, validation=val)
        est = pred.predict(test)
        ask_s = (time.perf_counter() - t0) / max(1, pred.asked + pred.errors)
    finally:
        if eng is not None:
            eng.stop()
    ensure_registered(["text-gbm"])
    gbm = predictor_class("text-gbm")().fit(split_requests(rows, "train", None),
                                            validation=split_requests(rows, "validate", None))  # fmt: skip
    edges = ssjf_edges([np.mean(r.output_samples) for r in train])
    res = {"self-report": score_all(est, test, edges), "text-gbm": score_all(gbm.predict(test), test, edges)}
    reports = pred.reports(test)
    told = [i for i, r in enumerate(reports) if r is not None]
    mean_len = np.array([np.mean(r.output_samples) for r in test])
    raw_tau = kendall_tau_b(np.array([reports[i] for i in told], float), mean_len[told]) if len(told) > 2 else float("nan")
    parsed = 1 - pred.unparsed / max(1, pred.asked)
    out = {"config": config, "n_train": len(train), "n_validate": len(val), "n_test": len(test),
           "asked": pred.asked, "unparsed": pred.unparsed, "errors": pred.errors, "parsed_fraction": parsed,
           "raw_tau_parsed_test": raw_tau, "seconds_per_ask_wall": ask_s, "question": pred.params["question"],
           "results": res, "test_reports": reports}  # fmt: skip
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=1))
    for n, s in res.items():
        print(f"{n:12s} tau-b {s['kendall_tau_b']:.3f}  MAE {s['mae']:.1f}  max coverage err {s['max_coverage_error_pts']:.1f} pts")
    print(f"replies with a number: {parsed:.3f} ({pred.asked} asked, {pred.errors} failed calls); "
          f"raw numbers vs mean length on the test prompts that gave one: tau-b {raw_tau:.3f}")
    print(f"figure: self_report_tau = {res['self-report']['kendall_tau_b']:.4f}")
    print(f"figure: self_report_parsed_fraction = {parsed:.4f}")
    print(f"figure: self_report_raw_tau = {raw_tau:.4f}")
    print(f"figure: textgbm_tau_same_sr = {res['text-gbm']['kendall_tau_b']:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
