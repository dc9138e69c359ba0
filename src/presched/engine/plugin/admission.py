"""Whether vLLM 0.32's `schedule()` would start the waiting head this step, were some running
requests preempted (`would_start`), and which running requests to preempt for it, all or none
(`victims_for`): the plugin's preemption for the head of the queue (scheduler.py
`_preempt_for_head`). Each function takes the `PreschedScheduler` (`s`) and reads vLLM's own
state off it (running requests, the KV cache manager and block pool, the scheduler config), so
the numbers are the ones vLLM's admission loop will see; vLLM's code paths this mirrors are named
in `would_start`'s doc. Only the engine process imports it (through scheduler.py).
"""

from __future__ import annotations


def victims_for(s, head) -> list | None:
    """The running requests to preempt so that vLLM starts `head` this step, or None: each
    `preempt_for` call is asked about the batch without the ones it named before, until
    `s._fits` (`would_start`) says the head would start; then `admit` against that batch and
    the sessions that hold KV between turns (`s._held()`, sessions.py: not preemptible, so never
    offered to `preempt_for`). None if the policy stops naming victims first or `admit` refuses:
    nobody is preempted for a head that still could not start (a victim would lose its KV and
    wait behind it)."""
    trial = [s._seqs[r.request_id] for r in s.running if r.request_id in s._seqs]
    victims: list = []
    while True:
        victim = s.guard.call("preempt_for", None, s.ps.preempt_for, head, list(trial), s._now)
        if victim is None or victim not in trial or victim.vreq not in s.running:
            return None
        trial.remove(victim)
        victims.append(victim)
        if s._fits(head, victims):
            break
    if s._admits and not s.guard.call("admit", True, s.ps.admit, head, trial + s._held(), s._now):
        return None
    return victims


