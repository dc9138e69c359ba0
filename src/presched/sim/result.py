"""The outcome of one simulation: every request's timeline plus engine counters."""

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

    @classmethod
    def from_instances(cls, seqs: list[Seq], instances, wall: float) -> "SimResult":
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
        )

    @property
    def sim_seconds(self) -> float:
        """Simulated span: first arrival to last finish."""
        r = self.records
        if len(r) == 0:
            return 0.0
        return float(r.finish.max() - r.arrival.min())

    @property
    def realtime_factor(self) -> float:
        return self.sim_seconds / self.wall_seconds if self.wall_seconds > 0 else float("inf")
