"""Continuous batching for one engine instance, with vLLM v1 semantics.

Each step has a token budget (`max_num_batched_tokens`). `schedule(now)` fills it:

A. Running requests, in admission order: each gets the tokens it still has to compute (one for a
   decode; the rest of its prompt, capped by the budget and `long_prefill_token_threshold`, for a
   prefill or a recompute). If its new KV blocks are not free, the policy's `victim` among the
   not-yet-served running requests is preempted (recompute) until the blocks fit; if the victim
   is the request itself, phase A stops.
B. Only if nothing was preempted in A (vLLM's anti-thrash rule): waiting requests in policy
   order, while budget, `max_num_seqs` and free blocks allow. When the head cannot start, the
   policy may name running requests to preempt for it (`preempt_for`, asked again about the
   batch without the ones it named, until the head would fit); they are preempted only if the
   head then fits (a slot, its blocks, the budget they give back) and `admit` accepts it
   against the batch without them, else no one is (`_victims_for`: a victim is never evicted
   for a head that still could not start); that head then starts at once, even if a victim
   ranks before it once back in the queue. Otherwise B stops (strict order: a blocked head is
   not skipped). A waiting request computes its
   `num_tokens - computed` tokens: all of them (computed == 0), except on a decode instance of a
   disaggregated cluster, where its prompt KV came from a prefill instance (computed = prompt)
   and its first step feeds its first token: a decode (vLLM's KV-connector semantics). With
   prefix caching (`engine.enable_prefix_caching`, prefix_cache.py) it starts with its cache
   hit computed: only the rest is computed, and it fits if its new blocks plus the cached ones
   it revives from the free pool do. A hybrid attention / Mamba model's request also holds
   `state_blocks` blocks for its state while it runs (block_manager.py): they must be free for
   it to start, and a victim gives them back.

The caller (instance.py) runs the step for `step_time(shape)` seconds and applies its tokens.

After a fast-forwarded decode run, or a step in which every running request took part and each
now decodes next (instance.py), the instance already knows phase A's outcome: the total context,
the requests whose next token starts a block and the fewest tokens any request has left
(`decode_next`). If the free blocks cover the needy ones, no one can be preempted, and the step
takes them all without visiting each request (the same batch, block for block: the golden
fingerprints check it); a decode run from it needs no pass for its first completion
(`Batch.left`).
"""

from __future__ import annotations

from presched.schedule.interface import Policy
from presched.sim.block_manager import BlockManager
from presched.sim.config import EngineConfig
from presched.sim.prefix_cache import CachingBlockManager
from presched.sim.seq import RUNNING, WAITING, Seq


