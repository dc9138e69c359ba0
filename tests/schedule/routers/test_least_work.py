"""least-work: predicted outstanding work with progressive refinement, kept incrementally."""

from __future__ import annotations

import pytest
from builders import constant_steps, linear_steps, make_estimates, make_requests

from presched.predict.estimate import LengthEstimate
from presched.schedule import POLICIES
from presched.schedule.routers import ROUTERS
from presched.schedule.routers.least_work import LeastWork
from presched.sim.cluster import Cluster
from presched.sim.config import EngineConfig
from presched.sim.instance import Instance
from presched.sim.seq import Seq


def instances(n, step_model=None, **engine):
    return [Instance(i, EngineConfig(**engine), 1000, POLICIES.create("fcfs"),
                     step_model or constant_steps(), True, False) for i in range(n)]  # fmt: skip


def seqs_of(reqs, estimates=None):
    seqs = [Seq(r, i) for i, r in enumerate(reqs)]
    for s in seqs:
        s.estimate = None if estimates is None else estimates[s.index]
    return seqs


def place(router, insts, seq, i):
    """Put `seq` on instance i as if an earlier route had chosen it."""
    router.routed(seq, i)
    insts[i].add(seq, seq.arrival)


def test_counts_expected_remaining_tokens_per_instance():
    # instance 0: one request with 500 tokens to go; instance 1: three with 10 each
    reqs = make_requests([(10, 500), (10, 10), (10, 10), (10, 10), (10, 10)], arrivals=[0.0] * 5)

    def probe(router, estimates=None):
        insts, seqs = instances(2), seqs_of(reqs, estimates)
        place(router, insts, seqs[0], 0)
        for s in seqs[1:4]:
            place(router, insts, s, 1)
        return router.route(seqs[4], insts, 0.0)

    assert probe(ROUTERS.create("least-work-oracle", prompt_weight=0.0)) == 1  # 500 > 3 x 10
    # without predictions: the running mean of completed lengths (prior 256): 1 x 256 < 3 x 256
    assert probe(ROUTERS.create("least-work", prompt_weight=0.0)) == 0
    # with predictions, their mean: 1000 > 3 x 10
    assert probe(ROUTERS.create("least-work", prompt_weight=0.0),
                 make_estimates([1000, 10, 10, 10, 10])) == 1  # fmt: skip
    # prefill counts until the first token: 4 x 10 + 0.1 x 10 = 41 vs 3 x (10 + 0.1 x 2000) = 630
    reqs[1:4] = make_requests([(2000, 10)] * 3, arrivals=[0.0] * 3)
    assert probe(ROUTERS.create("least-work"), make_estimates([40, 10, 10, 10, 10])) == 0
    assert probe(ROUTERS.create("least-work", prompt_weight=0.0),
                 make_estimates([40, 10, 10, 10, 10])) == 1  # fmt: skip


def test_refinement_sends_work_away_from_a_request_that_outlived_its_prediction():
    # A (instance 0) is predicted ~10 tokens but runs 1000; B (instance 1) predicted ~60, tight.
    # Every step takes 1 s: at t = 50.5 both have generated 51 tokens. A's point estimate says
    # it is done (1 token left) and B has 9 left; the distribution says A, having outlived its
    # prediction, still has E[L - 51 | L > 51] ~ 35 to go, B ~ 10.
    reqs = make_requests([(4, 1000), (4, 100), (4, 5)], arrivals=[0.0, 0.0, 50.5])
    est = LengthEstimate.concat([make_estimates([10], 1.0), make_estimates([60], 0.1),
                                 make_estimates([5], 0.1)])  # fmt: skip
    a, b = est[0], est[1]
    assert a.mean_remaining(51) > 30 and b.mean_remaining(51) < 15

    def run(**params):
        router = ROUTERS.create("least-work", **params)
        cluster = Cluster(EngineConfig(), 1000, constant_steps(), lambda: POLICIES.create("fcfs"),
                          router, num_instances=2)  # fmt: skip
        return cluster.run(reqs, estimates=est).records.instance.tolist()

    assert run() == [0, 1, 1]  # refined: C avoids A's instance
    assert run(stat="point") == [0, 1, 0]  # counted down: C joins A
    assert run(stat="q90")[2] == 1  # conditional quantiles refine too


class Checked(LeastWork):
    """least-work that checks, at every arrival, its incremental work against a full scan."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.seen_running = self.seen_waiting = self.seen_blind = 0

    def route(self, seq, instances, now):
        for i, inst in enumerate(instances):
            scan = sum(self.cost(s) for s in inst.outstanding())
            assert self.work(inst, i) == pytest.approx(scan, rel=1e-9, abs=1e-6)
            self.seen_running += any(s.generated > 0 for s in inst.outstanding())
            self.seen_waiting += inst.num_waiting > 0
            self.seen_blind += any(s.estimate is None for s in inst.outstanding())
        return super().route(seq, instances, now)


@pytest.mark.parametrize("predicted", [True, False])
def test_incremental_work_equals_a_scan_of_every_outstanding_request(predicted):
    reqs = make_requests(n=300, rate=40.0, seed=3)
    est = make_estimates([r.target_tokens for r in reqs], sigma=0.7) if predicted else None
    router = Checked()
    cluster = Cluster(EngineConfig(max_num_seqs=6), 100_000, linear_steps(),
                      lambda: POLICIES.create("fcfs"), router, num_instances=3)  # fmt: skip
    res = cluster.run(reqs, estimates=est)
    assert res.num_preemptions == 0  # a preempted request counts as at arrival (documented)
    assert router.seen_running > 100 and router.seen_waiting > 100  # the check was exercised
    assert (router.seen_blind > 100) == (not predicted)  # and, blind, the running mean changed


def test_route_reads_running_requests_only():
    class Counting(LeastWork):
        calls = 0

        def cost(self, seq):
            Counting.calls += 1
            return super().cost(seq)

    router = Counting()
    reqs = make_requests([(100, 500)] * (2 * 504 + 1), arrivals=[0.0] * (2 * 504 + 1))
    insts = instances(2, linear_steps(), max_num_seqs=4)
    seqs = seqs_of(reqs, make_estimates([r.target_tokens for r in reqs], sigma=0.5))
    for s in seqs[:-1]:
        place(router, insts, s, s.index % 2)
    for inst in insts:
        inst.advance(0.5)
    assert [i.num_running for i in insts] == [4, 4]
    assert [i.num_waiting for i in insts] == [500, 500]
    assert all(s.generated > 0 for i in insts for s in i.sched.running)
    Counting.calls = 0
    router.route(seqs[-1], insts, 0.5)
    assert Counting.calls <= 8 + 1  # the 8 running requests (+ the new one), not the 1000 waiting
