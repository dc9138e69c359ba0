"""Automatic prefix caching in the simulator (sim/prefix_cache.py): hand-computed hits, the
LRU order of eviction, and invariants checked at every step of random shared-prefix runs."""

from collections import Counter

import pytest
from builders import StepChecks, linear_steps, make_engine, make_requests, run_engine
from hypothesis import given, settings
from hypothesis import strategies as st

from presched.sim import SimConfig, simulate
from presched.sim.prefix_cache import PrefixCacheError
from presched.workload.config import WorkloadConfig, build_workload
from presched.workload.prefix import with_hashes


def hashed(lengths, arrivals, tokens, block_tokens=2):
    """`make_requests` with each request's block hashes made from `tokens[i]` (token ids)."""
    reqs = make_requests(lengths, arrivals)
    return [with_hashes(r, t, block_tokens) for r, t in zip(reqs, tokens)]


def caching_engine(policy="fcfs", **engine):
    engine.setdefault("block_size", 2)
    return make_engine(policy, enable_prefix_caching=True, **engine)


class CacheChecks(StepChecks):
    """`StepChecks` (budget, exact blocks per request, batch shape, tokens fed) with the KV
    balance of a cache that shares blocks: free + the blocks in use (each request's private
    blocks and its copies of units it computed after someone else had cached them, plus every
    cached unit whose first copy anyone shares, once) = num_blocks; a cached run's reference
    count is the number of running requests holding it, and a request holds a path from the
    root (every ancestor of what it holds) covering exactly its first `cached_upto` units, its
    own keys (those of the tokens it has computed, or, right after a step is scheduled, will
    compute in it: vLLM caches blocks when it allocates them); `evictable` = the blocks of the
    runs whose first copy nobody shares, plus their spare free copies (own copies released)."""

    scheduled: dict = {}  # id(seq) -> tokens in the batch just scheduled (none after a step)

    def check_batch(self, batch, capped=True):
        self.scheduled = {id(s): n for s, n in zip(batch.seqs, batch.ntoks)}
        super().check_batch(batch, capped)
        self.scheduled = {}

    def check_balance(self):
        sched, kv = self.inst.sched, self.kv
        paths = {id(s): kv.path(s) for s in sched.running}
        held = Counter(id(n) for p in paths.values() for n in p)
        nodes = list(kv.nodes())
        for s in sched.running:
            parent, keys = kv.root, []
            for n in paths[id(s)]:
                assert n.parent is parent and n.parent.children[n.keys[0]] is n
                parent, keys = n, keys + n.keys
            assert keys == list(s.keys[: s.cached_upto])
            assert s.cached_upto * s.unit_tokens <= s.computed + self.scheduled.get(id(s), 0)
        def own(n, s):
            return n.dups is not None and s in n.dups

        def shared_copy(n):
            return n.ref > (len(n.dups) if n.dups else 0)

        private = sum(s.blocks - sum(n.blocks for n in paths[id(s)] if not own(n, s))
                      for s in sched.running)  # fmt: skip
        shared = sum(n.blocks for n in nodes if shared_copy(n))
        assert kv.free >= 0 and kv.free + private + shared == kv.num_blocks
        assert all(s.blocks == 0 and s.cache_node is None for s in sched.waiting)
        for n in nodes:
            assert n.keys and n.ref == held.get(id(n), 0), n.ref  # in use = referenced
            assert all(c.ref <= n.ref and c.parent is n for c in n.children.values())
            assert n.dups is None or len(set(map(id, n.dups))) == len(n.dups) <= n.ref
        assert kv.evictable == sum(n.blocks * (len(n.spares or ()) + (not shared_copy(n)))
                                   for n in nodes)  # fmt: skip
        self.peak_used = max(self.peak_used, private + shared)


def checked(inst, reqs):
    checks = CacheChecks(inst)
    seqs = run_engine(inst, reqs)
    for seq in seqs:  # tokens computed = what has to be, minus what the cache supplied
        fed = checks.fed.get(seq.id, 0)
        assert fed == seq.prompt_tokens + seq.target - 1 + seq.recomputed_tokens - seq.cached_tokens
        assert seq.generated == seq.target
    return seqs, checks


