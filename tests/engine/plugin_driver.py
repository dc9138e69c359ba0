"""Drives the real `PreschedScheduler` (vLLM 0.32's `Scheduler` subclass) without a model, for
tests/engine/test_plugin_scheduler.py: it runs in the engine venv (vLLM is not importable in the
main one, and the engine venv has no pytest), so the test starts it as a subprocess

    <engine python> tests/engine/plugin_driver.py MODEL_DIR TMP_DIR SCENARIO ...

and reads one JSON object {scenario: observations} from the last line of its stdout. Each
scenario builds a scheduler on the tiny Llama's config (no weights loaded: a KV cache config of
`num_blocks` blocks is handed to it, as vLLM's own scheduler tests do) and steps it with
`ModelRunnerOutput`s made here (one sampled token per request that finished its prefill): the
workers are the only stand-in. A scenario that raises reports {"error": "Type: message"}.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")

import torch  # noqa: E402
from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig  # noqa: E402
from vllm.sampling_params import SamplingParams, StructuredOutputsParams  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec  # noqa: E402
from vllm.v1.outputs import ModelRunnerOutput  # noqa: E402
from vllm.v1.request import Request, RequestStatus  # noqa: E402
from vllm.v1.structured_output import StructuredOutputManager  # noqa: E402

from presched.schedule import POLICIES  # noqa: E402
from presched.schedule.interface import Policy  # noqa: E402

MODEL = ""  # set by main()
TMP = Path(".")


class Recording(Policy):
    """FCFS that records the hooks it is asked (`calls`: (hook, request id)) and, as `preempt_for`,
    names the most recently admitted running request for any head: a policy that preempts
    whenever it can, to reach vLLM's preempted paths."""

    name = "test-recording"

    def __init__(self, **params) -> None:
        super().__init__(**params)
        self.calls: list[tuple[str, str]] = []

    def admit(self, seq, running, now):
        self.calls.append(("admit", seq.id))
        return True

    def preempt_for(self, candidate, running, now):
        self.calls.append(("preempt_for", candidate.id))
        return running[-1] if running else None

    def on_finish(self, seq, now):
        self.calls.append(("on_finish", seq.id))

    def on_cancel(self, seq, now):
        self.calls.append(("on_cancel", seq.id))


if "test-recording" not in POLICIES:
    POLICIES.register("test-recording")(Recording)


def make_sched(plugin: dict, num_blocks: int = 100, block_size: int = 16, max_num_seqs: int = 4,
               max_batched: int = 256, async_scheduling: bool = False, pipeline: int = 1,
               chunked: bool = True, prefix: bool = False, threshold: int = 0, max_model_len: int = 2048):
    os.environ["PRESCHED_PLUGIN_CONFIG"] = json.dumps(plugin)
    from presched.engine.plugin.scheduler import PreschedScheduler

    mc = ModelConfig(model=MODEL, dtype="float32", seed=0, max_model_len=max_model_len)
    sc = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=max_batched,
                         max_model_len=max_model_len, enable_chunked_prefill=chunked, policy="priority",
                         is_encoder_decoder=False, long_prefill_token_threshold=threshold)  # fmt: skip
    cc = CacheConfig(block_size=block_size, cache_dtype="auto", enable_prefix_caching=prefix)
    vc = VllmConfig(scheduler_config=sc, model_config=mc, cache_config=cc,
                    device_config=DeviceConfig("cpu"))  # fmt: skip
    vc.cache_config.num_gpu_blocks = num_blocks
    # what a GPU platform leaves on (CPU turns async scheduling off when the config is made)
    vc.scheduler_config.async_scheduling = async_scheduling
    vc.parallel_config.pipeline_parallel_size = pipeline
    spec = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=1, dtype=torch.float32)
    kv = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                       kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])  # fmt: skip
    return PreschedScheduler(vllm_config=vc, kv_cache_config=kv, block_size=block_size,
                             structured_output_manager=StructuredOutputManager(vc), log_stats=False)  # fmt: skip


def req(rid: str, prompt: int = 10, max_tokens: int = 20, arrival: float | None = None,
        xargs: dict | None = None, json_schema: dict | None = None) -> Request:
    so = StructuredOutputsParams(json=json_schema) if json_schema is not None else None
    sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True, extra_args=xargs, structured_outputs=so)
    if so is not None:
        sp.structured_outputs._backend = "xgrammar"  # what vLLM's input processor sets
    return Request(rid, list(range(1, prompt + 1)), sp, None,
                   arrival_time=time.time() if arrival is None else arrival)  # fmt: skip


