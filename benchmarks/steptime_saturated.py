"""The simulated ML.ENERGY benchmark run behind benchmarks/steptime_vs_mlenergy.py: requests
as ML.ENERGY sent them, one saturated engine, and its measurement with ML.ENERGY's definitions
(see that script's docstring). `compare(config)` simulates one measured configuration."""

from __future__ import annotations

import functools
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from presched.metrics import weighted_percentile
from presched.sim import EngineConfig, SimConfig
from presched.sim.itl import ItlLog
from presched.sim.result import SimResult
from presched.sim.seq import Seq
from presched.sim.setup import build_cluster
from presched.sim.steptime import MODEL_PRESETS, MeasuredConfig, StepTimeConfig
from presched.sim.steptime.deployment import NotRepresentableError, deployment_config
from presched.sim.steptime.presets import HF_MODEL_IDS
from presched.workload.request import Request


TASK = "lm-arena-chat"  # the legacy Llama-3.1 H100 tables' task
GPU = "H100"
MODELS = {  # the Llama-3.1 H100 tables (existing figures): ML.ENERGY model id -> short name
    "meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b",
    "meta-llama/Llama-3.1-70B-Instruct": "llama-3.1-70b",
}
SHORT = {"meta-llama/Llama-3.1-8B-Instruct": "8b", "meta-llama/Llama-3.1-70B-Instruct": "70b"}

# How ML.ENERGY ran each task and how many requests it sent per deployment (ml-energy/benchmark
# c1d6557; the table and its provenance: benchmarks/data/mlenergy_sweeps.json).
SWEEPS = json.loads((Path(__file__).parent / "data" / "mlenergy_sweeps.json").read_text())
MAX_NUM_BATCHED_TOKENS = 8192  # monolithic.config.yaml of every model
MAX_MODEL_LEN = 20480  # monolithic.config.yaml (lm-arena-chat, sourcegraph-fim; gpqa: more)


@dataclass(frozen=True)
class PromptAssumption:
    """Prompt lengths ~ lognormal(log(median), sigma), rounded, clipped to [min_tokens, cap]."""

    name: str
    median: float
    sigma: float = 1.0
    min_tokens: int = 8
    cap: int = MAX_MODEL_LEN - 4096

    @property
    def mean(self) -> float:
        return self.median * math.exp(self.sigma**2 / 2)


@dataclass(frozen=True)
class TaskSetup:
    """One ML.ENERGY LLM task: requests per repeat and max_tokens (benchmark.yaml), and the
    prompt-length assumption the simulator uses for it (ML.ENERGY publishes no prompt lengths)."""

    num_requests: int
    max_output_tokens: int
    prompts: PromptAssumption


PROMPTS = {
    "short": PromptAssumption("short", median=150.0),  # lm-arena-chat, central (mean ~250)
    "long": PromptAssumption("long", median=500.0),  # lm-arena-chat sensitivity (mean ~820)
    # GPQA diamond: one question and four choices ("What is the correct answer to the
    # following question: ...\n\nChoices:\n(A) ..."), a few hundred tokens; the thinking
    # outputs (thousands of tokens) dominate every step, so this barely matters.
    "gpqa": PromptAssumption("gpqa", median=250.0, sigma=0.5, cap=16384),
    # Sourcegraph context-aware FIM: a code file's prefix and suffix around the cursor; no
    # length statistics are published. Bounded by the measurements' own batches: at the largest
    # max_num_seqs the engines ran 1,015 (Qwen3-Coder-30B, 1 B200), 750 (2 H100) and 1,521
    # (480B, 8 B200) requests at once in KV caches of ~1.1M, 0.90M and 1.6M tokens, i.e. at
    # most ~1,050-1,200 tokens per running request, ~250 of them generated: mean prompts below
    # ~950 tokens. Median 500, sigma 1.0 (mean ~820), as the chat sensitivity case.
    "fim": PromptAssumption("fim", median=500.0, sigma=1.0, cap=MAX_MODEL_LEN - 2048),
}
CENTRAL = "short"
TASK_PROMPTS = {"lm-arena-chat": "short", "gpqa": "gpqa", "sourcegraph-fim": "fim"}
TASKS = {t: TaskSetup(v["num_requests"], v["max_output_tokens"], PROMPTS[TASK_PROMPTS[t]])
         for t, v in SWEEPS["tasks"].items()}  # fmt: skip


