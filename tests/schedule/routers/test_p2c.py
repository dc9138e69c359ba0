"""p2c-work: power of d choices on predicted work."""

from __future__ import annotations

import numpy as np
from builders import linear_steps, make_estimates, make_requests

from presched.schedule import POLICIES
from presched.schedule.routers.p2c import PowerOfChoicesWork
from presched.sim.cluster import Cluster
from presched.sim.config import EngineConfig
from presched.sim.setup import SimConfig, simulate

REQS = make_requests(n=300, rate=40.0, seed=5)
EST = make_estimates([r.target_tokens for r in REQS], sigma=0.6)


def assignment(router, n=4):
    return simulate(REQS, SimConfig(num_instances=n, router=router[0], router_params=router[1],
                                    engine=EngineConfig(max_num_seqs=6)), estimates=EST
                    ).records.instance  # fmt: skip


def test_deterministic_for_a_seed():
    a = assignment(("p2c-work", {"seed": 7}))
    assert np.array_equal(a, assignment(("p2c-work", {"seed": 7})))
    assert not np.array_equal(a, assignment(("p2c-work", {"seed": 8})))
    assert set(a.tolist()) == {0, 1, 2, 3}


class Logged(PowerOfChoicesWork):
    """Records, per route, the work of every instance it read and the one it chose."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.log = []

    def work(self, inst, i):
        w = super().work(inst, i)
        self._read[i] = w
        return w

    def route(self, seq, instances, now):
        self._read = {}
        i = super().route(seq, instances, now)
        self.log.append((self._read, i))
        return i


def test_reads_d_distinct_instances_and_never_picks_the_worse():
    for d, n in ((2, 4), (3, 5)):
        router = Logged(d=d, seed=1)
        Cluster(EngineConfig(max_num_seqs=6), 1000, linear_steps(), lambda: POLICIES.create("fcfs"),
                router, num_instances=n).run(REQS, estimates=EST)  # fmt: skip
        assert len(router.log) == len(REQS)
        differ = 0
        for read, i in router.log:
            assert len(read) == d  # d distinct instances sampled, only those read
            best = min(read.values())
            assert read[i] == best and i == min(j for j, w in read.items() if w == best)
            differ += max(read.values()) > best
        assert differ > len(REQS) // 2  # the samples' loads did differ: the choice mattered
        counts = np.bincount([i for _, i in router.log], minlength=n)
        assert counts.min() > 0  # every instance gets sampled and chosen


def test_with_d_at_least_the_instances_it_is_least_work():
    assert np.array_equal(assignment(("p2c-work", {"d": 4})), assignment(("least-work", {})))
    assert np.array_equal(
        assignment(("p2c-work", {"d": 9}), n=3), assignment(("least-work", {}), n=3)
    )