def test_a_prompt_sharing_k_full_blocks_gets_k_blocks_cached():
    # Blocks of 2. A: tokens 0..8 (9 tokens, 4 full blocks). B arrives after A finished and
    # shares tokens 0..4 (5 tokens: 2 full blocks and a partial one) then differs: 2 blocks hit
    # = 4 tokens; the shared partial block does not. B's first step computes 10 - 4 tokens.
    a = list(range(9))
    b = list(range(5)) + [100, 101, 102, 103, 104]
    reqs = hashed([(9, 2), (10, 2)], [0.0, 10.0], [a, b])
    inst = caching_engine()
    (ra, rb), checks = checked(inst, reqs)
    assert (ra.cached_tokens, rb.cached_tokens) == (0, 4)
    assert checks.fed["r1"] == 10 - 4 + 1
    kv = inst.sched.kv
    assert kv.hit_tokens == kv.prompt_hit_tokens == 4 and kv.queried_tokens == kv.prompt_tokens == 19


def test_an_identical_prompt_recomputes_its_last_block_and_a_partial_block_never_hits():
    # A and B: the same 8 tokens (4 full blocks). At least one token must be computed, so B hits
    # 3 blocks (6 tokens), as vLLM caps a hit at num_tokens - 1. C: the first 7 tokens: 3 full
    # blocks hit (6 tokens); its 7th token, in a partial block, is computed. D: the first 5
    # tokens and 2 others: only 2 blocks match (its 3rd block, tokens 4 and 9, is not A's).
    t = list(range(8))
    reqs = hashed([(8, 1), (8, 1), (7, 1), (7, 1)], [0.0, 5.0, 10.0, 15.0],
                  [t, t, t[:7], t[:5] + [9, 9]])  # fmt: skip
    (a, b, c, d), _ = checked(caching_engine(), reqs)
    assert (a.cached_tokens, b.cached_tokens, c.cached_tokens, d.cached_tokens) == (0, 6, 6, 4)


def test_a_hit_saves_prefill_time():
    # Prefill ~ 40 us per token (builders.linear_steps): a 4000-token prompt whose first 3968
    # tokens are cached reaches its first token ~0.16 s sooner than the first time.
    t = list(range(4000))
    reqs = hashed([(4000, 1), (4000, 1)], [0.0, 10.0], [t, t], block_tokens=16)
    inst = caching_engine(block_size=16, step_model=linear_steps())
    (a, b), _ = checked(inst, reqs)
    assert b.cached_tokens == 3984
    assert (a.first_token - a.arrival) - (b.first_token - b.arrival) > 0.15


def test_free_cached_blocks_are_evicted_least_recently_released_first():
    # 6 blocks of 2. A, B, C (4 tokens each, 1 output: 2 blocks) run one after the other and
    # leave 2 cached blocks each (6 blocks, all free and cached). A block taken now evicts A's
    # (the oldest) last unit first (vLLM frees in reverse order); D then evicts A's first.
    toks = [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12], [13, 14, 15, 16]]
    reqs = hashed([(4, 1)] * 4, [0.0, 10.0, 20.0, 30.0], toks)
    inst = caching_engine(num_blocks=6)
    kv = inst.sched.kv
    seqs, _ = checked(inst, reqs[:3])
    a, b, c = (s.keys for s in seqs)
    assert kv.cached_keys() == set(a + b + c) and kv.evictable == 6
    kv.take(seqs[0], 1)  # one block more than the uncached free ones (none): A's last unit goes
    assert kv.cached_keys() == {a[0]} | set(b + c) and kv.evicted_units == 1
    kv.release(seqs[0])
    # D needs 2 blocks: the uncached one A just freed, then A's first unit, the oldest
    (d,), _ = checked(inst, reqs[3:])
    assert kv.cached_keys() == set(b + c + d.keys) and kv.evicted_units == 2