def output(ids: list[str], sampled: list[list[int]]) -> ModelRunnerOutput:
    return ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                             sampled_token_ids=sampled)  # fmt: skip


def step(s, token: int = 5):
    """One schedule() and its output: a token for every request whose prefill is done."""
    out = s.schedule()
    ids = list(out.num_scheduled_tokens)
    done = [s.requests[r].num_computed_tokens >= s.requests[r].num_tokens for r in ids]
    s.update_from_output(out, output(ids, [[token] if d else [] for d in done]))
    return out


def _error(fn):
    try:
        fn()
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {e}"
    return None


# --- scenarios ---------------------------------------------------------------------------------
def stopped_while_preempted() -> dict:
    """vLLM's batch-queue order (what async scheduling and pipeline parallelism do): schedule()
    runs again before the previous step's output is back. r0's last token is in flight when the
    policy preempts it for r1; the output then ends r0 while it waits (vLLM's
    stopped_preempted_reqs: freed first, removed from the waiting queue after)."""
    s = make_sched({"policy": "test-recording"}, max_num_seqs=1)
    s.add_request(req("r0", max_tokens=1))
    out1 = s.schedule()
    s.add_request(req("r1", max_tokens=4))
    out2 = s.schedule()  # the second batch before the first's output
    r0_status = s.requests["r0"].status.name
    s.update_from_output(out1, output(list(out1.num_scheduled_tokens), [[7]] * len(out1.num_scheduled_tokens)))
    waiting = [r.request_id for r in s.waiting]
    s.update_from_output(out2, output(list(out2.num_scheduled_tokens), [[7]] * len(out2.num_scheduled_tokens)))
    crash = _error(lambda: [step(s, 7) for _ in range(10) if s.has_requests()])
    return {"r0_after_second_schedule": r0_status, "waiting_after_r0_stopped": waiting,
            "crash": crash, "unfinished": s.get_num_unfinished_requests(),
            "calls": s.ps.calls}  # fmt: skip


def batch_queue_refused() -> dict:
    return {"async": _error(lambda: make_sched({"policy": "fcfs"}, async_scheduling=True)),
            "pipeline": _error(lambda: make_sched({"policy": "fcfs"}, pipeline=2)),
            "sync": _error(lambda: make_sched({"policy": "fcfs"}))}  # fmt: skip


def grammar_head_preempt_for() -> dict:
    """srpt, one slot: a long request runs; a short one arrives whose structured-output grammar
    is not compiled yet (vLLM compiles it in a thread; its admission loop skips the request
    until then). Three steps; then the grammar is compiled (xgrammar, for real) and one more
    schedule()."""
    s = make_sched({"policy": "srpt"}, max_num_seqs=1)
    s.add_request(req("long", prompt=200, max_tokens=500, arrival=1.0,
                      xargs={"presched_quantiles": [500] * 11}))  # fmt: skip
    for _ in range(3):
        step(s)
    short = req("json-short", prompt=3, max_tokens=5, arrival=2.0,
                xargs={"presched_quantiles": [5] * 11}, json_schema={"type": "object"})  # fmt: skip
    s.add_request(short)
    compiling = []
    for _ in range(3):
        out = step(s)
        compiling.append({"scheduled": list(out.num_scheduled_tokens),
                          "long_preemptions": s.requests["long"].num_preemptions})  # fmt: skip
    s.structured_output_manager.grammar_init(short)
    short.structured_output_request._grammar.result(timeout=60)  # compiled: ready for vLLM
    out = s.schedule()
    return {"while_compiling": compiling, "preempt_for_count": s.counts["preempt_for"],
            "ready": {"scheduled": list(out.num_scheduled_tokens),
                      "long_preemptions": s.requests["long"].num_preemptions}}  # fmt: skip


