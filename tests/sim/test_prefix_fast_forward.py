"""Fast-forwarded decode runs with prefix caching on give what stepping one at a time gives
(instance.py `_cache_limit`): two cases that once differed, and random runs wider than
test_prefix_cache.py's (units of several blocks, hashes over the answers, repeated prompts, a
long-prefill threshold)."""

import pytest
from builders import make_engine, make_requests, run_engine
from hypothesis import given, settings
from hypothesis import strategies as st

from presched.workload.prefix import with_hashes


def outcome(seqs):
    return [(s.id, s.first_token, s.finish, s.preemptions, s.cached_tokens) for s in seqs]


def both(make, **engine):
    """(step by step, fast-forwarded): outcomes and evicted units."""
    out = []
    for ff in (False, True):
        inst = make_engine("fcfs", enable_prefix_caching=True, fast_forward=ff, **engine)
        seqs = run_engine(inst, make())
        out.append((outcome(seqs), inst.sched.kv.evicted_units))
    return out


def test_an_evicted_coarse_unit_lets_a_waiting_request_start_mid_run():
    # Blocks of 2, units of 2 blocks (4-token hashes), 6 blocks. r1 waits behind r0 (the
    # long-prefill threshold of 2 tokens caps its chunks); r0's decode take evicts one block
    # owed, which drops a whole unit of r1's cached prompt: its hit and the blocks it must
    # revive shrink by 2 while the free pool shrinks by 1, so step by step r1 starts at once,
    # mid-run, and finishes at 12 (a run that ignored it finished it at 13). Since 2026-12-07
    # (night) admission needs the whole sequence's blocks (vLLM's scheduler_reserve_full_isl),
    # which an evicted unit of the hit does not lower (the hit shrinks as the revive does): r1
    # now finishes at 11 in both modes, and the `_cache_limit` stop is no longer what keeps them
    # equal here (checked: equal with that stop off). Kept as an equality case.
    def make():
        reqs = make_requests([(4, 6), (4, 4)], [2.0, 2.0])
        return [with_hashes(r, list(range(1000 * (i + 1), 1000 * (i + 1) + 4)), 4) for i, r in enumerate(reqs)]

    slow, fast = both(make, num_blocks=6, block_size=2, max_num_batched_tokens=6, long_prefill_token_threshold=2)
    assert fast == slow
    assert slow[0][1][2] == pytest.approx(11.0)


@pytest.mark.parametrize("num_blocks", range(20, 28))
def test_a_reply_unit_cached_by_another_request_is_kept_twice(num_blocks):
    # Blocks of 1, a unit per block. C's 6-token prompt stays cached after it finishes. A's
    # hashes cover its prompt P and its reply R; B (prompt P + R) has cached R already. Each of
    # A's decode steps completes a unit of R that B holds. Until 2026-12-08 A shared it and
    # returned its own block before the next step's take (and a run that took all its steps'
    # blocks first evicted up to 3 more of C's units); now A keeps the block it computed the
    # unit in, as vLLM does (it never de-duplicates a block table), and, A done, that copy
    # stays cached (a spare copy, newer than C's units): D (C's prompt again) finds 6 fewer of
    # C's units. Kept as an equality case.
    P, R, C = [1, 2, 3, 4], [11, 12, 13, 14, 15, 16], list(range(100, 106))

    def make():
        reqs = make_requests([(6, 1), (4, 7), (10, 10), (6, 1)], [0.0, 2.0, 2.0, 12.5])
        return [with_hashes(r, t, 1) for r, t in zip(reqs, [C, P + R, P + R, C])]

    slow, fast = both(make, num_blocks=num_blocks, block_size=1)
    assert fast == slow
    d_cached = slow[0][3][4]
    assert d_cached == max(0, min(num_blocks - 25, 5))


