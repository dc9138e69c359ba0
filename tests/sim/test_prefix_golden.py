"""Bit-identical results with prefix caching on: fingerprints of runs recorded from the radix
cache as it was before its speed work (commit 9307744). Speeding up `prefix_cache.py` must not
move a single timestamp, hit, eviction or preemption; a change here means results moved.

Each fingerprint is `builders.fingerprint` (every record column, the ITL log, step,
run and preemption counts) plus every request's cached tokens, the hit counters, the peak KV
use and the evicted units of every instance. The cases cover the finest units (16-token hashes,
one unit per block), coarser (32: two blocks) and finer hashes (8), Mooncake's 512-token
hashes on two instances, multi-turn conversations (decode blocks hit), a KV cache small enough
to evict and preempt all the time, and fast-forward off.

Re-recorded once since, for a fix, not for speed: fast-forwarded decode runs went past steps
where stepping one at a time shares a cached answer unit or evicts a coarse unit of a waiting
request's hit (instance.py `_cache_limit`). The two multi-turn cases then differed from
`fast_forward=False` in ~1,200-1,350 finish times each; mooncake-2-rr only in its run count.
Every case was checked equal to its `fast_forward=False` run (times within 1e-9, counts, hits
and evictions exact); test_fast_forward_matches_step_by_step keeps one of them so.

Re-recorded again (2026-12-07, evening) for two more stops of a run (a preempting policy; a
later turn whose hit grows as an earlier one caches its answer): sys-16-srpt-small-kv and
turns-32-small-kv changed only in their run counts, both equal to their `fast_forward=False`
runs before and after. And once more (2026-12-07, night) for the step-time model, not the cache:
the untied input embedding is no longer read every step and the default overheads were refit,
so every step's duration moved (tests/sim/test_fingerprints.py too). Then for three scheduler
semantics of vLLM 0.32 (a preempted request resumes before waiting ones of its arrival time; the
long-prefill cap only with another request to starve; admission only when the whole sequence's
blocks are free): mooncake-2-rr, sys-16-srpt-small-kv and the two multi-turn cases moved, each
still equal to its `fast_forward=False` run; the five runs of test_fingerprints.py did not.
Then (2026-12-08) for when a unit is cached: when its step is scheduled, as vLLM caches blocks
when it allocates them (`allocate_slots` -> `cache_blocks`), not once computed, so a request
admitted later in a step hits what the requests before it are computing in that step (found by
tests/engine/test_sim_vs_vllm.py): all but sys-16 moved, each equal to its `fast_forward=False`
run; turns-8 once more in its run count only, when runs with someone waiting were checked for
that (`_cache_limit` had been skipped without a unit-inserting request, coarse units or a
preempting policy). Then for copies: a request that computes a unit someone else cached
meanwhile keeps the block it computed it in, as vLLM does (it never de-duplicates a block
table; the simulator shared the cached one and freed its own): the two multi-turn cases
moved (the others have no such unit), each equal to its `fast_forward=False` run; and again
when those copies stay cached once released (spare copies, each in the LRU), as vLLM's do."""

import hashlib

import numpy as np
import pytest
from builders import fingerprint

from presched.sim import SimConfig
from presched.sim.setup import build_cluster
from presched.workload.config import WorkloadConfig, build_workload
from presched.workload.shared_prefix import SharedPrefixConfig


def run(reqs, cfg):
    cluster = build_cluster(cfg)
    res = cluster.run(reqs)
    kvs = [inst.sched.kv for inst in cluster.instances]
    h = hashlib.sha256(fingerprint(res).encode())
    h.update(np.array([s.cached_tokens for s in res.seqs], dtype=np.int64).tobytes())
    h.update(f"{res.prefix_hit_tokens},{res.prefix_queried_tokens},{res.prompt_hit_tokens},"
             f"{res.prompt_tokens_admitted},{res.peak_kv_blocks}".encode())  # fmt: skip
    h.update(str([kv.evicted_units for kv in kvs]).encode())
    return h.hexdigest()[:16], res, kvs


def shared(n, **prefix):
    prefix = dict(dict(system_prompts=8, system_prompt_tokens=512), **prefix)
    return build_workload(WorkloadConfig(source="azure-conv", num_requests=n,
                                         shared_prefix=SharedPrefixConfig(**prefix)))  # fmt: skip


def caching(**engine):
    return dict(engine, enable_prefix_caching=True)


CASES = {
    "sys-16": (lambda: shared(3000), SimConfig(engine=caching(num_blocks=6000))),
    "sys-16-srpt-small-kv": (lambda: shared(1500), SimConfig(
        policy="srpt-oracle", engine=caching(num_blocks=1500, max_num_seqs=64))),
    "sys-16-no-fast-forward": (lambda: shared(800), SimConfig(
        fast_forward=False, engine=caching(num_blocks=1500))),
    "turns-32-small-kv": (lambda: shared(1500, mean_turns=3, system_prompts=4, block_tokens=32),
                          SimConfig(engine=caching(num_blocks=3000))),
    "turns-8": (lambda: shared(1500, mean_turns=4, block_tokens=8),
                SimConfig(policy="sjf-oracle", engine=caching(num_blocks=4000))),
    "mooncake-2-rr": (lambda: build_workload(WorkloadConfig(source="mooncake-conv", num_requests=600)),
                      SimConfig(num_instances=2, router="round-robin", engine=caching(num_blocks=10000))),
}

GOLDEN = {
    "mooncake-2-rr": "028cf95601b99a7d",
    "sys-16": "a3fc988cfafd02d5",
    "sys-16-no-fast-forward": "d55ae10caaa9b4ad",
    "sys-16-srpt-small-kv": "c791a8f08794a19d",
    "turns-32-small-kv": "769c9b942436e5f4",
    "turns-8": "1d848463d782108f",
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_cached_results_are_unchanged(name):
    make, cfg = CASES[name]
    fp, res, kvs = run(make(), cfg)
    assert res.prefix_hit_tokens > 0 and sum(kv.evicted_units for kv in kvs) > 0  # it is exercised
    assert fp == GOLDEN[name]


def test_fast_forward_matches_step_by_step():
    # the multi-turn case a run once got wrong in 1,193 finish times (module doc)
    make, cfg = CASES["turns-8"]
    _, fast, _ = run(make(), cfg)
    _, slow, _ = run(make(), cfg.model_copy(update={"fast_forward": False}))
    for col in ("first_token", "finish", "max_itl"):
        np.testing.assert_allclose(getattr(fast.records, col), getattr(slow.records, col), rtol=1e-9, atol=1e-9)
    for col in ("preemptions", "recomputed_tokens"):
        np.testing.assert_array_equal(getattr(fast.records, col), getattr(slow.records, col))
    assert (fast.num_steps, fast.prefix_hit_tokens) == (slow.num_steps, slow.prefix_hit_tokens)
