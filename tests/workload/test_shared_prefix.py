"""Shared system prompts and multi-turn conversations (workload/shared_prefix.py)."""

from builders import make_requests
from hypothesis import given, settings
from hypothesis import strategies as st

from presched.workload.config import WorkloadConfig, build_workload
from presched.workload.prefix import chain_hashes
from presched.workload.shared_prefix import SharedPrefixConfig, _extend, add_shared_prefixes


def test_chain_hashes_name_the_whole_prefix_and_skip_the_partial_block():
    a = chain_hashes([1, 2, 3, 4, 5], 2)
    assert len(a) == 2 and a == chain_hashes([1, 2, 3, 4, 6], 2)
    assert chain_hashes([9, 2, 3, 4], 2)[1] != a[1]  # same block, different parent


def test_system_prompts_are_shared_only_between_requests_that_have_the_same_one():
    reqs = make_requests([(40, 5)] * 30, [float(i) for i in range(30)])
    cfg = SharedPrefixConfig(system_prompts=3, system_prompt_tokens=100, block_tokens=16)
    out = add_shared_prefixes(reqs, cfg, seed=1)
    assert all(r.prompt_tokens == 140 and r.hash_block_tokens == 16 for r in out)
    assert all(len(r.block_hashes) == (140 + 5) // 16 for r in out)
    by = {}
    for r in out:
        by.setdefault(r.metadata["system_prompt"], []).append(r)
    assert len(by) > 1
    for j, group in by.items():  # 100 shared tokens = 6 full blocks, then the own message
        assert len({r.block_hashes[:6] for r in group}) == 1
        assert len({r.block_hashes[6] for r in group}) == len(group)
    firsts = {group[0].block_hashes[0] for group in by.values()}
    assert len(firsts) == len(by)


def test_a_later_turn_starts_with_the_whole_earlier_turn_prompt_and_answer():
    reqs = make_requests([(20 + i, 7) for i in range(60)], [float(i) for i in range(60)])
    out = add_shared_prefixes(reqs, SharedPrefixConfig(mean_turns=4, block_tokens=4), seed=0)
    convs = {}
    for r, orig in zip(out, reqs):
        convs.setdefault(r.metadata["conversation"], []).append((r, orig))
    multi = [c for c in convs.values() if len(c) > 1]
    assert multi and max(len(c) for c in multi) >= 3
    for c in multi:
        for (prev, _), (cur, orig) in zip(c, c[1:]):
            assert cur.metadata["turn"] == prev.metadata["turn"] + 1
            assert cur.prompt_tokens == prev.prompt_tokens + prev.output_tokens + orig.prompt_tokens
            shared = (prev.prompt_tokens + prev.output_tokens) // 4
            assert cur.block_hashes[:shared] == prev.block_hashes[:shared]



@settings(max_examples=200, deadline=None, derandomize=True)
@given(tokens=st.lists(st.integers(0, 5), max_size=60), cut=st.integers(0, 60), bt=st.integers(1, 7))
def test_extending_a_prefix_hashes_as_hashing_from_scratch_and_shares_its_keys(tokens, cut, bt):
    cut = min(cut, len(tokens))
    shared = chain_hashes(tokens[:cut], bt)
    got = _extend(shared, cut, tokens, bt)
    assert got == chain_hashes(tokens, bt)
    assert all(x is y for x, y in zip(got, shared))  # the same int objects, not equal copies


def test_requests_with_one_system_prompt_hold_the_same_key_objects():
    reqs = make_requests([(40, 5)] * 20, [float(i) for i in range(20)])
    out = add_shared_prefixes(reqs, SharedPrefixConfig(system_prompts=2, system_prompt_tokens=64,
                                                      block_tokens=16), seed=3)  # fmt: skip
    for j in (0, 1):
        group = [r for r in out if r.metadata["system_prompt"] == j]
        assert len(group) > 1
        assert all(r.block_hashes[k] is group[0].block_hashes[k] for r in group for k in range(4))

def test_unset_leaves_the_workload_as_it_was_and_set_is_seeded():
    plain = build_workload(WorkloadConfig(num_requests=50))
    assert all(r.block_hashes == () for r in plain)
    cfg = WorkloadConfig(num_requests=50, shared_prefix=dict(system_prompts=4, mean_turns=2))
    a, b = build_workload(cfg), build_workload(cfg)
    assert a == b and all(r.block_hashes for r in a)
    assert [r.arrival for r in a] == [r.arrival for r in plain]


def test_hash_prompts_hashes_text_like_the_gateway_and_skips_requests_without_text():
    from presched.serve.tokens import encoder, prompt_hashes
    from presched.workload.prefix import hash_prompts
    from presched.workload.request import Request

    text = "You are a careful assistant. " * 20
    encode, _ = encoder(None)
    pa, pb = text + "Question A, in detail? " * 9, text + "Another one, B, at length? " * 9
    reqs = [Request(id="a", prompt_tokens=len(encode(pa)), prompt=pa),
            Request(id="b", prompt_tokens=len(encode(pb)), prompt=pb),
            Request(id="c", prompt_tokens=100),
            Request(id="d", prompt_tokens=40, prompt=pa)]  # fmt: skip
    a, b, c, d = hash_prompts(reqs)
    assert a.block_hashes == prompt_hashes(encode(a.prompt), 16) and a.hash_block_tokens == 16
    shared = sum(x == y for x, y in zip(a.block_hashes, b.block_hashes))
    assert shared >= len(encode(text)) // 16 - 1 and a.block_hashes != b.block_hashes
    assert c == reqs[2]
    # a trace that counts 40 prompt tokens gets the hashes of 40 tokens: 2 blocks, not 10 (the
    # rest would name its output blocks by prompt text)
    assert d.block_hashes == a.block_hashes[:2] and len(a.block_hashes) == 10


def test_only_requests_with_the_same_system_prompt_share_a_first_block():
    """System prompt j's token ids once were (j+1) << 32 + k, and request contents start at
    1 << 40: from j = 255 on the two met, and a request without a system prompt shared its
    first blocks with every request of system prompt 255."""
    from presched.workload.request import Request
    from presched.workload.shared_prefix import SharedPrefixConfig, add_shared_prefixes

    reqs = [Request(id=f"r{i}", prompt_tokens=64, output_tokens=8, arrival=float(i)) for i in range(3000)]
    cfg = SharedPrefixConfig(system_prompts=300, popularity=0.0, system_prompt_share=0.5,
                             system_prompt_tokens=64, block_tokens=16)  # fmt: skip
    out = add_shared_prefixes(reqs, cfg, seed=1)
    first: dict[int, set] = {}
    for r in out:
        first.setdefault(r.block_hashes[0], set()).add(r.metadata["system_prompt"])
    shared = [s for s in first.values() if len(s) > 1]
    assert shared == []  # no first block is shared across system prompts (or with none)
    assert len({r.metadata["system_prompt"] for r in out}) > 256  # prompts 255+ were drawn