class Scheduler:
    def __init__(self, cfg: EngineConfig, num_blocks: int, policy: Policy) -> None:
        self.cfg = cfg
        self.policy = policy
        self.caching = cfg.enable_prefix_caching
        kv_class = CachingBlockManager if self.caching else BlockManager
        self.kv = kv_class(num_blocks, cfg.block_size)
        self._state = state = cfg.state_blocks or 0  # each running request's (hybrid models)
        if state >= num_blocks:
            raise ValueError(f"engine.state_blocks: {state} blocks of state per request leave "
                             f"no KV block of the {num_blocks} (num_blocks); lower state_blocks "
                             f"or raise num_blocks")  # fmt: skip
        self.kv.state_blocks = state
        self.waiting = policy.new_queue()
        self.running: list[Seq] = []
        self.num_preemptions = 0
        self._preemptive = type(policy).preempt_for is not Policy.preempt_for
        self._admits = type(policy).admit is not Policy.admit
        self._max_tokens = cfg.max_num_batched_tokens
        self._threshold = cfg.long_prefill_token_threshold
        self._thr = self._threshold  # this step's cap (`schedule`: none for a request alone)
        self._kv_tokens = (num_blocks - state) * cfg.block_size
        self.decode_next: tuple[int, list[Seq], int] | None = None
        """(total context, the requests among them whose next token starts a block, the fewest
        tokens any of them has left to generate) when every running request's next step is a
        decode: set by the instance after a decode run or step, used and cleared by the next
        `schedule`, which then batches them all without visiting each one when the free blocks
        cover the needy ones (phase A could preempt no one). `schedule` takes it before it
        admits or preempts anyone; a request finishing outside it clears it."""

    def add(self, seq: Seq, now: float) -> None:
        # KV is needed for every token but the last one generated here (sampled, never fed back)
        if seq.prompt_tokens + seq.stop - 1 > self._kv_tokens:
            raise ValueError(
                f"request {seq.id!r}: prompt_tokens + output tokens = "
                f"{seq.prompt_tokens + seq.stop} exceeds the KV cache of one instance "
                f"({self._kv_tokens} tokens{self._state and ' besides its state blocks' or ''});"
                f" raise num_blocks or cap max_tokens"
            )
        if self.caching:
            self.kv.prepare(seq)
        seq.status = WAITING
        self.policy.on_arrival(seq, now)
        self.waiting.push(seq, now)

    def has_work(self) -> bool:
        return bool(self.running) or bool(self.waiting)

    def schedule(self, now: float) -> Batch:
        """This step's work (see module doc)."""
        kv, policy, running = self.kv, self.policy, self.running
        # the long-prefill cap keeps one long prompt from starving the others: alone, a request
        # has nobody to starve and takes the whole budget (vLLM's num_eligible_reqs > 1)
        waiting = len(self.waiting)
        threshold = self._thr = self._threshold if len(running) + waiting > 1 else 0
        budget, bs = self._max_tokens, kv.block_size
        batch = Batch()
        known, self.decode_next = self.decode_next, None
        if known is not None and len(running) <= budget and len(known[1]) <= kv.free:
            n = len(running)  # A, every request a decode (see decode_next)
            needy = known[1]
            if needy:  # (`kv.take(seq, 1)` each, without a call per request)
                for seq in needy:
                    seq.blocks += 1
                kv.took(len(needy))
            batch.seqs, batch.ntoks = running.copy(), [1] * n
            batch.num_decode, batch.decode_context, batch.left = n, known[0], known[2]
            if waiting:
                self._admit(now, batch, budget - n)
            return batch
        seqs, ntoks = batch.seqs, batch.ntoks
        add_seq, add_n = seqs.append, ntoks.append
        preempted = False
        B = C = 0
        for i, seq in enumerate(running):  # A. running requests (victims are removed at >= i)
            c = seq.computed
            total = seq.prompt_tokens + seq.generated
            n = total - c
            if n == 1 and seq.generated and total <= seq.blocks * bs:  # a decode with its block
                add_seq(seq)  # (no cap lowers n = 1: threshold and budget are >= 1 here)
                add_n(1)
                B += 1
                C += total
                budget -= 1
                if budget <= 0:
                    break
                continue
            if threshold and n > threshold:
                n = threshold
            if n > budget:
                n = budget
            if c + n > seq.blocks * bs:  # past the blocks it holds (most steps are not)
                extra = kv.blocks_for(c + n) - seq.blocks
                while extra > kv.free:
                    victim = policy.victim(running[i:], now)
                    self._preempt(victim, now)
                    preempted = True
                    if victim is seq:
                        break
                if seq.status != RUNNING:
                    break
                kv.take(seq, extra)
            add_seq(seq)
            add_n(n)
            if n == 1 and c + 1 == total and seq.generated:  # a decode
                B += 1
                C += total
            else:
                batch.add_prefill(n, c)
                if c + n < total:
                    batch.partial = True
            budget -= n
            if budget <= 0:
                break
        batch.num_decode, batch.decode_context = B, C
        if preempted:
            batch.changed = True
        elif self.waiting:
            self._admit(now, batch, budget)
        return batch

    def _admit(self, now: float, batch: "Batch", budget: int) -> None:
        """B. Waiting requests in policy order (see module doc). With prefix caching, the units
        the step's requests compute are cached first, as vLLM caches blocks when it allocates
        them: a request admitted later in the step hits them (`kv.cache_ahead`)."""
        if self.caching:
            self.kv.cache_ahead(batch.seqs, batch.ntoks)
            self._admit_waiting(now, batch, budget)
            self.kv.ahead = {}
        else:
            self._admit_waiting(now, batch, budget)

    def _admit_waiting(self, now: float, batch: "Batch", budget: int) -> None:
        waiting, kv, running, policy = self.waiting, self.kv, self.running, self.policy
        waiting.update(now)
        seqs, ntoks = batch.seqs, batch.ntoks
        max_seqs, caching = self.cfg.max_num_seqs, self.caching
        while waiting and budget > 0:
            seq = waiting.peek()
            need = self._need(seq, budget)
            if need is None:  # not chunked: wait for a step with room
                break
            c, n, extra, full, units, revive = need
            if len(running) >= max_seqs or full + revive > kv.free:
                if not self._preemptive:
                    break
                victims = self._victims_for(seq, need, budget, batch, now)
                if not victims:
                    break
                for victim in victims:
                    if victim in seqs:  # served earlier in this step: take its tokens back
                        budget += batch.remove(victim)
                    self._preempt(victim, now)
                batch.changed = True
                # the head starts now, even if a victim ranks before it once back in the queue
                # (vtc's lift can tie them): the policy named them for this head, and admitting
                # a victim again would have it named again, in this step, without end
                need = self._need(seq, budget)  # (with caching the victims' release changed it)
                if need is None:
                    break
                c, n, extra, full, units, revive = need
                if len(running) >= max_seqs or full + revive > kv.free:
                    break  # (only if releasing a victim evicted cached units of the head's hit)
                waiting.remove(seq)
            elif self._admits and not policy.admit(seq, running, now):
                break
            else:
                waiting.pop()
            total = seq.prompt_tokens + seq.generated
            seq.status = RUNNING
            running.append(seq)
            if caching and not seq.computed:
                seq.cached_tokens += kv.acquire(seq, units, revive, total)
                seq.computed = c
            kv.take(seq, extra)
            kv.hold_state()  # (after its hit's blocks are held: taking may evict)
            if caching:
                kv.ahead[seq] = n
                if c + n >= seq.next_unit_end:
                    kv.insert(seq)
            seqs.append(seq)
            ntoks.append(n)
            if c and n == 1 and c + 1 == total and seq.generated:  # KV arrived: a decode
                batch.num_decode += 1
                batch.decode_context += total
            else:
                batch.add_prefill(n, c)
                if c + n < total:
                    batch.partial = True
            budget -= n
            batch.changed = True
            if seq.first_scheduled is None:
                seq.first_scheduled = now
            policy.on_schedule(seq, now)

    def _need(self, seq: Seq, budget: int) -> tuple[int, int, int, int, int, int] | None:
        """What the waiting `seq` needs to start now with `budget` left: (tokens it has (0; the
        prompt on a decode instance; its cache hit), tokens it computes, blocks it takes, blocks
        its whole sequence and its state need, units of its cache hit, cached blocks it revives from the free
        pool), or None when, with chunking off, it must wait for a step with room. It starts
        only if the whole sequence's blocks are free, not only its first chunk's (vLLM's
        `scheduler_reserve_full_isl`, on by default: a long prompt admitted on its first chunk
        was preempted chunk after chunk)."""
        kv = self.kv
        c = seq.computed  # 0, or the prompt when its KV came from a prefill instance
        total = seq.prompt_tokens + seq.generated
        units = revive = have = 0
        if self.caching and not c:  # prefix-cache hit: its first c tokens are cached blocks
            units, revive = kv.lookup(seq, total)
            c = units * seq.unit_tokens
            have = c // kv.block_size
        n = self._tokens(total - c, budget)
        if n is None:
            return None
        # a waiting request holds no blocks: the chunk's and the whole sequence's (and its state's),
        # less its hit
        return (c, n, kv.blocks_for(c + n) - have, kv.blocks_for(total) - have + self._state,
                units, revive)  # fmt: skip

    def _tokens(self, rest: int, budget: int) -> int | None:
        """Tokens a waiting request with `rest` tokens to compute takes in this step with
        `budget` left; None when, with chunking off, it must wait for a step with room."""
        n = rest
        if self._thr and n > self._thr:
            n = self._thr
        if n > budget:
            if self.cfg.enable_chunked_prefill:
                return budget
            if budget < self._max_tokens:
                return None
        return n

    def _victims_for(self, seq: Seq, need: tuple, budget: int, batch: Batch,
                     now: float) -> list[Seq] | None:  # fmt: skip
        """The running requests to preempt so that the head `seq` starts now, or None. Asks
        `preempt_for` about the batch without the requests it named before, until the head
        would fit: a slot, and its blocks within the free ones plus those the victims give up
        (`_freed`), with the budget of victims served earlier in this step given back; then
        `admit` against that batch. None if the policy stops naming victims first or `admit`
        refuses: nobody is preempted for a head that still could not start."""
        policy, kv, seqs = self.policy, self.kv, batch.seqs
        c, _, _, _, units, revive = need
        rest, have = seq.prompt_tokens + seq.generated - c, c // kv.block_size if units else 0
        trial = self.running.copy()
        victims: list[Seq] = []
        while True:
            victim = policy.preempt_for(seq, trial, now)
            if victim is None or victim not in trial:
                return None
            trial.remove(victim)
            victims.append(victim)
            if victim in seqs:
                budget += batch.ntoks[seqs.index(victim)]
            if len(trial) >= self.cfg.max_num_seqs:
                continue
            # (the budget only grew, so the head's chunk fits it; the whole sequence's blocks must)
            if (kv.blocks_for(c + rest) - have + self._state + revive
                    <= kv.free + self._freed(victims, units)):  # fmt: skip
                break
        if self._admits and not policy.admit(seq, trial, now):
            return None
        return victims

    def _freed(self, victims: list[Seq], units: int) -> int:
        """Blocks that preempting `victims` makes available to the head whose cache hit
        `kv.lookup` just found (`units`): their blocks, less, with prefix caching, those of
        cached units that someone else still holds (counted in each holder's blocks) and those
        of units nobody else holds that the head's hit would revive (they become free, and the
        head takes them out of the free pool again)."""
        freed = sum(v.blocks for v in victims) + self._state * len(victims)
        if not self.caching:
            return freed
        kv = self.kv
        root = kv.root
        held: dict = {}  # node -> victims sharing its first copy (a holder holds every
        for v in victims:  # ancestor; one with a copy of its own frees it: in its blocks)
            node = v.cache_node
            while node is not None and node is not root:
                if node.dups is None or v not in node.dups:
                    held[node] = held.get(node, 0) + 1
                node = node.parent
        hit: dict = {}  # node of the head's hit -> its blocks the head would use
        if units:
            node, m = kv._hit[2], kv._hit[3]  # lookup's deepest node, m units of it matched
            while node is not root:
                hit[node] = m * node.ub
                node = node.parent
                m = node.end - node.start
        for node, k in held.items():
            b = (node.end - node.start) * node.ub
            freed -= k * b
            if node.ref - (len(node.dups) if node.dups else 0) == k:  # nobody else shares it:
                freed += b - hit.get(node, 0)  # free (cached, evictable) unless revived
        return freed

    def _preempt(self, seq: Seq, now: float) -> None:
        self.running.remove(seq)
        self.kv.release(seq)
        self.kv.drop_state()
        seq.recomputed_tokens += seq.computed
        seq.computed = 0
        seq.status = WAITING
        seq.preemptions += 1
        self.num_preemptions += 1
        self.policy.on_preempt(seq, now)
        self.waiting.push(seq, now)

    def finish(self, seq: Seq) -> None:
        self.running.remove(seq)
        self.decode_next = None
        self.kv.release(seq)
        self.kv.drop_state()