def test_blocks_in_use_are_shared_and_never_evicted():
    # 7 blocks of 2. A (prefix P = 4 tokens + 2 own, 6 decodes) runs; B (P + 2 own) arrives
    # while A runs and shares P's 2 blocks (reference count 2). C (8 new tokens) must wait:
    # the shared blocks are not evictable while A and B hold them.
    p = [1, 2, 3, 4]
    reqs = hashed([(6, 6), (6, 2), (8, 1)], [0.0, 1.5, 2.5], [p + [5, 6], p + [7, 8], list(range(20, 28))])
    inst = caching_engine(num_blocks=7)
    (a, b, c), checks = checked(inst, reqs)
    assert b.cached_tokens == 4
    assert c.first_scheduled >= b.finish  # waited for blocks; nothing in use was evicted
    assert checks.peak_used <= 7


def test_a_preempted_request_recomputes_from_its_own_cached_blocks():
    # 3 blocks of 2 (test_golden's KV-pressure case with hashes): B is preempted after its
    # prompt and first token; its released blocks stay cached, so its recompute finds its
    # prompt block (2 tokens) in the cache (prompt + 1 generated = 3 tokens, hit capped at 2).
    reqs = hashed([(2, 3), (2, 3)], [0.0, 0.0], [[1, 2, 3, 4], [5, 6, 7, 8]])
    inst = caching_engine(num_blocks=3)
    (a, b), _ = checked(inst, reqs)
    assert b.preemptions == 1 and b.recomputed_tokens == 2 and b.cached_tokens == 2
    kv = inst.sched.kv  # the recompute's hit counts in vLLM's hit rate, not in the prompt's
    assert (kv.hit_tokens, kv.queried_tokens, kv.prompt_hit_tokens, kv.prompt_tokens) == (2, 7, 0, 4)


def test_hashes_coarser_or_finer_than_the_block_size():
    t = list(range(64))
    coarse = hashed([(64, 1), (64, 1)], [0.0, 10.0], [t, t], block_tokens=32)
    (a, b), _ = checked(caching_engine(block_size=16), coarse)
    assert b.cached_tokens == 32  # one unit of 2 blocks; the second would leave nothing
    fine = hashed([(64, 1), (64, 1)], [0.0, 10.0], [t, t[:40] + [99] * 24], block_tokens=8)
    (a, b), _ = checked(caching_engine(block_size=16), fine)
    assert b.cached_tokens == 32  # tokens 0..39 shared: 2 full blocks of 16
    with pytest.raises(PrefixCacheError, match=r"'hash_block_tokens' = 12 \(workload.shared_prefix.block_tokens"):
        run_engine(caching_engine(block_size=16), hashed([(64, 1)], [0.0], [t], block_tokens=12))


def test_caching_on_without_hashes_gives_todays_results():
    reqs = build_workload(WorkloadConfig(num_requests=400))
    engine = dict(num_blocks=2000, max_num_seqs=32)
    off = simulate(reqs, SimConfig(policy="srpt-oracle", engine=engine))
    on = simulate(reqs, SimConfig(policy="srpt-oracle", engine=dict(engine, enable_prefix_caching=True)))
    assert off.num_preemptions > 0
    for name in ("first_token", "finish", "preemptions", "recomputed_tokens"):
        assert (getattr(off.records, name) == getattr(on.records, name)).all(), name
    assert on.prefix_hit_rate == 0 and on.prefix_hit_tokens == 0