def grammar_head_admit() -> dict:
    """kv-admission (fcfs inside, 1,024 KV tokens), two slots: a long request runs; the head of
    the queue is a request whose grammar is still compiling and whose predicted footprint does
    not fit; behind it a small one that fits. vLLM skips the head; the small one should start."""
    s = make_sched({"policy": "kv-admission", "params": {"kv_tokens": 1024}}, max_num_seqs=2)
    s.add_request(req("long", prompt=200, max_tokens=500, arrival=1.0,
                      xargs={"presched_quantiles": [500] * 11}))  # fmt: skip
    step(s)
    s.add_request(req("json-big", prompt=3, max_tokens=600, arrival=2.0,
                      xargs={"presched_quantiles": [600] * 11}, json_schema={"type": "object"}))  # fmt: skip
    s.add_request(req("small", prompt=3, max_tokens=5, arrival=3.0,
                      xargs={"presched_quantiles": [5] * 11}))  # fmt: skip
    out = step(s)
    return {"scheduled": list(out.num_scheduled_tokens), "policy_errors": dict(s.guard.errors)}


def error_finish() -> dict:
    """A request generates 4 tokens, then vLLM ends it with FINISHED_ERROR (`finish_requests`,
    what its update_from_output does for a grammar compile error, an encoder-cache mismatch or
    a failed KV load); another request stops normally."""
    rec = TMP / "error-records.sqlite"
    s = make_sched({"policy": "test-recording", "records": str(rec)})
    s.add_request(req("e1", max_tokens=50))
    s.add_request(req("ok", max_tokens=2))
    for _ in range(4):
        step(s)
    s.finish_requests("e1", RequestStatus.FINISHED_ERROR)
    s.shutdown()
    calls = [c for c in s.ps.calls if c[0] in ("on_finish", "on_cancel")]
    return {"records": str(rec), "calls": calls, "errors": s.counts["errors"],
            "finished": s.counts["finished"]}  # fmt: skip


def slo_from_xargs() -> dict:
    """slo (tpot_s 0.01) with per-request SLOs in vllm_xargs, one slot: three requests queue
    behind a running one; `shortest` order serves the feasible ones by predicted service."""
    s = make_sched({"policy": "slo", "params": {"tpot_s": 0.01}}, max_num_seqs=1)
    now = time.time()
    s.add_request(req("first", max_tokens=3, arrival=now, xargs={"presched_quantiles": [3] * 11,
                                                                  "presched_slo_e2e": 60}))  # fmt: skip
    step(s)
    for rid, n, slo in [("long", 50, {"presched_slo_e2e": 60}), ("mid", 20, {"presched_slo_ttft": "30"}),
                        ("short", 5, {"presched_slo_e2e": 60.0})]:  # fmt: skip
        s.add_request(req(rid, max_tokens=n, arrival=now, xargs={"presched_quantiles": [n] * 11, **slo}))
    s.add_request(req("bad", max_tokens=5, arrival=now,
                      xargs={"presched_quantiles": [5] * 11, "presched_slo_e2e": -1}))  # fmt: skip
    slos = {rid: [seq.request.slo_e2e, seq.request.slo_ttft] for rid, seq in s._seqs.items()}
    order = ["first"]
    for _ in range(200):
        if not s.has_requests():
            break
        out = step(s)
        order += [r for r in out.num_scheduled_tokens if r not in order]
    return {"order": order, "slos": slos, "policy_errors": dict(s.guard.errors),
            "bad_xargs": s.counts["bad_xargs"]}  # fmt: skip


def preempt_for_all_or_nothing() -> dict:
    """srpt, 3 slots, 20 blocks of 16 tokens (19 usable): 'long' (96-token prompt, predicted
    500) and 'short' (96, predicted 3) run, 6-7 blocks each; 'mid' arrives (240 tokens: 15
    blocks, predicted 50). srpt names long for it (500 > 50), never short (3 < 50), and long's
    blocks alone leave mid short: nobody may be preempted. Once short has finished, long's
    blocks are enough: long is preempted in the step mid starts."""
    s = make_sched({"policy": "srpt"}, num_blocks=20, max_num_seqs=3)
    s.add_request(req("long", prompt=96, max_tokens=500, arrival=1.0, xargs={"presched_quantiles": [500] * 11}))
    s.add_request(req("short", prompt=96, max_tokens=3, arrival=1.5, xargs={"presched_quantiles": [3] * 11}))
    step(s)
    s.add_request(req("mid", prompt=240, max_tokens=50, arrival=2.0, xargs={"presched_quantiles": [50] * 11}))
    steps = []
    for _ in range(10):
        out = step(s)
        steps.append({"scheduled": sorted(out.num_scheduled_tokens),
                      "long_preemptions": s.requests["long"].num_preemptions,
                      "short_done": "short" not in s.requests})  # fmt: skip
        if "mid" in out.num_scheduled_tokens:
            break
    return {"steps": steps, "preempt_for_count": s.counts["preempt_for"]}


