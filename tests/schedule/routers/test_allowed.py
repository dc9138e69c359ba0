"""`route(..., allowed)`: every router chooses among the allowed instances only and keeps its
records (work, long count, prefixes sent) on the instance it chose, by position in the full
list; without `allowed` nothing changes (the simulator's routes are checked in the other files)."""

from __future__ import annotations

import pytest
from builders import constant_steps, make_estimates, make_requests

from presched.schedule import POLICIES
from presched.schedule.routers import ROUTERS
from presched.sim.config import EngineConfig
from presched.sim.instance import Instance
from presched.sim.seq import Seq
from presched.workload.prefix import with_hashes

PROMPT = list(range(64))  # 4 blocks of 16


def instances(n):
    return [Instance(i, EngineConfig(), 1000, POLICIES.create("fcfs"), constant_steps(), True, False)
            for i in range(n)]  # fmt: skip


def seq(i=0, prompt=PROMPT, output=40):
    r = make_requests([(len(prompt), output)], [0.0])[0]
    s = Seq(with_hashes(r, prompt, 16), i)
    s.estimate = make_estimates([output], sigma=0.5)[0]
    return s


def create(name, **params):
    params = {"short-long": {"threshold_tokens": 20}, "p2c-work": {"d": 3}}.get(name, {}) | params
    return ROUTERS.create(name, **params)


@pytest.mark.parametrize("name", ROUTERS.names())
def test_every_router_chooses_among_the_allowed_instances(name):
    # three idle instances: unrestricted, every router takes the lowest index, 0
    assert create(name).route(seq(), instances(3), 0.0) == 0
    r, insts = create(name), instances(3)
    got = []
    for k in range(4):
        s = seq(k)
        i = r.route(s, insts, 0.0, [1, 2])
        insts[i].add(s, 0.0)
        got.append(i)
    assert set(got) <= {1, 2} and 1 in got
    assert r.route(seq(9), insts, 0.0, [2]) == 2


def test_p2c_samples_among_the_allowed_instances():
    r, insts = create("p2c-work", d=1), instances(4)
    assert {r.route(seq(k), insts, 0.0, [1, 3]) for k in range(40)} == {1, 3}


@pytest.mark.parametrize("name", ["least-work", "p2c-work", "short-long", "prefix-work", "least-work-oracle"])
def test_the_work_is_recorded_on_the_instance_chosen(name):
    r, insts = create(name), instances(3)
    s = seq()
    i = r.route(s, insts, 0.0, [2])
    insts[i].add(s, 0.0)
    assert i == 2
    assert [r.work(x, x.index) for x in insts][:2] == [0.0, 0.0] and r.work(insts[2], 2) > 0
    if name == "short-long":
        assert dict(r._nlong) == {2: 1}  # a long request (threshold 20 < 40) counted there
    r.on_finish(s, 2, 1.0)
    assert r.work(insts[2], 2) == 0.0


@pytest.mark.parametrize("name", ["prefix-affinity", "prefix-work"])
def test_the_prefix_is_remembered_where_it_was_sent_and_followed_there(name):
    # prefix-work scored on its prefix alone here (idle instances win on work and queue)
    r = create(name, work_weight=0, queue_weight=0) if name == "prefix-work" else create(name)
    insts = instances(2)
    a = seq(0)
    assert r.route(a, insts, 0.0, [1]) == 1  # 0 is not allowed (down, say)
    insts[1].add(a, 0.0)
    assert r.index.match(a.request.block_hashes, 2) == [0, 4]
    b = seq(1)  # the same prefix, both allowed: it follows to 1
    assert r.route(b, insts, 0.0) == 1
