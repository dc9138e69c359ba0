"""What of vLLM 0.32 the in-engine scheduler runs under.

`check_supported(sched)` refuses at start, with a `PluginConfigError` naming the vLLM option:

- LoRA and KV connectors: their skip paths in vLLM's admission loop would be mistaken for
  admissions;
- a batch queue (`vllm_config.max_concurrent_batches > 1`): async scheduling (`--async-scheduling`,
  on by default on GPU; vLLM forces it off on CPU) or pipeline parallelism. vLLM then calls
  `schedule()` again before the previous step's output is back, with two steps in flight. The
  plugin subclasses vLLM's synchronous `Scheduler`, not `AsyncScheduler`, and its bookkeeping
  (tokens per request, the preempt-to-admit check, the records' times) was written and tested
  for one step at a time; vLLM 0.32 does not turn async scheduling off for a custom scheduler
  class, it only warns. `--no-async-scheduling` (and `--pipeline-parallel-size 1`) is the fix.
"""

from __future__ import annotations

from presched.engine.plugin.config import PluginConfigError


def check_supported(sched) -> None:
    """Refuse what the plugin does not run under (module doc); `sched`: the vLLM Scheduler."""
    if sched.lora_config is not None or sched.connector is not None:
        raise PluginConfigError(
            "presched's in-engine scheduler does not support LoRA or KV connectors "
            "(--enable-lora / --kv-transfer-config); start vLLM without them"
        )
    vc = sched.vllm_config
    if vc.scheduler_config.async_scheduling or vc.max_concurrent_batches > 1:
        pp = vc.parallel_config.pipeline_parallel_size
        raise PluginConfigError(
            "presched's in-engine scheduler runs one step at a time: start vLLM with "
            "--no-async-scheduling (async scheduling is on by default on GPU; vLLM does not turn "
            f"it off for a custom --scheduler-cls) and without pipeline parallelism (got "
            f"async_scheduling={vc.scheduler_config.async_scheduling}, "
            f"pipeline_parallel_size={pp})"
        )