def preempt_for_counts_as_vllm() -> dict:
    """Two cases where the head's first chunk fits the victim's blocks but vLLM would still not
    start it (19 usable blocks of 16 tokens; every request fits them whole): (full_isl) a
    240-token head with 64 tokens per step, which vLLM 0.32 admits only when its whole prompt
    fits (scheduler_reserve_full_isl); (growth) a 196-token head (13 blocks) against 7 free +
    long's 6, where the other running request's next token takes a new block before the head
    is reached. Per step: whether the plugin preempted for the head then (vLLM's own KV-pressure
    preemptions not counted) and whether mid started; a preemption in a step where mid does not
    start is wasted."""
    out = {}
    for case, batched, other, mid in (("full_isl", 64, (160, 140), 240), ("growth", 256, (96, 150), 196)):
        s = make_sched({"policy": "srpt"}, num_blocks=20, max_num_seqs=3, max_batched=batched)
        s.add_request(req("long", prompt=96, max_tokens=200, arrival=1.0, xargs={"presched_quantiles": [500] * 11}))
        s.add_request(req("other", prompt=other[0], max_tokens=other[1], arrival=1.5,
                          xargs={"presched_quantiles": [3] * 11}))  # fmt: skip
        for _ in range(5 if case == "full_isl" else 1):
            step(s)
        s.add_request(req("mid", prompt=mid, max_tokens=50, arrival=2.0, xargs={"presched_quantiles": [50] * 11}))
        steps, before = [], 0
        for _ in range(600):
            o = step(s)
            steps.append([s.counts["preempt_for"] > before, "mid" in o.num_scheduled_tokens])
            before = s.counts["preempt_for"]
            if "mid" in o.num_scheduled_tokens:
                break
        out[case] = {"steps": steps, "pinned_after": getattr(s.waiting, "pinned", None) is not None,
                     "preempt_for": s.counts["preempt_for"]}  # fmt: skip
    return out


def _hashed(rid: str, toks, max_tokens: int, arrival: float) -> Request:
    """A request with vLLM's block hasher (what prefix caching needs), sampling ignore_eos."""
    from vllm.utils.hashing import get_hash_fn_by_name
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

    fn = get_hash_fn_by_name("sha256")
    init_none_hash(fn)
    return Request(rid, list(toks), SamplingParams(max_tokens=max_tokens, ignore_eos=True), None,
                   arrival_time=arrival, block_hasher=get_request_block_hasher(16, fn))  # fmt: skip


def _watch(s, head: str, n: int) -> list[list]:
    """Up to n steps until `head` starts: [preempted for it in that step, it started]."""
    rows, before = [], s.counts["preempt_for"]
    for _ in range(n):
        o = step(s)
        rows.append([s.counts["preempt_for"] > before, head in o.num_scheduled_tokens])
        before = s.counts["preempt_for"]
        if rows[-1][1]:
            break
    return rows