def test_a_run_stops_where_a_request_copies_a_unit_whose_first_copy_is_free():
    # Blocks of 1, a unit per block, 15 blocks. C's prompt, then B's (P + R) are cached and
    # free; A (prompt P, reply R) decodes R, completing units cached already whose first copy
    # is free: it keeps copies of its own. Step by step, a later take that evicts such a free
    # copy leaves the unit cached (A's copy takes its place): 8 units evicted. A run that took
    # all its steps' blocks before A's inserts evicted those units outright (9).
    P, R, C = [1, 2, 3, 4], [11, 12, 13, 14, 15, 16], list(range(100, 106))

    def make():
        reqs = make_requests([(6, 1), (10, 1), (4, 7), (10, 1)], [0.0, 2.0, 3.0, 20.0])
        return [with_hashes(r, t, 1) for r, t in zip(reqs, [C, P + R, P + R, P + R])]

    slow, fast = both(make, num_blocks=15, block_size=1)
    assert fast == slow
    assert slow[1] == 8


def test_twins_keep_a_copy_each_of_every_answer_unit():
    # r0 and r1: the same prompt and answer (hashes over both), admitted together (r1 hits
    # the prompt blocks r0 was given in that step); every decode step completes the same new
    # unit for both: r0 caches it, r1 keeps its own copy (vLLM never de-duplicates). r2 (1
    # token, waiting from 0.5) reads blocks at its admission. Until 2026-12-08 r1 returned its
    # copy in that step and nothing was evicted (a run that returned them only at its end
    # evicted a unit); now the copies are held and one unit is evicted, either way.
    P, R = [1, 2, 3, 4], list(range(11, 21))

    def make():
        reqs = make_requests([(4, 10), (4, 10), (1, 3)], [0.0, 0.0, 0.5])
        return [with_hashes(r, t, 1) for r, t in zip(reqs, [P + R, P + R, [200]])]

    slow, fast = both(make, num_blocks=15, block_size=1, max_num_seqs=3)
    assert fast == slow
    assert slow[1] == 1


@pytest.mark.parametrize("block_size, num_blocks, arrival", [(1, 14, 2.0), (2, 7, 1.0)])
def test_a_later_turn_starts_mid_run_as_the_earlier_turn_caches_its_answer(
    block_size, num_blocks, arrival
):
    # Hashes of 2 tokens over prompt and answer: units of 2 blocks of 1, or one block of 2.
    # turn2 = turn1's prompt + answer + 1 token arrives while turn1 decodes and does not fit
    # yet; each unit turn1 caches lengthens turn2's hit, so step by step turn2 starts mid-run.
    # A fast-forwarded run started it after turn1 ended (8): with units of 2 blocks until
    # 2026-12-07 (the run did not stop where turn1 completes a unit), with one-block units
    # until 2026-12-08 (the run was not checked at all: turn1 owns its leaf, nobody preempts).
    # Since units are cached when a step is scheduled (vLLM's allocate_slots), turn2 hits the
    # unit turn1's step completes in that same step: it starts at 2 (first token at 3), not 3.
    from presched.workload.request import Request
    from presched.workload.prefix import chain_hashes

    P, A, Q = list(range(100, 104)), list(range(500, 508)), [900]

    def make():
        return [Request(id="turn1", prompt_tokens=4, output_tokens=8, arrival=0.0,
                        block_hashes=chain_hashes(P + A, 2), hash_block_tokens=2),
                Request(id="turn2", prompt_tokens=13, output_tokens=2, arrival=arrival,
                        block_hashes=chain_hashes(P + A + Q, 2), hash_block_tokens=2)]  # fmt: skip

    slow, fast = both(make, num_blocks=num_blocks, block_size=block_size)
    assert fast == slow
    assert slow[0][1][1] == pytest.approx(3.0)  # turn2's first token


