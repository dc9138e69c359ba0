"""What of vLLM 0.32 the in-engine scheduler runs under, and vLLM's admission rule it mirrors.

`check_supported(sched)` refuses at start, with a `PluginConfigError` naming the vLLM option:

- LoRA and KV connectors: their skip paths in vLLM's admission loop would be mistaken for
  admissions;
- an encoder-cache connector (`--ec-transfer-config`, vllm_config.ec_transfer_config): vLLM
  skips a multimodal head whose encoder outputs are still in transit (`_ec_transfer_pending`)
  by popping it from the policy's queue while it still reads WAITING, so the policy heard
  `on_schedule` for a request that did not start (kv-admission counted it again at its real
  start), and `admit` / `preempt_for` were asked about a head vLLM then skipped. Whether it
  skips depends on the connector's `ensure_cache_available`, which starts the transfers itself
  and is asked after vLLM's prefix-cache lookup inside its loop: the plugin cannot foresee it;
- a batch queue (`vllm_config.max_concurrent_batches > 1`): async scheduling (`--async-scheduling`,
  on by default on GPU; vLLM forces it off on CPU) or pipeline parallelism. vLLM then calls
  `schedule()` again before the previous step's output is back, with two steps in flight. The
  plugin subclasses vLLM's synchronous `Scheduler`, not `AsyncScheduler`, and its bookkeeping
  (tokens per request, the preempt-to-admit check, the records' times) was written and tested
  for one step at a time; vLLM 0.32 does not turn async scheduling off for a custom scheduler
  class, it only warns. `--no-async-scheduling` (and `--pipeline-parallel-size 1`) is the fix.

`admissible(vreq)`: whether vLLM 0.32's admission loop (`Scheduler.schedule`, the waiting loop,
with `_handle_blocked_waiting_request`) would try to start this waiting request now rather than
skip it (pop it and put it back after the loop). It skips a request whose structured-output
grammar is still compiling (or failed to compile: vLLM then ends it with FINISHED_ERROR), one
waiting for more streaming input or for remote KVs (KV connectors are refused, so never here)
or for its encoder outputs (encoder-cache connectors are refused too),
and one with stale output still in flight (async scheduling, refused too). A grammar that is
ready counts as admissible although the status still reads
WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR: vLLM promotes it to WAITING only when its loop reaches
it, which it never does while the batch is full. The policy is asked `preempt_for` and `admit`
only for an admissible head (scheduler.py): preempting for a head vLLM then skips would free a
running request's KV for nothing, and vLLM would admit the victim again; a refusing `admit`
would end admission although vLLM would have passed over that head to the next.

Streaming-input sessions (vLLM's resumable requests, e.g. its realtime API): the first turn
queues, is ordered and admitted like any request; at the end of each turn vLLM keeps the
session's KV blocks and batch slot and puts it in its own queue of block holders
(`kv_holding_waiting`), which its admission loop drains before the policy's queue (a holder must
never wait behind a head whose allocation fails). So the policy sees a session as one request
that stays admitted until the session ends: its next turns are neither queued, nor asked
`admit`, nor announced by `on_schedule`, and `admit` finds it in its running list while it holds
its blocks between turns (sessions.py). What it is told adds up: `generated` counts the tokens
of all turns (vLLM clears the output at each new chunk; until 2026-12-08 the policy heard a second
turn's tokens only past the first turn's count), `prompt_tokens` all input chunks
(sessions.py `_update_request_as_session`).
"""

from __future__ import annotations

from vllm.v1.request import RequestStatus

from presched.engine.plugin.config import PluginConfigError

_READY = (RequestStatus.WAITING, RequestStatus.PREEMPTED)


def check_supported(sched) -> None:
    """Refuse what the plugin does not run under (module doc); `sched`: the vLLM Scheduler."""
    if sched.lora_config is not None or sched.connector is not None:
        raise PluginConfigError(
            "presched's in-engine scheduler does not support LoRA or KV connectors "
            "(--enable-lora / --kv-transfer-config); start vLLM without them"
        )
    if sched.vllm_config.ec_transfer_config is not None:
        raise PluginConfigError(
            "presched's in-engine scheduler does not support an encoder-cache connector "
            "(ec_transfer_config, --ec-transfer-config: its skip of a head whose encoder "
            "outputs are in transit would be taken for an admission); start vLLM without it"
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


def admissible(vreq) -> bool:
    """Whether vLLM's admission loop would try to start the waiting request `vreq` this step
    (module doc). Reading a grammar resolves its future, as vLLM's own check does."""
    status = vreq.status
    if status == RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR:
        so = vreq.structured_output_request
        grammar = so.grammar if so is not None else None
        if grammar is None or isinstance(grammar, Exception):
            return False
    elif status not in _READY:
        return False
    return not (vreq.num_stale_output_tokens and not vreq.drop_stale_output)