def fits_edge_cases() -> dict:
    """What vLLM 0.32's admission counts besides the head's first chunk (test-recording names
    the latest running request for any head): chunked prefill off (the head's whole prompt in
    the budget left), spec-decode lookahead (the head's chunk + 4 lookahead tokens in blocks),
    victims sharing prefix-cache blocks (freed once both go), long_prefill_token_threshold (a
    running prefill takes only its capped chunk of the budget: no preemption needed)."""
    out = {}
    s = make_sched({"policy": "test-recording"}, num_blocks=21, max_batched=256, max_model_len=256, chunked=False)
    for i, rid in enumerate("ABC"):
        s.add_request(_hashed(rid, range(100 * i + 1, 100 * i + 21), 200, 1.0 + i))
    step(s), step(s)
    s.add_request(_hashed("H", range(1000, 1255), 1, 5.0))  # 255 tokens: 16 blocks, the budget after 3 decodes is 253
    out["chunked_off"] = _watch(s, "H", 10)
    s = make_sched({"policy": "test-recording"}, num_blocks=21, max_batched=512)
    s.num_lookahead_tokens = 4  # what an EAGLE drafter with 4 speculative tokens sets
    for i, (rid, n) in enumerate((("A", 80), ("B", 12), ("C", 20))):
        s.add_request(_hashed(rid, range(100 * i + 1, 100 * i + 1 + n), 300, 1.0 + i))
    step(s)
    s.add_request(_hashed("H", range(1000, 1192), 1, 5.0))  # 12 blocks, 13 with the lookahead
    out["lookahead"] = _watch(s, "H", 8)
    s = make_sched({"policy": "test-recording"}, num_blocks=21, prefix=True)
    s.add_request(_hashed("A", [*range(1, 161), 7001, 7002], 300, 1.0))
    step(s)
    s.add_request(_hashed("B", [*range(1, 161), 8001, 8002], 300, 2.0))  # shares A's 10 blocks
    step(s)
    s.add_request(_hashed("H", range(2000, 2000 + 16 * 18), 1, 5.0))  # 18 blocks of 20
    out["shared_victims"] = _watch(s, "H", 8)
    s = make_sched({"policy": "test-recording"}, num_blocks=200, threshold=64)
    s.add_request(_hashed("L", range(1, 1001), 10, 1.0))
    step(s)
    s.add_request(_hashed("H", range(2000, 2050), 1, 5.0))
    out["long_threshold"] = _watch(s, "H", 4)
    return out


def head_cache_hit() -> dict:
    """The head's prefix-cache hit, as vLLM 0.32 counts it (test-recording names the latest
    running request for any head; 20 usable blocks of 16 tokens, prefix caching on).
    held: A (a 160-token prefix P + 2 tokens: 11 blocks) and B (80 + 1 generated: 6 blocks)
    run, 3 blocks free; the head is P + 30 tokens (12 blocks), 10 of them A's cached blocks:
    vLLM starts it with 2 new blocks, so nobody may be preempted (counting its whole prompt
    preempted B and then A). revive: A (P + 1 token) has finished, its 10 full blocks are
    cached but free; B and C run (5 blocks each), 10 blocks free, all of them A's; the head
    is P + 48 tokens (13 blocks): taking A's cached blocks takes them out of the free pool,
    so it needs all 13 and starts only once C is preempted (counting the hit blocks as held
    preempted no one, and the head waited behind B and C)."""
    out = {}
    s = make_sched({"policy": "test-recording"}, num_blocks=21, max_batched=512, prefix=True)
    s.add_request(_hashed("A", [*range(1, 161), 7001, 7002], 300, 1.0))
    s.add_request(_hashed("B", range(3001, 3081), 300, 2.0))
    step(s), step(s)
    s.add_request(_hashed("H", [*range(1, 161), *range(9001, 9031)], 1, 5.0))
    out["held_free"] = s.kv_cache_manager.block_pool.get_num_free_blocks()
    out["held"] = _watch(s, "H", 6)
    s = make_sched({"policy": "test-recording"}, num_blocks=21, max_batched=512, prefix=True)
    s.add_request(_hashed("A", [*range(1, 161), 7001], 1, 1.0))
    s.add_request(_hashed("B", range(3001, 3065), 300, 2.0))
    s.add_request(_hashed("C", range(4001, 4065), 300, 3.0))
    step(s), step(s)
    s.add_request(_hashed("H", [*range(1, 161), *range(9001, 9049)], 1, 5.0))
    out["revive_free"] = s.kv_cache_manager.block_pool.get_num_free_blocks()
    out["revive"] = _watch(s, "H", 6)
    return out


def refused_once() -> dict:
    """A preemption vLLM does not use (here forced: `_fits` replaced by one that believes any
    victim is enough, a stand-in for what it cannot see) is not repeated for that head while
    the running batch stays the same: test-recording would otherwise preempt every step."""
    s = make_sched({"policy": "test-recording"}, num_blocks=21, max_num_seqs=4)
    for i, rid in enumerate("ABC"):
        s.add_request(_hashed(rid, range(100 * i + 1, 100 * i + 81), 200, 1.0 + i))  # 5-6 blocks each
    step(s)
    s.add_request(_hashed("H", range(1000, 1000 + 16 * 19), 1, 5.0))  # 19 blocks: only with all three gone
    from presched.engine.plugin.admission import would_start

    s._fits = lambda head, victims: bool(victims) if head.id == "H" else would_start(s, head, victims)
    rows = _watch(s, "H", 6)
    return {"steps": rows, "preempt_for": s.counts["preempt_for"], "refused": s.counts["preempt_for_refused"]}


