"""Prefix-aware routers: send a request where its prompt's prefix is likely cached.

Both read a request's block hashes (`seq.request.block_hashes`, `hash_block_tokens`: Mooncake's
own, `workload/prefix.py`'s chain hash, or the gateway's hashing of the prompt it received) and
remember, per instance, the hashes of the requests they sent there (`PrefixIndex`, an LRU of
`capacity_tokens` per instance: llm-d's approximate prefix-cache scorer). They never read an
engine's cache, so they run unchanged under the simulator and the gateway.

- `prefix-affinity` (prefix only): the instance that was sent the longest prefix of the request
  (llm-d's `prefix-cache-scorer` alone, SGLang's `cache_aware` without its balance guard).
  Ties, and requests whose best match is below `min_match` of their prompt (default 0.5,
  SGLang's `cache_threshold`): the instance with the fewest outstanding requests, then the
  lowest index. With `min_match` 0 it follows any match: every request that shares a first
  block (Mooncake: all of them) piles onto one instance.
- `prefix-work`: a weighted sum of scores in [0, 1], as llm-d's scheduling profiles weigh
  scorers (defaults: prefix 3, work 2, queue 1, kv 1):

      prefix  = matched tokens / matchable tokens     matchable: the prompt's hashed blocks,
                                                      at most max_blocks, within the prompt
      work    = (max_w - w_i) / (max_w - min_w)      w_i: predicted outstanding work of
                                                      instance i (`least-work`'s, from the
                                                      length predictions; 1 if all equal)
      queue   = (max_q - q_i) / (max_q - min_q)      q_i: waiting requests (1 if all equal)
      kv      = free KV fraction of instance i

  The highest total wins (ties: the lowest index). With `work_weight` 0 it is llm-d's
  prefix + queue + kv-utilization profile; the predicted work is what presched adds.

What a router sent stays in its index when the request finishes or is cancelled (`on_cancel`
drops only `prefix-work`'s predicted work): finished requests leave their blocks cached, and a
cancelled one may have computed some. So a request cancelled before its prefill, or one the
gateway moved elsewhere, still counts for the instance it left until the LRU forgets it: the
index is what was sent, an approximation of what is cached, like llm-d's approximate scorer.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from presched.schedule.params import PolicyParams
from presched.schedule.routers.interface import ROUTERS, Router, positions
from presched.schedule.routers.least_work import LeastWork, LeastWorkParams
from presched.schedule.routers.prefix_index import PrefixIndex

_CAPACITY = Field(450_000, ge=1, description="Tokens of prefixes remembered per instance (LRU); about one instance's KV cache (Llama-3.1-8B on an H100: ~450k tokens).")
_MAX_BLOCKS = Field(256, ge=0, description="Match and remember only a request's first N hashed blocks (0 = all; llm-d's maxPrefixBlocksToMatch is 256).")


class PrefixAffinityParams(PolicyParams):
    capacity_tokens: int = _CAPACITY
    max_blocks: int = _MAX_BLOCKS
    min_match: float = Field(0.5, ge=0, le=1, description="Follow the best match only if it covers at least this share of the prompt; below it, the instance with the fewest outstanding requests (SGLang's cache_threshold, default 0.5 there too). 0: always follow any match (sticky: every request sharing a first block piles onto one instance).")


class PrefixWorkParams(LeastWorkParams):
    capacity_tokens: int = _CAPACITY
    max_blocks: int = _MAX_BLOCKS
    prefix_weight: float = Field(3.0, ge=0, allow_inf_nan=False, description="Weight of the prefix score (matched share of the prompt).")
    work_weight: float = Field(2.0, ge=0, allow_inf_nan=False, description="Weight of the predicted-work score (least-work's outstanding work, min-max normalized).")
    queue_weight: float = Field(1.0, ge=0, allow_inf_nan=False, description="Weight of the queue score (waiting requests, min-max normalized).")
    kv_weight: float = Field(1.0, ge=0, allow_inf_nan=False, description="Weight of the KV score (free KV fraction).")


def _hashes(seq) -> tuple[tuple[int, ...], int]:
    r = seq.request
    return r.block_hashes, r.hash_block_tokens


def _matchable(seq, hashes, bt: int, max_blocks: int) -> int:
    """Tokens of `seq`'s prompt a match can cover: its hashed blocks, at most `max_blocks` of
    them (what the index compares), and never past the prompt. A match is scored against this,
    not the whole prompt: a full match on a prompt longer than max_blocks blocks is a full one."""
    return max(1, min(seq.prompt_tokens, min(len(hashes), max_blocks) * bt))


def _spread(values: list[float]) -> list[float]:
    """(max - v) / (max - min) per value: 1 for the least, 0 for the most; all 1 if equal."""
    lo, hi = min(values), max(values)
    if hi <= lo:
        return [1.0] * len(values)
    return [(hi - v) / (hi - lo) for v in values]


@ROUTERS.register("prefix-affinity")
class PrefixAffinity(Router):
    name = "prefix-affinity"
    Params = PrefixAffinityParams
    params: PrefixAffinityParams
    needs_progress = False
    reads_prefix = True

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.index = PrefixIndex(self.params.capacity_tokens, self.params.max_blocks)

    def route(self, seq, instances, now, allowed=None) -> int:
        hashes, bt = _hashes(seq)
        n = len(instances)
        cand = positions(instances, allowed)
        match = self.index.match(hashes, n) if hashes else [0] * n
        best = max(match[i] for i in cand)
        if best == 0 or best * bt < self.params.min_match * _matchable(seq, hashes, bt, self.params.max_blocks):
            i = min(cand, key=lambda i: instances[i].num_outstanding)
        else:
            best_at = [i for i in cand if match[i] == best]
            i = min(best_at, key=lambda i: instances[i].num_outstanding)
        if hashes:
            self.index.add(i, hashes, bt)
        return i


@ROUTERS.register("prefix-work")
class PrefixWork(LeastWork):
    name = "prefix-work"
    Params = PrefixWorkParams
    params: PrefixWorkParams
    reads_prefix = True

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.index = PrefixIndex(self.params.capacity_tokens, self.params.max_blocks)

    def scores(self, seq, instances, allowed=None) -> list[float]:
        """The weighted score for `seq` of each instance of `allowed` (None: all), in that order
        (see the module doc; work and queue are normalized over those instances)."""
        p = self.params
        cand = positions(instances, allowed)
        hashes, bt = _hashes(seq)
        total = [0.0] * len(cand)
        if p.prefix_weight and hashes:
            match = self.index.match(hashes, len(instances))
            most = _matchable(seq, hashes, bt, p.max_blocks)
            for k, i in enumerate(cand):
                total[k] += p.prefix_weight * min(1.0, match[i] * bt / most)
        if p.work_weight:
            for k, s in enumerate(_spread([self.work(instances[i], i) for i in cand])):
                total[k] += p.work_weight * s
        if p.queue_weight:
            for k, s in enumerate(_spread([float(instances[i].num_waiting) for i in cand])):
                total[k] += p.queue_weight * s
        if p.kv_weight:
            for k, i in enumerate(cand):
                total[k] += p.kv_weight * instances[i].kv_free_fraction
        return total

    def route(self, seq, instances, now, allowed=None) -> int:
        cand = positions(instances, allowed)
        total = self.scores(seq, instances, cand)
        i = cand[max(range(len(cand)), key=lambda k: (total[k], -k))]
        self.routed(seq, i)
        hashes, bt = _hashes(seq)
        if hashes:
            self.index.add(i, hashes, bt)
        return i
