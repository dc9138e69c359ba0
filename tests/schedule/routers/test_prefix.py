"""Prefix-aware routers (prefix-affinity, prefix-work) and their index, driven step by step."""

from __future__ import annotations

import pytest
from builders import constant_steps, make_estimates, make_requests

from presched.schedule import POLICIES
from presched.schedule.routers import ROUTERS
from presched.schedule.routers.prefix_index import PrefixIndex
from presched.sim import SimConfig, simulate
from presched.sim.config import EngineConfig
from presched.sim.instance import Instance
from presched.sim.seq import Seq
from presched.workload.config import WorkloadConfig, build_workload
from presched.workload.prefix import with_hashes

SYS = list(range(64))  # a shared 64-token prefix: 4 blocks of 16


def instances(n):
    return [Instance(i, EngineConfig(), 1000, POLICIES.create("fcfs"), constant_steps(), True, False)
            for i in range(n)]  # fmt: skip


def seqs(prompts, outputs=None, estimates=None):
    """One seq per token list, hashed in blocks of 16, all arriving at 0."""
    outputs = outputs or [10] * len(prompts)
    reqs = make_requests([(len(p), o) for p, o in zip(prompts, outputs)], [0.0] * len(prompts))
    out = [Seq(with_hashes(r, p, 16), i) for i, (r, p) in enumerate(zip(reqs, prompts))]
    for s in out:
        s.estimate = None if estimates is None else estimates[s.index]
    return out


def send(router, insts, seq):
    i = router.route(seq, insts, 0.0)
    insts[i].add(seq, 0.0)
    return i


def own(k, n=32):
    return list(range(1000 * (k + 1), 1000 * (k + 1) + n))


def test_index_matches_the_longest_prefix_per_instance_and_forgets_lru():
    idx = PrefixIndex(capacity_tokens=5 * 16)
    idx.add(0, (1, 2, 3), 16)
    idx.add(1, (1, 2, 9), 16)
    assert idx.match((1, 2, 3, 4), 3) == [3, 2, 0]
    assert idx.match((7, 2, 3), 3) == [0, 0, 0]  # a match starts at the first block
    idx.add(0, (5, 6, 7), 16)  # instance 0 holds 6 blocks > 5: its oldest, 1, is forgotten
    assert idx.match((1, 2, 3), 2) == [0, 2]
    assert idx.match((5, 6), 2) == [2, 0]
    assert PrefixIndex(10**6, max_blocks=2).match((1,), 1) == [0]


def test_prefix_affinity_follows_the_prefix_even_to_a_busier_instance():
    insts = instances(3)
    r = ROUTERS.create("prefix-affinity", min_match=0.0)
    a, b, c, d = seqs([SYS + own(0), own(1), own(2), SYS + own(3)])
    assert [send(r, insts, s) for s in (a, b, c)] == [0, 1, 2]  # no match: least outstanding
    send(r, insts, seqs([own(4)])[0])  # no match: ties -> lowest index, 0 now has 2
    assert send(r, insts, d) == 0  # 4 of d's 6 blocks went to 0


def test_prefix_affinity_below_min_match_balances_load():
    insts = instances(2)
    r = ROUTERS.create("prefix-affinity", min_match=0.9)
    a, b, c = seqs([SYS + own(0), SYS + own(1), SYS + own(2)])
    assert send(r, insts, a) == 0
    assert send(r, insts, b) == 1  # 64 of 96 tokens matched < 0.9: least loaded instead
    assert ROUTERS.create("prefix-affinity", min_match=0).route(c, insts, 0.0) == 0  # no guard


def test_a_full_match_past_max_blocks_counts_as_full():
    """The index compares at most max_blocks blocks; a match was divided by the whole prompt,
    so an identical 8,200-token prompt (> 2 x 256 blocks of 16) fell below min_match and went
    elsewhere, and prefix-work scored a full match on it ~0.5 of its weight."""
    long = list(range(20_000, 28_200))
    insts = instances(2)
    r = ROUTERS.create("prefix-affinity")
    a, b = seqs([long, long])
    assert send(r, insts, a) == 0 and send(r, insts, b) == 0  # 0 is busier: it followed the match
    w = ROUTERS.create("prefix-work", work_weight=0.0, queue_weight=0.0, kv_weight=0.0)
    insts = instances(2)
    a, b = seqs([long, long])
    send(w, insts, a)
    assert w.scores(b, insts) == [pytest.approx(w.params.prefix_weight), 0.0]


def test_prefix_work_trades_the_prefix_against_predicted_work():
    # instance 0 got the prefix and a request predicted to run 5000 tokens; instance 1 is empty.
    # prefix + kv only: instance 0; with the predicted work weighed in: instance 1.
    prompts = [SYS + own(0), own(1), SYS + own(2)]
    est = make_estimates([5000, 10, 10])
    for weights, expect in ((dict(work_weight=0, queue_weight=0), 0), ({}, 1)):
        insts = instances(2)
        r = ROUTERS.create("prefix-work", prompt_weight=0.0, **weights)
        a, b, c = seqs(prompts, estimates=est)
        insts[0].add(a, 0.0), r.routed(a, 0), r.index.add(0, a.request.block_hashes, 16)
        scores = r.scores(c, insts)
        assert send(r, insts, c) == expect, scores
    # instance 0: prefix 3 * 64/96 = 2, work 0 (the most), queue 0 (a waits there), kv 1 (all
    # free: it has not run yet); instance 1: prefix 0, work 2, queue 1, kv 1
    assert scores == pytest.approx([2.0 + 0 + 0 + 1, 0 + 2 + 1 + 1])


def test_prefix_routers_raise_the_hit_rate_of_a_shared_prefix_workload():
    wl = build_workload(WorkloadConfig(num_requests=300, shared_prefix=dict(
        system_prompts=6, system_prompt_tokens=512, mean_turns=3)))  # fmt: skip
    rate = {}
    for router in ("round-robin", "prefix-affinity", "prefix-work"):
        res = simulate(wl, SimConfig(num_instances=3, router=router,
                                     engine=dict(enable_prefix_caching=True)))  # fmt: skip
        rate[router] = res.prefix_hit_rate
    assert rate["prefix-affinity"] > rate["round-robin"] + 0.1
    assert rate["prefix-work"] > rate["round-robin"]


@pytest.mark.parametrize("name, params, field", [
    ("prefix-affinity", {"min_match": 1.5}, "min_match"),
    ("prefix-affinity", {"capacity_tokens": 0}, "capacity_tokens"),
    ("prefix-work", {"prefix_weight": -1}, "prefix_weight"),
    ("prefix-work", {"max_blocks": -1}, "max_blocks"),
])  # fmt: skip
def test_bad_prefix_router_config_names_the_field(name, params, field):
    from presched.sim.setup import build_cluster

    with pytest.raises(ValueError, match=rf"^router_params\.{field}: "):
        build_cluster(SimConfig(num_instances=2, router=name, router_params=params))