def task_setup(config: MeasuredConfig) -> TaskSetup:
    """The `TaskSetup` of `config`'s task; NotRepresentableError (naming `task`) for the others
    (ML.ENERGY's multimodal tasks: their prompts carry images or video)."""
    setup = TASKS.get(config.task)
    if setup is None:
        raise NotRepresentableError(
            f"{config.source}: {config.model_id} {config.gpu_model} x{config.num_gpus}: task: "
            f"{config.task!r} is not modelled (LLM tasks: {', '.join(TASKS)}; the multimodal "
            f"ones put images or video in the prompt)"
        )
    return setup


def ml_energy_num_requests(config: MeasuredConfig) -> int:
    """Requests ML.ENERGY sent for this configuration: the task's num_requests x the sweep's
    num_request_repeats for its max_num_seqs. A deployment or max_num_seqs no sweep file lists
    (a run from an earlier sweep) takes the repeats of the same model, task and GPU at another
    GPU count, else the task's sweep_defaults, else x2 from max_num_seqs 512 and x3 from 1536."""
    setup, n = task_setup(config), str(config.max_num_seqs)
    repeats = SWEEPS["num_request_repeats"]
    key = f"{config.task}|{config.model_id}|{config.gpu_model}"
    found = repeats.get(f"{key}|{config.num_gpus}", {}).get(n)
    if found is None:
        found = next((v[n] for k, v in repeats.items() if k.startswith(key + "|") and n in v),
                     SWEEPS["tasks"][config.task]["sweep_defaults"].get(n))  # fmt: skip
    if found is None:
        found = 3 if config.max_num_seqs >= 1536 else 2 if config.max_num_seqs >= 512 else 1
    return setup.num_requests * found


def step_time_config(config: MeasuredConfig, **overrides: Any) -> StepTimeConfig:
    """The roofline preset for this deployment (`overrides`: roofline knobs, e.g. calibrated);
    NotRepresentableError (naming the field) for what the model cannot describe."""
    task_setup(config)
    return deployment_config(config, **overrides)


def not_expressible(config: MeasuredConfig) -> str | None:
    """None if the simulator can re-run `config` (its task and its deployment), else why (the
    message names the field)."""
    try:
        step_time_config(config)
    except NotRepresentableError as e:
        return str(e)
    return None


def draw_output_lengths(config: MeasuredConfig, n: int, rng: np.random.Generator) -> np.ndarray:
    """Output lengths from the configuration's histogram: a bin by its count, uniform inside."""
    edges = np.asarray(config.output_length_bins, dtype=float)
    counts = np.asarray(config.output_length_counts, dtype=float)
    if counts.sum() <= 0:
        raise ValueError(f"{config.source}: empty output-length histogram")
    b = rng.choice(len(counts), size=n, p=counts / counts.sum())
    x = rng.uniform(edges[b], edges[b + 1])
    return np.clip(np.floor(x), 1, task_setup(config).max_output_tokens).astype(np.int64)


def draw_prompt_lengths(p: PromptAssumption, z: np.ndarray) -> np.ndarray:
    """Prompt lengths from standard normals `z` (shared across assumptions: common numbers)."""
    x = np.round(p.median * np.exp(p.sigma * z))
    return np.clip(x, p.min_tokens, p.cap).astype(np.int64)


def make_requests(
    config: MeasuredConfig, num_requests: int, prompts: PromptAssumption, seed: int = 0
) -> list[Request]:
    """The benchmark's requests: all arriving at t = 0; seeded by (seed, max_num_seqs)."""
    out_rng, prompt_rng = np.random.default_rng([seed, config.max_num_seqs]).spawn(2)
    out = draw_output_lengths(config, num_requests, out_rng)
    prompt = draw_prompt_lengths(prompts, prompt_rng.standard_normal(num_requests))
    return [
        Request(id=f"r{i}", prompt_tokens=int(p), output_tokens=int(o), arrival=0.0)
        for i, (p, o) in enumerate(zip(prompt, out))
    ]


@dataclass
class _Snapshot:
    time: float
    itl_entries: int
    tokens: int


def _slice_itl(log: ItlLog, start: int, stop: int | None = None) -> ItlLog:
    out = ItlLog()
    for name in ItlLog.__slots__:
        getattr(out, name).extend(getattr(log, name)[start:stop])
    return out


