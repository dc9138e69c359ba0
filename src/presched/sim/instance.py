"""One simulated engine instance: runs scheduler steps on a virtual clock.

A request leaves the instance when it has generated `seq.stop` tokens: its true length, or 1 on
a prefill instance of a disaggregated cluster (disagg.py).

`advance(until)` executes every step that starts before `until` (a step is atomic: a request
that arrives mid-step joins at the next step, as in a real engine). Steps that only decode, while
the batch cannot change, are fast-forwarded: with B requests decoding and total context C, the
j-th next step lasts t0 + s*B*j (the step model's `decode_line`), so k steps take
k*t0 + s*B*k(k-1)/2 and the run length k is the largest that

- ends no later than the first completion (min remaining tokens over the batch),
- starts its last step before `until` (next arrival), the policy's `wakeup` and the queue's next
  re-key time (`rekey_at`),
- keeps every request's KV blocks allocatable (otherwise the next step preempts, one at a time),
- stays inside the step model's exact-line range,
- with prefix caching, stops where a unit cached or evicted mid-run could change what follows
  (`_cache_limit`).

The batch cannot change during such a run: no arrival reaches this instance, nothing completes,
and a waiting request that could not start at the first step (no slot, no KV, no budget) cannot
start later either, as those only get scarcer while decoding (with prefix caching, up to the
point `_cache_limit` stops at).

Lazy runs (`lazy=True`): a run is planned up to its natural end (first completion, KV, wakeup)
and kept pending instead of being cut at `until`; it is applied when time passes its end, or
truncated to the steps that start before an arrival when a request is added here. Arrivals routed
to other instances then no longer cut it. Results are identical; the cluster turns this off when
its router reads request progress (`Router.needs_progress`), which a pending run does not show.
"""

from __future__ import annotations

import math

from presched.schedule.interface import EngineInfo, Policy
from presched.sim.config import EngineConfig
from presched.sim.itl import ItlLog
from presched.sim.scheduler import Scheduler
from presched.sim.seq import FINISHED, Seq
from presched.sim.steptime.base import StepTimeModel


TIE = 1e-9
"""Seconds within which a step start counts as AT a time (an arrival, a wakeup), not before it.
Step-by-step runs sum step durations one by one, fast-forwarded runs multiply them out, and a
trace's arrival is a third sum: equal times can differ by rounding, and without this tolerance
the two modes could put an arrival on different sides of the same step."""


