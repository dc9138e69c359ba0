"""Block accounting (sim/block_manager.py): `grow`, a decode run's blocks in one call, is a
`take` of `blocks_for(computed + k) - blocks` per request."""

from hypothesis import given, settings
from hypothesis import strategies as st

from presched.sim.block_manager import BlockManager
from presched.sim.seq import Seq
from presched.workload.request import Request


def seqs_at(states):
    out = []
    for i, (computed, _) in enumerate(states):
        seq = Seq(Request(id=str(i), prompt_tokens=max(computed, 1), output_tokens=1), i)
        seq.computed = computed
        out.append(seq)
    return out, [spare for _, spare in states]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(states=st.lists(st.tuples(st.integers(0, 200), st.integers(0, 2)), min_size=1, max_size=8),
       k=st.integers(1, 40), block_size=st.sampled_from([1, 4, 16]))
def test_grow_is_a_take_of_the_missing_blocks_per_request(states, k, block_size):
    results = []
    for batch in (True, False):
        kv = BlockManager(10_000, block_size)
        seqs, spare = seqs_at(states)
        for seq, s in zip(seqs, spare):  # each holds its computed tokens' blocks, some spare
            kv.take(seq, kv.blocks_for(seq.computed) + s)
        kv.peak_used = 0
        if batch:
            kv.grow(seqs, k)
        else:
            for seq in seqs:
                kv.take(seq, max(0, kv.blocks_for(seq.computed + k) - seq.blocks))
        results.append(([seq.blocks for seq in seqs], kv.free, kv.peak_used))
        assert all(seq.blocks * block_size >= seq.computed + k for seq in seqs)
    assert results[0] == results[1]