def run_saturated(
    requests: list[Request], sim_cfg: SimConfig, poll: float = 0.1
) -> dict[str, Any]:
    """Run `requests` (all arriving at t = 0) on one engine and measure ML.ENERGY's windows.

    The engine is advanced `poll` simulated seconds at a time; the steady state starts at the
    first poll after `max_num_seqs` requests have their first token and ends at the first poll
    after `len(requests) - max_num_seqs - 1` have finished. Snapshots are taken at the engine's
    clock (a step end), so token counts and times inside the window are exact; the window edges
    are late by less than `poll` plus one step. Returns the SimResult, the window and the
    figures (seconds, tokens/s).
    """
    if sim_cfg.num_instances != 1:
        raise ValueError("run_saturated simulates one engine (num_instances = 1)")
    if any(r.arrival != 0.0 for r in requests):
        raise ValueError("run_saturated expects every request to arrive at t = 0")
    n = len(requests)
    N = sim_cfg.engine.max_num_seqs
    need_start, need_end = min(N, n), n - N - 1
    if need_end < 1:
        raise ValueError(
            f"{n} requests for max_num_seqs {N}: need more than {N + 1} for a steady state"
        )
    wall = time.perf_counter()
    cluster = build_cluster(sim_cfg)
    inst = cluster.instances[0]
    seqs = [Seq(r, i) for i, r in enumerate(requests)]
    inst.advance(0.0)
    for s in seqs:
        inst.add(s, 0.0)

    def snap() -> _Snapshot:
        return _Snapshot(inst.clock, len(inst.itl.count), sum(s.generated for s in seqs))

    start = end = None
    running: list[int] = []  # running requests at each poll inside the window
    t = 0.0
    while inst.num_outstanding and end is None:
        t += poll
        inst.advance(t)
        if start is None:
            if sum(s.first_token is not None for s in seqs) >= need_start:
                start = snap()
        elif len(inst.finished) >= need_end:
            end = snap()
        else:
            running.append(inst.num_running)
    if start is None or end is None or end.time <= start.time:
        raise RuntimeError(f"no steady-state window found (start {start}, end {end})")
    inst.advance(math.inf)
    wall = time.perf_counter() - wall
    result = SimResult.from_instances(seqs, [inst], wall)

    gaps_all, w_all = result.itl.values()
    steady = _slice_itl(inst.itl, start.itl_entries, end.itl_entries)
    gaps_ss, w_ss = steady.values()
    after = _slice_itl(inst.itl, end.itl_entries)
    rec = result.records
    return {
        "result": result,
        "window": (start.time, end.time),
        "median_itl_all": weighted_percentile(gaps_all, w_all, 50),
        "median_itl_steady": weighted_percentile(gaps_ss, w_ss, 50),
        "throughput_steady": (end.tokens - start.tokens) / (end.time - start.time),
        "throughput_all": float(rec.output_tokens.sum() / rec.finish.max()),
        "avg_batch_steady": float(np.mean(running)) if running else float(inst.num_running),
        "tokens_steady": end.tokens - start.tokens,
        "gaps_all": int(w_all.sum()),
        "gaps_steady": int(w_ss.sum()),
        "gaps_after_window": after.num_gaps,
        "duration": float(rec.finish.max()),
        "preemptions": result.num_preemptions,
        "num_blocks": result.num_blocks[0],
    }


def architecture(config: MeasuredConfig) -> str:
    """The model's shape and number formats, named by the presets that share it ("llama-3.1-70b
    = llama-3.3-70b"): fine-tunes of one architecture (Instruct / Thinking / Coder, Llama 3.1 /
    3.3, DeepSeek V3.1 / R1) step alike, so leave-one-model-out holds them out together."""
    return _architecture(config.model_id)


@functools.cache
def _architecture(model_id: str) -> str:
    spec = MODEL_PRESETS[HF_MODEL_IDS[model_id]]
    shape = spec.model_dump(exclude={"name"})
    same = sorted(n for n, m in MODEL_PRESETS.items() if m.model_dump(exclude={"name"}) == shape)
    return " = ".join(same) or spec.name


def family(config: MeasuredConfig) -> str:
    """Scoring family: '<dense|moe>-<gpu>' (dense-h100, dense-b200, moe-h100, moe-b200, ...):
    the knobs (efficiencies, fixed costs) are properties of a GPU and its software, so each
    family is one GPU; hybrid Mamba models count as dense."""
    kind = "moe" if step_time_config(config).model_spec().is_moe else "dense"
    return f"{kind}-{config.gpu_model.lower()}"