def test_a_preempting_policy_with_a_chunk_cap_sees_the_evictions_of_a_run():
    # One-block units, a 5-token chunk cap and mlfq preempting for the head: an evicted block
    # of the head's hit takes one block off what its capped chunk needs, and a victim's blocks
    # grow each decode step, so the head can start (by preemption) mid-run. r2 was preempted
    # once and finished at 20 step by step; a fast-forwarded run did neither (11). With the
    # whole-sequence admission of 2026-12-07 (night) it is preempted once and finishes at
    # 13.013 in both modes, equal with or without that stop: kept as an equality case.
    from presched.schedule import POLICIES
    from presched.workload.request import Request
    from presched.workload.prefix import chain_hashes

    A, B = list(range(100, 132)), list(range(200, 232))

    def req(i, prefix, own, out, arr, ans=0):
        toks = prefix + list(range(1000 * (i + 1), 1000 * (i + 1) + own)) + list(range(5000 + 100 * i, 5000 + 100 * i + ans))
        return Request(id=f"r{i}", prompt_tokens=len(prefix) + own, output_tokens=out, arrival=arr,
                       block_hashes=chain_hashes(toks, 2), hash_block_tokens=2)  # fmt: skip

    out = []
    for ff in (False, True):
        pol = POLICIES.create("mlfq", preempt=True, base_quantum=2.0, recompute_weight=0.0, prompt_weight=0.1)
        inst = make_engine(pol, num_blocks=33, block_size=2, max_num_seqs=2, max_num_batched_tokens=10,
                           long_prefill_token_threshold=5, enable_prefix_caching=True, fast_forward=ff)  # fmt: skip
        reqs = [req(0, A, 12, 1, 0.013), req(2, B, 2, 4, 0.513, ans=10), req(3, B, 7, 3, 0.513), req(8, A, 8, 1, 7.513)]
        out.append(outcome(run_engine(inst, reqs)))
    slow, fast = out
    for a, b in zip(fast, slow):
        assert a == pytest.approx(b)
    r2 = next(o for o in slow if o[0] == "r2")
    assert r2[3] == 1 and r2[2] == pytest.approx(13.013)


@st.composite
def runs(draw):
    n = draw(st.integers(2, 9))
    bs = draw(st.sampled_from([1, 2, 4]))
    units = draw(st.sampled_from([1, 2, 3]))  # blocks per cached unit
    prefixes = [list(range(100 * j, 100 * j + draw(st.integers(0, 16)))) for j in range(3)]
    lengths, arrivals, tokens, t = [], [], [], 0.0
    for i in range(n):
        out = draw(st.integers(1, 8))
        if i and draw(st.integers(0, 4)) == 0:  # the same prompt (and answer hashes) again
            j = draw(st.integers(0, i - 1))
            lengths.append(lengths[j])
            tokens.append(tokens[j])
        else:
            own = draw(st.integers(1, 10))
            toks = prefixes[draw(st.integers(0, 2))] + list(range(1000 * (i + 1), 1000 * (i + 1) + own))
            lengths.append((len(toks), out))
            if draw(st.booleans()):  # hashes over the answer too (a later turn's prefix)
                toks = toks + [5000 + 10 * i + k for k in range(out)]
            tokens.append(toks)
        t += draw(st.sampled_from([0.0, 0.5, 1.0, 3.0]))
        arrivals.append(t)
    most = max(p + o for p, o in lengths)
    engine = dict(num_blocks=-(-most // bs) + units + draw(st.integers(0, 12)), block_size=bs,
                  max_num_seqs=draw(st.integers(1, 4)), max_num_batched_tokens=draw(st.integers(4, 16)),
                  long_prefill_token_threshold=draw(st.sampled_from([0, 3, 5])))  # fmt: skip
    policy = draw(st.sampled_from(["fcfs", "sjf-oracle", "srpt-oracle", "mlfq"]))
    return lengths, arrivals, tokens, bs * units, engine, policy


@settings(max_examples=200, deadline=None, derandomize=True)
@given(runs())
def test_fast_forward_equals_step_by_step_with_caching(run):
    lengths, arrivals, tokens, block_tokens, engine, policy = run
    res = []
    for ff in (False, True):
        reqs = [with_hashes(r, t, block_tokens) for r, t in zip(make_requests(lengths, arrivals), tokens)]
        inst = make_engine(policy, enable_prefix_caching=True, fast_forward=ff, **engine)
        res.append((outcome(run_engine(inst, reqs)), inst.sched.kv.evicted_units))
        assert not inst.sched.kv.open  # nobody holds blocks when all is done
    slow, fast = res
    assert fast[1] == slow[1]
    for a, b in zip(fast[0], slow[0]):
        assert a == pytest.approx(b)
