"""The outcome of one simulation: every request's timeline plus engine counters.

Under prefill/decode disaggregation a request's record joins its two instances: arrival,
first_scheduled and first_token on the prefill instance, finish and `instance` on the decode one
(the prefill one for a 1-token reply), preemptions and recomputed tokens summed over both; the
per-instance lists hold every instance, prefill ones first (`roles`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from presched.metrics.records import RecordTable
from presched.sim.itl import ItlLog
from presched.sim.seq import Seq


@dataclass
class SimResult:
    records: RecordTable
    itl: ItlLog
    wall_seconds: float
    num_steps: int
    num_runs: int
    num_preemptions: int
    busy_seconds: list[float]
    peak_kv_blocks: list[int]
    num_blocks: list[int]
    seqs: list[Seq] = field(repr=False, default_factory=list)
    roles: list[str] = field(default_factory=list)
    """Per instance (same order as busy_seconds ...): "colocated", "prefill" or "decode"."""
    kv_transfer_bytes: float = 0.0
    """Disaggregated: prompt KV bytes sent from prefill to decode instances in all."""
    prefix_hit_tokens: int = 0
    """Prefix caching: prompt tokens found cached at admissions (prefill tokens saved), in all."""
    prefix_queried_tokens: int = 0
    """Prefix caching: tokens looked up in the cache at admissions (0 with caching off)."""
    prompt_hit_tokens: int = 0
    """Prefix caching: prompt tokens found cached at each request's first admission."""
    prompt_tokens_admitted: int = 0
    """Prefix caching: prompt tokens of the requests at their first admission."""

    @classmethod
    def from_instances(
        cls, seqs: list[Seq], instances, wall: float, roles: list[str] | None = None,
        kv_transfer_bytes: float = 0.0,
    ) -> "SimResult":  # fmt: skip
        """`instances`: every instance (a disaggregated cluster: prefill ones, then decode)."""
        itl = ItlLog()
        for inst in instances:
            itl.extend(inst.itl)
        return cls(
            records=RecordTable.from_seqs(seqs),
            itl=itl,
            wall_seconds=wall,
            num_steps=sum(i.num_steps for i in instances),
            num_runs=sum(i.num_runs for i in instances),
            num_preemptions=sum(i.sched.num_preemptions for i in instances),
            busy_seconds=[i.busy_time for i in instances],
            peak_kv_blocks=[i.sched.kv.peak_used for i in instances],
            num_blocks=[i.sched.kv.num_blocks for i in instances],
            seqs=seqs,
            roles=roles if roles is not None else ["colocated"] * len(instances),
            kv_transfer_bytes=kv_transfer_bytes,
            prefix_hit_tokens=sum(getattr(i.sched.kv, "hit_tokens", 0) for i in instances),
            prefix_queried_tokens=sum(getattr(i.sched.kv, "queried_tokens", 0) for i in instances),
            prompt_hit_tokens=sum(getattr(i.sched.kv, "prompt_hit_tokens", 0) for i in instances),
            prompt_tokens_admitted=sum(getattr(i.sched.kv, "prompt_tokens", 0) for i in instances),
        )

    @property
    def sim_seconds(self) -> float:
        """Simulated span: first arrival to last finish."""
        r = self.records
        if len(r) == 0:
            return 0.0
        return float(r.finish.max() - r.arrival.min())

    @property
    def prefix_hit_rate(self) -> float:
        """Prefix-cache hit rate: cached tokens / tokens looked up (0 with caching off)."""
        q = self.prefix_queried_tokens
        return self.prefix_hit_tokens / q if q else 0.0

    @property
    def prompt_hit_rate(self) -> float:
        """Share of prompt tokens found cached at first admission: the prefill the cache saved
        on first passes (unlike `prefix_hit_rate`, a preempted request's recompute, which hits
        its own blocks, does not count)."""
        q = self.prompt_tokens_admitted
        return self.prompt_hit_tokens / q if q else 0.0

    @property
    def realtime_factor(self) -> float:
        return self.sim_seconds / self.wall_seconds if self.wall_seconds > 0 else float("inf")
