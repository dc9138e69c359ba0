"""Runs vLLM 0.32's own `Scheduler` (FCFS, no model) on workloads given as JSON and prints each
request's schedule, for tests/engine/test_sim_vs_vllm.py (the simulator's differential check):

    <engine python> tests/engine/vllm_schedule_driver.py MODEL_DIR WORKLOADS.json

WORKLOADS.json is a list of {"engine": {block_size, num_blocks, max_num_seqs,
max_num_batched_tokens, enable_chunked_prefill, long_prefill_token_threshold,
enable_prefix_caching}, "step": seconds, "requests": [{"id", "arrival", "prompt": [token ids],
"output": [token ids]}]}; `num_blocks` counts usable blocks (vLLM's pool has one more, its null
block). The last line of stdout is a JSON list, one {id: [first_scheduled, first_token, finish,
preemptions]} per workload (or {"error": ...}); a workload with "trace": true also gets
"steps": [[start, {id: tokens scheduled}, free blocks after scheduling], ...].

What stands in for the workers: every step lasts `step` seconds; a request whose prefill is done
samples the next token of its `output` (so equal outputs hash equally, and a later turn whose
prompt holds an earlier answer hits its blocks); it stops at len(output) tokens (ignore_eos).
As in presched's simulator, a request joins the first step that starts at or after its arrival;
an idle engine jumps to the next arrival, and a step that schedules nothing (everything it tried
was preempted) takes no time.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import torch  # noqa: E402
from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig  # noqa: E402
from vllm.sampling_params import SamplingParams  # noqa: E402
from vllm.utils.hashing import get_hash_fn_by_name  # noqa: E402
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash  # noqa: E402
from vllm.v1.core.sched.scheduler import Scheduler  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

TIE = 1e-9  # presched.sim.instance.TIE
HASH = get_hash_fn_by_name("sha256")
init_none_hash(HASH)


def make_sched(model: str, e: dict, max_model_len: int) -> Scheduler:
    bs, n = e["block_size"], e["num_blocks"] + 1  # + vLLM's null block
    mc = ModelConfig(model=model, dtype="float32", seed=0, max_model_len=max_model_len)
    sc = SchedulerConfig(
        max_num_seqs=e["max_num_seqs"], max_num_batched_tokens=e["max_num_batched_tokens"],
        max_model_len=max_model_len, enable_chunked_prefill=e["enable_chunked_prefill"],
        long_prefill_token_threshold=e["long_prefill_token_threshold"], policy="fcfs",
        is_encoder_decoder=False,
    )  # fmt: skip
    cc = CacheConfig(block_size=bs, cache_dtype="auto",
                     enable_prefix_caching=e["enable_prefix_caching"])  # fmt: skip
    vc = VllmConfig(scheduler_config=sc, model_config=mc, cache_config=cc,
                    device_config=DeviceConfig("cpu"))  # fmt: skip
    vc.cache_config.num_gpu_blocks = n
    vc.scheduler_config.async_scheduling = False
    spec = FullAttentionSpec(block_size=bs, num_kv_heads=1, head_size=1, dtype=torch.float32)
    kv = KVCacheConfig(num_blocks=n, kv_cache_tensors=[],
                       kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])  # fmt: skip
    return Scheduler(vllm_config=vc, kv_cache_config=kv, block_size=bs,
                     structured_output_manager=StructuredOutputManager(vc), log_stats=False)  # fmt: skip


def run(model: str, wl: dict) -> dict:
    e, step = wl["engine"], wl["step"]
    reqs = sorted(enumerate(wl["requests"]), key=lambda t: (t[1]["arrival"], t[0]))
    longest = max(len(r["prompt"]) + len(r["output"]) for _, r in reqs)
    s = make_sched(model, e, max(longest + 1, e["long_prefill_token_threshold"]))
    hasher = None
    if e["enable_prefix_caching"]:
        hasher = get_request_block_hasher(e["block_size"], HASH)
    outputs = {r["id"]: r["output"] for _, r in reqs}
    objs: dict[str, Request] = {}
    rec: dict[str, list] = {r["id"]: [None, None, None, 0] for _, r in reqs}
    clock, i, empty, steps = 0.0, 0, 0, []
    while i < len(reqs) or s.get_num_unfinished_requests():
        if not s.get_num_unfinished_requests() and clock < reqs[i][1]["arrival"]:
            clock = reqs[i][1]["arrival"]  # idle: time jumps to the arrival
        while i < len(reqs) and reqs[i][1]["arrival"] <= clock + TIE:
            r = reqs[i][1]
            sp = SamplingParams(max_tokens=len(r["output"]), ignore_eos=True)
            objs[r["id"]] = Request(r["id"], list(r["prompt"]), sp, None, arrival_time=r["arrival"],
                                    block_hasher=hasher)  # fmt: skip
            s.add_request(objs[r["id"]])
            i += 1
        out = s.schedule()
        ids = list(out.num_scheduled_tokens)
        if wl.get("trace"):
            free = s.kv_cache_manager.block_pool.get_num_free_blocks()
            steps.append([clock, dict(out.num_scheduled_tokens), free])
        sampled = []
        for rid in ids:
            q = objs[rid]
            if rec[rid][0] is None:
                rec[rid][0] = clock
            done = q.num_computed_tokens >= q.num_tokens  # its prefill is done: it samples
            sampled.append([outputs[rid][len(q.output_token_ids)]] if done else [])
        index = {r: j for j, r in enumerate(ids)}
        s.update_from_output(out, ModelRunnerOutput(req_ids=ids, req_id_to_index=index,
                                                    sampled_token_ids=sampled))  # fmt: skip
        if not ids:  # everything it tried was preempted: no time passes
            empty += 1
            if empty > 100:
                raise RuntimeError(f"no progress at t={clock}")
            continue
        empty = 0
        clock += step
        for rid, tok in zip(ids, sampled):
            if tok:
                if rec[rid][1] is None:
                    rec[rid][1] = clock
                if objs[rid].is_finished():
                    rec[rid][2] = clock
    for rid, q in objs.items():
        rec[rid][3] = q.num_preemptions
    if wl.get("trace"):
        rec["steps"] = steps
    return rec


def main(argv: list[str]) -> None:
    model, path = argv[0], argv[1]
    with open(path) as f:
        workloads = json.load(f)
    results = []
    for wl in workloads:
        try:
            results.append(run(model, wl))
        except Exception as ex:  # noqa: BLE001
            traceback.print_exc()
            results.append({"error": f"{type(ex).__name__}: {ex}"})
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1:])