class Batch:
    """One step's work: the requests, their new-token counts, and the step's shape for the
    step-time model (see `steptime/base.py`). `changed`: a request was admitted or preempted;
    `partial`: a prefill chunk stops short of its prompt."""

    __slots__ = ("seqs", "ntoks", "changed", "partial", "prefill_tokens", "prefill_pairs",
                 "prefill_context", "num_decode", "decode_context", "left")  # fmt: skip

    def __init__(self) -> None:
        self.seqs: list[Seq] = []
        self.ntoks: list[int] = []
        self.changed = False
        self.partial = False  # a prefill chunk that does not finish its prompt (may be stale
        # after `remove`: it only keeps the instance from learning phase A early)
        self.prefill_tokens = 0
        self.prefill_pairs = 0.0
        self.prefill_context = 0
        self.num_decode = 0
        self.decode_context = 0
        self.left: int | None = None  # phase A known (`decode_next`): the fewest tokens a
        # running request has left to generate

    def add_prefill(self, n: int, computed: int, sign: int = 1) -> None:
        self.prefill_tokens += sign * n
        self.prefill_pairs += sign * n * (computed + (n + 1) / 2)
        self.prefill_context += sign * (computed + n)

    def remove(self, seq: Seq) -> int:
        """Take `seq` out of the batch (it is being preempted); returns its token count."""
        j = self.seqs.index(seq)
        n = self.ntoks[j]
        del self.seqs[j], self.ntoks[j]
        if n == 1 and seq.generated and seq.computed + 1 == seq.prompt_tokens + seq.generated:
            self.num_decode -= 1
            self.decode_context -= seq.computed + 1
        else:
            self.add_prefill(n, seq.computed, -1)
        return n