class RaisingPriority(Policy):
    """A policy whose `priority` raises for every request (the Guard serves them FCFS)."""

    name = "test-raising-priority"

    def priority(self, seq, now):
        raise RuntimeError("no key")


if "test-raising-priority" not in POLICIES:
    POLICIES.register("test-raising-priority")(RaisingPriority)


def write_failures() -> dict:
    """Writes that fail must not stop the engine: the records database held by another writer
    (sqlite's lock), then the stats folder removed. And policy errors rewrite the stats file at
    most every STATS_INTERVAL_S, not once per error (20 errors in one step: 20 rewrites)."""
    import shutil
    import sqlite3

    import presched.engine.plugin.scheduler as plugin_scheduler

    run = TMP / "write-failures"
    run.mkdir()
    rec = run / "r.sqlite"
    s = make_sched({"policy": "test-raising-priority", "records": str(rec), "stats": str(run / "stats.json")},
                   max_num_seqs=32)  # fmt: skip
    writes = []
    real = plugin_scheduler.write_stats
    plugin_scheduler.write_stats = lambda path, stats: (writes.append(stats["policy_errors_total"]), real(path, stats))
    try:
        for i in range(20):
            s.add_request(req(f"p{i}", max_tokens=1))  # each push: one priority error
        errors_at_arrival, writes_at_arrival = s.guard.total, len(writes)
        holder = sqlite3.connect(rec, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        t0 = time.perf_counter()
        for _ in range(2):
            step(s)  # the 20 finish: their records writes fail on the lock
        locked_s = time.perf_counter() - t0
        holder.rollback()
        holder.close()
        shutil.rmtree(run)
        s.add_request(req("last", max_tokens=1))
        for _ in range(2):
            step(s)  # it finishes: the stats rewrite fails (no folder)
    finally:
        plugin_scheduler.write_stats = real
    return {"errors_at_arrival": errors_at_arrival, "writes_at_arrival": writes_at_arrival,
            "write_errors": s.counts["write_errors"], "finished": s.counts["finished"],
            "locked_s": locked_s}  # fmt: skip


def paused_no_preempt_for() -> dict:
    """vLLM paused with mode 'wait' (PAUSED_NEW: the running requests drain, no one is admitted):
    srpt must not preempt a running request for a short head vLLM will not start (its KV was
    thrown away and it was stranded in the queue until resume)."""
    from vllm.v1.core.sched.interface import PauseState

    s = make_sched({"policy": "srpt"}, max_num_seqs=2)
    for rid, at in (("long1", 1.0), ("long2", 1.1)):
        s.add_request(req(rid, prompt=20, max_tokens=30, arrival=at, xargs={"presched_quantiles": [30] * 11}))
    step(s)
    step(s)
    s.set_pause_state(PauseState.PAUSED_NEW)
    for i in range(2):
        s.add_request(req(f"short{i}", prompt=5, max_tokens=3, arrival=2.0 + i, xargs={"presched_quantiles": [3] * 11}))
    for _ in range(40):
        if all(r in ("short0", "short1") for r in s.requests):  # the running ones drained
            break
        step(s)
    return {"preempt_for": s.counts["preempt_for"], "waiting": sorted(r.request_id for r in s.waiting)}


SCENARIOS = {f.__name__: f for f in (paused_no_preempt_for, write_failures, fits_edge_cases, head_cache_hit, refused_once, stopped_while_preempted, batch_queue_refused,
                                     grammar_head_preempt_for, grammar_head_admit, error_finish,
                                     slo_from_xargs, preempt_for_all_or_nothing,
                                     preempt_for_counts_as_vllm)}  # fmt: skip


def main(argv: list[str]) -> None:
    global MODEL, TMP
    MODEL, TMP = argv[0], Path(argv[1])
    results = {}
    for name in argv[2:]:
        try:
            results[name] = SCENARIOS[name]()
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            results[name] = {"error": f"{type(e).__name__}: {e}"}
    print(json.dumps(results))


if __name__ == "__main__":
    main(sys.argv[1:])