@st.composite
def shared_prefix_runs(draw):
    n = draw(st.integers(2, 9))
    prefixes = [list(range(100 * j, 100 * j + draw(st.integers(0, 12)))) for j in range(3)]
    lengths, arrivals, tokens = [], [], []
    t = 0.0
    for i in range(n):
        own = draw(st.integers(1, 8))
        toks = prefixes[draw(st.integers(0, 2))] + list(range(1000 * (i + 1), 1000 * (i + 1) + own))
        lengths.append((len(toks), draw(st.integers(1, 6))))
        t += draw(st.sampled_from([0.0, 0.5, 1.0, 3.0]))
        arrivals.append(t)
        tokens.append(toks)
    bs = draw(st.sampled_from([1, 2, 4]))
    most = max(p + o for p, o in lengths)
    engine = dict(num_blocks=-(-most // bs) + draw(st.integers(0, 12)), block_size=bs,
                  max_num_seqs=draw(st.integers(1, 4)),
                  max_num_batched_tokens=draw(st.integers(4, 16)))
    policy = draw(st.sampled_from(["fcfs", "sjf-oracle", "srpt-oracle"]))
    return lengths, arrivals, tokens, engine, policy


@settings(max_examples=150, deadline=None, derandomize=True)
@given(shared_prefix_runs())
def test_invariants_of_random_shared_prefix_runs(run):
    # every step: KV balance with shared blocks, reference counts = holders, nothing in use in
    # the LRU (CacheChecks); at the end: tokens fed = needed - cached, a hit never reaches the
    # prompt, every request done, and all blocks free again (cached or not); fast-forward exact
    lengths, arrivals, tokens, engine, policy = run
    bs = engine["block_size"]
    reqs = hashed(lengths, arrivals, tokens, block_tokens=bs)
    slow, _ = checked(caching_engine(policy, fast_forward=False, **engine), reqs)
    inst = caching_engine(policy, **engine)
    seqs, _ = checked(inst, reqs)
    for a, b in zip(seqs, slow):
        assert (a.first_token, a.finish, a.preemptions, a.cached_tokens) == pytest.approx(
            (b.first_token, b.finish, b.preemptions, b.cached_tokens))  # fmt: skip
    for s in seqs:
        assert s.cached_tokens <= (s.preemptions + 1) * (s.prompt_tokens + s.target - 1)
        if not s.preemptions:
            assert s.cached_tokens < s.prompt_tokens and s.cached_tokens % bs == 0
    kv = inst.sched.kv
    nodes = list(kv.nodes())
    assert kv.free == kv.num_blocks and kv.evictable == sum(n.blocks for n in nodes)
    assert all(n.ref == 0 for n in nodes)
    assert kv.hit_tokens == sum(s.cached_tokens for s in seqs) <= kv.queried_tokens


def test_caching_under_disaggregation_is_refused_naming_the_field():
    from presched.sim.config import DisaggConfig

    with pytest.raises(ValueError, match="engine.enable_prefix_caching"):
        SimConfig(disaggregated=DisaggConfig(), engine=dict(enable_prefix_caching=True))


def test_equal_hash_numbers_of_another_unit_size_are_not_a_hit_and_leak_nothing():
    """A generic file may hold small integer hashes of two granularities (32- and 16-token
    units on 16-token blocks): equal numbers name other tokens. Sharing one key space, b hit
    a's 2-block units as 1-block ones: its private blocks went to -3 and 3 blocks leaked."""
    from presched.sim.seq import Seq
    from presched.workload.request import Request

    reqs = [Request(id="a", prompt_tokens=96, output_tokens=3, arrival=0.0, block_hashes=(1, 2, 3), hash_block_tokens=32),
            Request(id="b", prompt_tokens=64, output_tokens=3, arrival=10.0, block_hashes=(1, 2, 3, 4), hash_block_tokens=16)]  # fmt: skip
    inst = make_engine("fcfs", num_blocks=20, block_size=16, enable_prefix_caching=True)
    seqs = [Seq(r, i) for i, r in enumerate(reqs)]
    for s in seqs:
        inst.advance(s.arrival)
        inst.add(s, s.arrival)
    inst.advance(float("inf"))
    kv = inst.sched.kv
    kv.settle()
    assert [s.cached_tokens for s in seqs] == [0, 0]
    assert kv.free == kv.num_blocks and kv.evictable == sum(n.blocks for n in kv.nodes()) == 10


def test_an_instance_of_never_tokens_or_more_is_refused():
    """`computed` must stay below `NEVER`, the sentinel `next_unit_end` (seq.py)."""
    from presched.sim.prefix_cache import CachingBlockManager
    from presched.sim.seq import NEVER

    CachingBlockManager((NEVER - 1) // 16, 16)
    with pytest.raises(ValueError, match="num_blocks \\* block_size"):
        CachingBlockManager(NEVER // 16 + 1, 16)
