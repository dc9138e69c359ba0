"""benchmarks/engine_e2e.py's configurations: what each runs (a gateway's flags, a plugin config) and
what the simulator runs for it; the engine's fixed knobs and the figures kept per run."""

from __future__ import annotations

from typing import Any

from presched.bench.config import RECOMMENDED, RECOMMENDED_PARAMS


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