def would_start(s, head, victims: list) -> bool:
    """Whether vLLM's `schedule()` would start `head` this step were `victims` preempted,
    counted as vLLM 0.32 counts: not while vLLM is paused (it admits no one then); a slot
    (paused streaming sessions hold one); the token
    budget left after the running requests, which vLLM schedules first (each capped by
    `long_prefill_token_threshold` as vLLM caps it); the head's chunk likewise capped, and
    whole when chunked prefill is off; free blocks plus those the victims give back (a
    block they all share counts once, a block someone else holds not at all), less the
    blocks the running requests take this step (a decode crossing a block boundary, a
    prefill chunk, spec-decode lookahead), against the head's whole prompt when vLLM
    reserves it (`scheduler_reserve_full_isl`, the default) and its chunk plus lookahead,
    less its prefix-cache hit (`cache_hit`), plus vLLM's watermark."""
    if getattr(s, "_pause_state", 0) != 0:  # PauseState.UNPAUSED: a paused vLLM starts no one
        return False
    gone = {v.id for v in victims}
    running = [r for r in s.running if r.request_id not in gone]
    if len(running) + getattr(s, "num_waiting_for_streaming_input", 0) >= s.max_num_active_reqs:
        return False
    km, bs, ahead = s.kv_cache_manager, s.block_size, s.num_lookahead_tokens
    full = getattr(s, "scheduler_reserve_full_isl", False)
    refs = victim_refs(s, victims)
    free = km.block_pool.get_num_free_blocks() + freed(refs)
    watermark = km.watermark_blocks if running else 0
    total = min(head.vreq.num_tokens, s.max_model_len)
    hit, have, extra = cache_hit(s, head, refs)

    def blocks_for(tokens: int) -> int:  # vLLM's get_num_blocks_to_allocate for the head
        return max(-(-min(tokens, s.max_model_len) // bs) - have, 0) + extra

    if blocks_for(total if full else hit + 1) + watermark > free:
        return False  # short even before the running requests take theirs (no loop over them)
    thr = prefill_cap(s)
    budget, take = s.max_num_scheduled_tokens, 0
    blocks_of = km.coordinator.single_type_managers[0].req_to_blocks.get  # group 0, as get_blocks(...)[0]
    for r in running:  # the hot loop (~1 us per request): plain reads, no KVCacheBlocks built
        done = r.num_computed_tokens
        n = len(r._all_token_ids) + len(r.spec_token_ids) - done  # num_tokens_with_spec - computed
        if n > 1:  # a prefill chunk (or spec decode): capped as vLLM caps it
            n = min(thr if 0 < thr < n else n, budget)
        elif n < 0:
            n = 0
        budget -= n
        need_r = -(-(done + n + ahead) // bs) - len(blocks_of(r.request_id, ()))
        if need_r > 0:
            take += need_r
    rest = total - hit
    chunk = thr if 0 < thr < rest else rest
    if budget <= 0 or (chunk > budget and not s.scheduler_config.enable_chunked_prefill):
        return False
    chunk = min(chunk, budget)
    need = max(blocks_for(total) if full else 0, blocks_for(hit + chunk + ahead))
    return need + watermark <= free - take


def cache_hit(s, head, refs: dict) -> tuple[int, int, int]:
    """The head's prefix-cache hit as vLLM's `get_computed_blocks` finds it (the same read-only
    lookup: `find_longest_cache_hit` up to all but the last prompt token), in KV cache group 0
    as the rest of this module counts: (hit tokens, hit blocks, blocks the head takes from the
    free pool beyond its new ones). The last are vLLM's evictable computed blocks, cached
    blocks nobody holds once the victims (`refs`: `victim_refs`) are preempted, plus one for a
    hit that ends inside a block (copied on write). (0, 0, 0) with caching off or for a head
    with computed tokens (vLLM looks up only for a request with none)."""
    req, km = head.vreq, s.kv_cache_manager
    if req.num_computed_tokens or not km.prefix_cache_lookup_enabled(req):
        return 0, 0, 0
    key = (req.request_id, s.steps)  # one lookup per head and step: nothing allocates between the
    memo = getattr(s, "_hit_memo", None)  # calls `victims_for` makes (trial victims only)
    if memo is None or memo[0] != key:
        memo = s._hit_memo = (key, km.coordinator.find_longest_cache_hit(req.block_hashes, req.num_tokens - 1))
    blocks, tokens, _ = memo[1]
    if not tokens:
        return 0, 0, 0
    mine = blocks[0]
    extra = sum(1 for b in mine if not b.is_null and b.ref_cnt == refs.get(id(b), (b, 0))[1])
    return tokens, len(mine), extra + (tokens % s.block_size != 0)


def prefill_cap(s) -> int:
    """vLLM's `long_prefill_token_threshold` for this step (0: none): only with more than
    one request to schedule, floored at a fair share of the budget when adaptive."""
    thr = s.scheduler_config.long_prefill_token_threshold or 0
    n_running, n_waiting = s.get_request_counts()
    if n_running + n_waiting <= 1:
        return 0
    if thr > 0 and getattr(s, "adaptive_long_prefill_threshold", False):
        thr = max(thr, s.scheduler_config.max_num_batched_tokens // (n_running + n_waiting))
    return thr


def victim_refs(s, victims: list) -> dict[int, list]:
    """{id(block): [block, how many of `victims` hold it]}, over every KV cache group."""
    held: dict[int, list] = {}
    for v in victims:
        for blocks in s.kv_cache_manager.coordinator.get_blocks(v.id):
            for b in blocks:
                if not b.is_null:
                    held.setdefault(id(b), [b, 0])[1] += 1
    return held


def freed(refs: dict[int, list]) -> int:
    """Blocks that preempting all of the victims (`refs`: `victim_refs`) returns to the free
    pool: each block whose every holder is among them (a block shared through the prefix
    cache with a request that stays is not freed; one the victims share is freed once)."""
    return sum(1 for b, k in refs.values() if b.ref_cnt == k)