class Instance:
    def __init__(
        self, index: int, cfg: EngineConfig, num_blocks: int, policy: Policy,
        step_model: StepTimeModel, fast_forward: bool = True, lazy: bool = True,
    ) -> None:  # fmt: skip
        self.index = index
        policy.attach(EngineInfo(
            kv_tokens=num_blocks * cfg.block_size, block_size=cfg.block_size,
            max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=cfg.max_num_batched_tokens,
            step_model=step_model,
        ))  # fmt: skip
        self.sched = Scheduler(cfg, num_blocks, policy)
        self.policy = policy
        self.step_model = step_model
        self.fast_forward = fast_forward
        self.lazy = lazy
        self._pending: tuple | None = None  # planned decode run: (start, k, t0, s, seqs, C, S(k-1))
        self.clock = 0.0
        self.itl = ItlLog()
        self.finished: list[Seq] = []
        self.num_steps = 0
        self.num_runs = 0  # fast-forwarded runs (each counts its steps in num_steps too)
        self.busy_time = 0.0
        self._tokens_hook = type(policy).on_tokens is not Policy.on_tokens
        self._wakeup_hook = type(policy).wakeup is not Policy.wakeup

    # --- what routers see -------------------------------------------------------------
    @property
    def num_waiting(self) -> int:
        return len(self.sched.waiting)

    @property
    def num_running(self) -> int:
        return len(self.sched.running)

    @property
    def num_outstanding(self) -> int:
        return len(self.sched.waiting) + len(self.sched.running)

    def outstanding(self):
        """Requests assigned here and not finished (running first, then waiting)."""
        yield from self.sched.running
        yield from self.sched.waiting

    @property
    def kv_free_fraction(self) -> float:
        kv = self.sched.kv
        return kv.free / kv.num_blocks

    # --- driving ------------------------------------------------------------------------
    def add(self, seq: Seq, now: float) -> None:
        run = self._pending
        if run is not None:  # the run stops at the first step that starts at or after `now`
            self._pending = None
            start, k, t0, s, seqs, C, _ = run
            j = _steps_starting_before(now - start, t0, s)
            self._apply_run(start, j if j < k else k, t0, s, seqs, C)
        if not self.sched.has_work() and self.clock < now:
            self.clock = now  # idle engine: time jumps to the arrival
        seq.instance = self.index
        self.sched.add(seq, now)

    def advance(self, until: float) -> None:
        """Run all steps that start before `until` (a lazy run may stay pending past it)."""
        sched = self.sched
        while True:
            run = self._pending
            if run is not None:
                start, k, t0, s, seqs, C, last_start = run
                if until - start - TIE <= last_start:  # its last step starts at/after `until`
                    return  # still pending: steps after `until` only matter if nothing arrives
                self._pending = None
                self._apply_run(start, k, t0, s, seqs, C)
                continue
            if self.clock >= until - TIE or not (sched.running or sched.waiting):
                return
            self._step(until)

    def _step(self, until: float) -> None:
        now = self.clock
        batch = self.sched.schedule(now)
        seqs, ntoks = batch.seqs, batch.ntoks
        if not seqs:
            if batch.changed:  # everything it tried to run was preempted: an empty step, as in
                return  # vLLM; no time passes and the next step starts from the new state
            raise RuntimeError(f"instance {self.index}: scheduler made no progress at t={now}")
        P, B, C = batch.prefill_tokens, batch.num_decode, batch.decode_context
        ff = self.fast_forward and not P and not batch.changed
        if ff and len(seqs) == len(self.sched.running):
            self._run_decodes(seqs, B, C, now, until, batch.left)
            return
        dur = self.step_model.step_time(P, batch.prefill_pairs, batch.prefill_context, B, C)
        end = now + dur
        self.num_steps += 1
        self.busy_time += dur
        self.clock = end
        contiguous = 0
        caching, bs = self.sched.caching, self.sched.kv.block_size
        # if every running request takes part and each samples a token, phase A of the next
        # step is known (`Scheduler.decode_next`): their context, those whose next token starts
        # a block
        known = not batch.partial and len(seqs) == len(self.sched.running)
        context, needy, left = 0, [], math.inf
        hook = self._tokens_hook
        for seq, n in zip(seqs, ntoks):
            c = seq.computed + n
            seq.computed = c
            if caching and c >= seq.next_unit_end:
                self.sched.kv.insert(seq)
            if c == seq.prompt_tokens + seq.generated:  # the step sampled a token
                g = seq.generated + 1
                seq.generated = g
                last = seq.last_token
                if last is None:
                    seq.first_token = end
                elif last == now:
                    contiguous += 1
                    if dur > seq.max_itl:
                        seq.max_itl = dur
                else:
                    gap = end - last
                    self.itl.add(gap, 0.0, 1, 1)
                    if gap > seq.max_itl:
                        seq.max_itl = gap
                seq.last_token = end
                if hook:
                    self.policy.on_tokens(seq, 1, end)
                r = seq.stop - g  # tokens it has left to generate
                if r <= 0:
                    self._finish(seq, end)
                elif known:
                    context += c + 1
                    if c == seq.blocks * bs:
                        needy.append(seq)
                    if r < left:
                        left = r
        if contiguous:
            self.itl.add(dur, 0.0, 1, contiguous)
        if known and self.sched.running:
            self.sched.decode_next = (context, needy, left)

    def _run_decodes(
        self, seqs: list[Seq], B: int, C: int, now: float, until: float, left: int | None
    ) -> None:  # fmt: skip
        t0, slope, valid = self.step_model.decode_line(B, C)
        s = slope * B  # each step is s seconds longer than the previous one
        k = left if left is not None else min([seq.stop - seq.generated for seq in seqs])
        if valid != math.inf:
            k = min(k, int((valid - C) // B) + 1)
        limit = math.inf if self.lazy else until
        if self._wakeup_hook:
            w = self.policy.wakeup(now)
            if w is not None and now < w < limit:
                limit = w
        if self.sched.waiting:
            w = self.sched.waiting.next_rekey()
            if now < w < limit:
                limit = w
        if limit != math.inf and k > 1:
            k = min(k, _steps_starting_before(limit - now, t0, s))
        if k > 1:
            kv = self.sched.kv
            if B * kv.blocks_for(k - 1) > kv.free:  # an upper bound of the blocks k steps take
                k = _kv_limit(seqs, k, kv.blocks_for, kv.free)
            if k > 1 and self.sched.caching and (kv.open or self.sched.waiting):  # (else nothing to stop at)
                k = _cache_limit(seqs, k, self.sched)
        if self.lazy and k > 1:  # last_start: S(k-1), the offset at which its last step starts
            self._pending = (now, k, t0, s, seqs, C, (k - 1) * t0 + s * (k - 1) * (k - 2) / 2)
        else:
            self._apply_run(now, k, t0, s, seqs, C)

    def _apply_run(self, now: float, k: int, t0: float, s: float, seqs: list[Seq], C: int) -> None:
        """Apply the first k steps of a decode run that started at `now` with context C; then
        tell the scheduler what phase A of the next step is (`Scheduler.decode_next`)."""
        B = len(seqs)
        total = k * t0 + s * k * (k - 1) / 2
        end = now + total
        self.num_steps += k
        self.num_runs += 1
        self.busy_time += total
        self.clock = end
        kv = self.sched.kv
        bs = kv.block_size
        contiguous = B  # those that ran the step before (less the others, below)
        max_step = t0 + s * (k - 1)
        longest = max_step if max_step > t0 else t0  # longest gap of one that ran the last step
        caching, hook = self.sched.caching, self._tokens_hook
        # The loop counts the blocks it gives out (`taken`, the arithmetic of `kv.blocks_for`
        # without a call per request) and hands them to `kv` before anyone's release. With
        # caching, every step's blocks are taken before anyone finishes, as step by step (a
        # release must not spare an eviction the steps would have made): `grow` takes them first
        # when the loop may insert a unit (`kv.open`) or call a policy hook; else the finishes
        # wait for the loop's end (`done`: nothing else in the loop reads what a release changes).
        ahead = caching and (hook or bool(kv.open))
        if ahead:
            kv.grow(seqs, k)
        done: list[Seq] | None = [] if caching and not ahead else None
        taken = 0
        context = C + k * B  # the survivors' next decode step: their context, those that
        needy, left = [], math.inf  # need a block for it, the fewest tokens one has left
        for seq in seqs:
            c = seq.computed + k
            seq.computed = c
            if c > seq.blocks * bs:  # past the blocks it holds (never after `grow`)
                blocks = (c + bs - 1) // bs
                taken += blocks - seq.blocks
                seq.blocks = blocks
            if ahead and c >= seq.next_unit_end:  # (only `open` requests can: others' is NEVER)
                kv.insert(seq)
            g = seq.generated + k
            seq.generated = g
            last = seq.last_token
            if last != now:  # it did not run the step before
                contiguous -= 1
                gap = now + t0 - last
                self.itl.add(gap, 0.0, 1, 1)
                m = gap if gap > max_step else max_step
                if m > seq.max_itl:
                    seq.max_itl = m
            elif longest > seq.max_itl:
                seq.max_itl = longest
            seq.last_token = end
            if hook:
                self.policy.on_tokens(seq, k, end)
            r = seq.stop - g  # tokens it has left to generate
            if r <= 0:
                if done is None:
                    if taken:
                        kv.took(taken)
                        taken = 0
                    self._finish(seq, end)
                else:
                    done.append(seq)
                context -= c + 1
            else:
                if c == seq.blocks * bs:  # its next token starts a block
                    needy.append(seq)
                if r < left:
                    left = r
        if taken:
            kv.took(taken)
        if done:
            for seq in done:
                self._finish(seq, end)
        if contiguous:
            self.itl.add(t0, 0.0, 1, contiguous)
        if k > 1:
            self.itl.add(t0 + s, s, k - 1, B)
        if self.sched.running:
            self.sched.decode_next = (context, needy, left)

    def _finish(self, seq: Seq, now: float) -> None:
        seq.finish = now
        seq.status = FINISHED
        self.sched.finish(seq)
        self.policy.on_finish(seq, now)
        self.finished.append(seq)


def _steps_starting_before(R: float, t0: float, s: float) -> int:
    """Number of steps (>= 1) of durations t0, t0+s, t0+2s, ... whose start lies before R:
    1 + the largest m with S(m) = m*t0 + s*m(m-1)/2 < R - TIE."""
    R -= TIE
    if s <= 0:
        m = math.ceil(R / t0) - 1
    else:
        b = t0 - s / 2
        m = math.ceil((-b + math.sqrt(b * b + 2 * s * R)) / s) - 1
    if m < 0:
        m = 0
    while m > 0 and m * t0 + s * m * (m - 1) / 2 >= R:  # floating-point guard
        m -= 1
    while (m + 1) * t0 + s * (m + 1) * m / 2 < R:
        m += 1
    return m + 1


def _cache_limit(seqs: list[Seq], k: int, sched: Scheduler) -> int:
    """The steps (>= 1, <= k) a decode run may take with prefix caching on and stay what
    stepping one at a time gives. Mid-run, step by step, a take beyond the uncached free blocks
    evicts cached units, and a step caches the units its tokens complete when it is scheduled
    (as vLLM caches blocks when it allocates them). So:

    - when the run's takes may evict, it stops at the step where a request completes a unit
      that is cached already with its first copy free: it keeps a copy of its own (vLLM never
      de-duplicates), so, step by step, a later take that evicts that free copy leaves the unit
      cached (`Node.dups`); a run that took first would have evicted the unit;
    - it stops at the step where two requests complete the same new unit (twins): who does so
      first keeps the first copy, the other its own (the run would insert both at its end);
    - with someone waiting (the first waiting request, the only one admission tries: it stops
      at the first that cannot start), with units of several blocks, or a policy that preempts for the head, while the head
      would revive cached units nobody holds, it stops at the last step whose takes fit the
      uncached free blocks: past it, a take of one block can evict a whole unit of that
      request's hit, and with a chunk cap it needs fewer blocks than before. With one-block
      units and no preemption for the head an evicted block of its hit is one block more to
      allocate and one less to revive, its admission unchanged; with a chunk cap it is one
      block fewer, which preempting victims whose blocks grow each step can then cover;
    - it stops before the step in which a request of the run completes a unit that the head's
      keys go on with (a later turn of a conversation whose earlier answer is being
      generated): that step's admission sees the head's hit grow by a unit, while the run
      takes at most a block per request and step, so the head can start mid-run."""
    kv = sched.kv
    if kv.open:  # the requests that will insert a unit (every holder of blocks is in the run)
        evicts = len(seqs) * kv.blocks_for(k - 1) > kv.free - kv.evictable
        root, groups = kv.root, {}
        for seq in kv.open:
            node = seq.cache_node or root
            groups.setdefault((node, seq.keys[seq.cached_upto]), []).append(seq)
        for (node, key), group in groups.items():
            child = node.children.get(key)
            if len(group) > 1 or (evicts and child is not None and child.ref == (
                    len(child.dups) if child.dups else 0)):  # fmt: skip
                for seq in group:
                    k = min(k, seq.next_unit_end - seq.computed)
    if not sched.waiting:
        return k
    head = sched.waiting.peek()
    if (kv.coarse or sched._preemptive) and not head.computed and k > 1:
        if kv.lookup(head, head.prompt_tokens + head.generated)[1]:
            k = _kv_limit(seqs, k, kv.blocks_for, max(kv.free - kv.evictable, 0))  # (negative
            # while evictions are owed: `_settle`)
    keys = head.keys
    for seq in seqs:  # the next unit one of the run completes after the first step, if the
        unit = seq.unit_tokens  # head's keys go on with it (chain keys: equal key, equal
        if unit and k > 1:  # prefix); its `next_unit_end` may be lazily `NEVER`
            u = (seq.computed + 1) // unit
            if u < len(seq.keys) and u < len(keys) and keys[u] == seq.keys[u]:
                k = min(k, max(1, (u + 1) * unit - seq.computed - 1))
    return k


def _kv_limit(seqs: list[Seq], k: int, blocks_for, free: int) -> int:
    """Largest j in [1, k] such that the requests' extra blocks for j more tokens fit `free`."""

    def extra(j: int) -> int:
        tot = 0
        for seq in seqs:
            need = blocks_for(seq.computed + j) - seq.blocks
            if need > 0:
                tot += need
        return tot

    lo, hi = 1, k  # extra(1) == 0: the first step was allocated by the scheduler
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if extra(mid) <= free:
            lo = mid
        else:
            hi = mid - 1
    return lo
