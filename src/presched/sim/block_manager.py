"""Paged KV cache accounting: `num_blocks` blocks of `block_size` tokens.

A request holding KV for `n` tokens owns ceil(n / block_size) blocks; blocks are allocated as a
step is scheduled (for the tokens that step computes) and all freed at finish or preemption.
The simulator only needs counts, not block ids; prefix caching (`prefix_cache.py`,
`CachingBlockManager`) adds cached units shared by reference count on top of these counts.
Invariant: 0 <= free <= num_blocks at all times, and free + the blocks every request holds =
num_blocks.

A hybrid attention / Mamba model's requests also hold `state_blocks` blocks each for their
recurrent state while they run (vLLM's hybrid KV-cache manager: one block per Mamba layer group,
see steptime/hybrid.py), kept apart from `seq.blocks`: the scheduler takes them at admission
(`hold_state`) and gives them back after the request's `release` (`drop_state`). Then free +
the blocks every request holds + state_blocks * running requests = num_blocks.

`blocks_for` is the one place that rounds tokens up to blocks (as nano-vllm's BlockManager owns
its rounding; `grow` is its batch form for a decode run): the scheduler and the fast-forward path
both ask it, so the two modes cannot disagree on a request's footprint. The one exception is a
decode run's loop (instance.py `_apply_run`), which writes the same `(n + block_size - 1) //
block_size` inline and reports the sum with `took`: a call per request that crosses a block cost
4 % of the headline run's instructions.
"""

from __future__ import annotations

from presched.sim.seq import Seq


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.free = num_blocks
        self.peak_used = 0
        self.state_blocks = 0  # per running request (set by the scheduler for hybrid models)

    @property
    def used(self) -> int:
        return self.num_blocks - self.free

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks that hold KV for `num_tokens` tokens: ceil(num_tokens / block_size)."""
        return (num_tokens + self.block_size - 1) // self.block_size

    def take(self, seq: Seq, extra: int) -> None:
        """Give `seq` `extra` more blocks (the caller has checked `extra <= free`)."""
        seq.blocks += extra
        self.free -= extra
        used = self.num_blocks - self.free
        if used > self.peak_used:
            self.peak_used = used

    def took(self, extra: int) -> None:
        """`extra` more blocks are in use: the caller raised requests' `blocks` by that many
        (a decode run's loop, instance.py; it has checked that they fit)."""
        self.free -= extra
        used = self.num_blocks - self.free
        if used > self.peak_used:
            self.peak_used = used

    def grow(self, seqs: list[Seq], k: int) -> None:
        """Give every request in `seqs` the blocks for `k` tokens past its computed ones (a
        decode run's; the caller has checked that they fit): `take` of each one's missing
        `blocks_for(computed + k) - blocks`, in one call."""
        bs, free = self.block_size, self.free
        up = k + bs - 1  # blocks_for(computed + k) = (computed + up) // bs
        for seq in seqs:
            blocks = (seq.computed + up) // bs
            if blocks > seq.blocks:
                free -= blocks - seq.blocks
                seq.blocks = blocks
        self.free = free
        used = self.num_blocks - free
        if used > self.peak_used:
            self.peak_used = used

    def hold_state(self) -> None:
        """A request starts running: take its `state_blocks` (the caller has checked they fit)."""
        self.free -= self.state_blocks
        used = self.num_blocks - self.free
        if used > self.peak_used:
            self.peak_used = used

    def drop_state(self) -> None:
        """A running request leaves (after its `release`): give back its `state_blocks`."""
        self.free += self.state_blocks

    def release(self, seq: Seq) -> None:
        self.free += seq.blocks
        seq.blocks = 0