def _err(sim: float, meas: float) -> float:
    return 100.0 * (sim - meas) / meas


def compare(
    config: MeasuredConfig,
    *,
    prompts: PromptAssumption | str | None = None,
    num_requests: int | None = None,
    step_overrides: dict[str, Any] | None = None,
    seed: int = 0,
    poll: float = 0.1,
) -> dict[str, Any]:
    """Simulate one measured ML.ENERGY configuration and compare (see module doc).

    `prompts` defaults to the task's assumption (`TASKS`); `num_requests` to what ML.ENERGY
    sent; `step_overrides` are roofline knobs passed to `StepTimeConfig` (None = the default
    preset). Returns a JSON-able dict: configuration, measured and simulated figures, signed %
    errors (`*_err_pct`) and the steady window.
    """
    if prompts is None:
        prompts = task_setup(config).prompts
    elif isinstance(prompts, str):
        prompts = PROMPTS[prompts]
    N = config.max_num_seqs
    n = num_requests if num_requests is not None else ml_energy_num_requests(config)
    st = step_time_config(config, **(step_overrides or {}))
    # with dp data-parallel ranks, simulate one rank: its share of max_num_seqs and requests
    dp = config.data_parallel
    sim_cfg = SimConfig(
        engine=EngineConfig(max_num_seqs=config.max_num_seqs_per_rank,
                            max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS),
        step_time=st,
    )  # fmt: skip
    reqs = make_requests(config, n // dp, prompts, seed)
    m = run_saturated(reqs, sim_cfg, poll=poll)
    if dp > 1:  # ranks are alike: deployment throughput and batch are dp times a rank's
        m["throughput_steady"] *= dp
        m["throughput_all"] *= dp
        m["avg_batch_steady"] *= dp
    rec = m["result"].records
    t0, t1 = m["window"]
    out = {
        "model_id": config.model_id,
        "model": SHORT.get(config.model_id, config.model_id),
        "architecture": architecture(config),
        "task": config.task,
        "gpu": config.gpu_model,
        "tp": config.vllm_tp,
        "ep": config.expert_parallel,
        "dp": dp,
        "num_gpus": config.num_gpus,
        "family": family(config),
        "max_num_seqs": N,
        "num_requests": n,
        "prompts": prompts.name,
        "prompt_median": prompts.median,
        "prompt_sigma": prompts.sigma,
        "mean_prompt_tokens": float(rec.prompt_tokens.mean()),
        "mean_output_tokens": float(rec.output_tokens.mean()),
        "step_time": {k: v for k, v in st.model_dump().items() if v is not None},
        "measured": {
            "median_itl_ms": config.median_itl * 1e3,
            "output_throughput": config.output_throughput,
            "avg_batch_size": config.avg_batch_size,
            "avg_output_len": config.avg_output_len,
        },
        "simulated": {
            "median_itl_ms": m["median_itl_all"] * 1e3,
            "median_itl_steady_ms": m["median_itl_steady"] * 1e3,
            "output_throughput": m["throughput_steady"],
            "output_throughput_whole_run": m["throughput_all"],
            "avg_batch_size": m["avg_batch_steady"],
            "preemptions": m["preemptions"],
            "kv_blocks": m["num_blocks"],
        },
        "window": {
            "start_s": t0,
            "end_s": t1,
            "duration_s": m["duration"],
            "tokens": m["tokens_steady"],
            "gaps_total": m["gaps_all"],
            "gaps_in_window": m["gaps_steady"],
            "gaps_after_window": m["gaps_after_window"],
            # the last admission (the waiting queue empties): the window must not pass it by much
            "last_admission_s": float(rec.first_scheduled.max()),
        },
        "wall_s": m["result"].wall_seconds,
    }
    meas, sim = out["measured"], out["simulated"]
    out["itl_err_pct"] = _err(sim["median_itl_ms"], meas["median_itl_ms"])
    out["itl_steady_err_pct"] = _err(sim["median_itl_steady_ms"], meas["median_itl_ms"])
    out["throughput_err_pct"] = _err(sim["output_throughput"], meas["output_throughput"])
    out["avg_batch_err_pct"] = _err(sim["avg_batch_size"], meas["avg_batch_size"])
    return out
