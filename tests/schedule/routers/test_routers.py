from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from builders import make_estimates, make_requests

from presched.schedule.routers import ROUTERS
from presched.sim.config import EngineConfig
from presched.sim.setup import SimConfig, build_cluster, simulate


def inst(i, seqs=()):
    seqs = list(seqs)
    return SimpleNamespace(index=i, num_outstanding=len(seqs), outstanding=lambda: iter(seqs))


def s(prompt, gen, target):
    return SimpleNamespace(prompt_tokens=prompt, generated=gen, target=target)


def test_round_robin_cycles():
    r = ROUTERS.create("round-robin")
    insts = [inst(i) for i in range(3)]
    assert [r.route(None, insts, 0.0) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_least_requests_picks_fewest_lowest_index_on_ties():
    r = ROUTERS.create("least-requests")
    insts = [inst(0, [s(1, 0, 1)] * 2), inst(1, [s(1, 0, 1)]), inst(2, [s(1, 0, 1)])]
    assert r.route(None, insts, 0.0) == 1


def test_load_aware_routing_beats_round_robin_on_skewed_lengths():
    rng = np.random.default_rng(0)
    n = 1500
    outs = np.where(rng.random(n) < 0.1, 1500, 20).tolist()
    reqs = make_requests([(64, o) for o in outs], rate=20.0, seed=1)
    base = SimConfig(num_instances=4, engine=EngineConfig(max_num_seqs=8))
    e2e = {name: simulate(reqs, base.model_copy(update={"router": name})).records.e2el.mean()
           for name in ("round-robin", "least-requests", "least-work-oracle")}  # fmt: skip
    assert e2e["least-work-oracle"] < 0.95 * e2e["round-robin"]
    assert e2e["least-requests"] < 0.95 * e2e["round-robin"]


def test_least_work_reads_predictions_attached_by_the_simulator():
    from presched.predict import LEVELS, LengthEstimate

    rng = np.random.default_rng(0)
    outs = np.where(rng.random(800) < 0.1, 1500, 20)
    reqs = make_requests([(64, int(o)) for o in outs], rate=20.0, seed=1)
    perfect = LengthEstimate.from_quantiles(
        np.repeat(outs[:, None], len(LEVELS), axis=1).astype(float)
    )
    base = SimConfig(
        num_instances=4,
        router="least-work",
        engine=EngineConfig(max_num_seqs=8),
        router_params={"stat": "point"},
    )  # counted down: max(point - g, 1)
    blind = simulate(reqs, base).records.e2el
    informed = simulate(reqs, base, estimates=perfect).records.e2el
    oracle = simulate(
        reqs, base.model_copy(update={"router": "least-work-oracle", "router_params": {}})
    ).records.e2el
    assert np.array_equal(informed, oracle)  # exact point predictions route as the oracle
    assert not np.array_equal(informed, blind)  # and the router did read them
    with pytest.raises(ValueError, match="estimates: 1 rows for 800 requests"):
        simulate(reqs, base, estimates=LengthEstimate.from_quantiles(perfect.quantiles[:1]))


PREDICTIVE = ["least-work", "least-work-oracle", "p2c-work", "short-long"]


@pytest.mark.parametrize("name", PREDICTIVE)
def test_every_request_finishes_once_and_the_router_forgets_it(name):
    reqs = make_requests(n=400, rate=30.0, seed=2)
    est = make_estimates([r.target_tokens for r in reqs], sigma=0.5)
    cfg = SimConfig(
        num_instances=3, router=name, engine=EngineConfig(max_num_seqs=8, num_blocks=200)
    )
    cluster = build_cluster(cfg)
    res = cluster.run(reqs, estimates=est)
    rec = res.records
    assert len(rec) == 400 and sorted(s.index for s in res.seqs) == list(range(400))
    assert np.isfinite(rec.finish).all()
    assert (rec.output_tokens == [r.target_tokens for r in reqs]).all()
    assert set(rec.instance.tolist()) == {0, 1, 2}
    assert res.num_preemptions > 0  # KV pressure: preempted requests are still counted right
    assert [len(i.finished) for i in cluster.instances] == np.bincount(rec.instance).tolist()
    r = cluster.router
    assert r._at_arrival == {} and not any(r._count.values()) and not any(r._nblind.values())
    assert not any(r._fixed.values())
    if name == "short-long":
        assert r._long == set() and not any(r._nlong.values())
    assert ROUTERS.get(name).needs_progress  # they read `generated`


def test_count_routers_do_not_need_progress():
    assert not ROUTERS.get("round-robin").needs_progress
    assert not ROUTERS.get("least-requests").needs_progress


@pytest.mark.parametrize("name, params, field", [
    ("least-work", {"stat": "rank"}, "stat"),
    ("least-work", {"stat": "q42"}, "stat"),
    ("least-work", {"prompt_weight": -1}, "prompt_weight"),
    ("least-work", {"prior_output_tokens": 0}, "prior_output_tokens"),
    ("p2c-work", {"d": 0}, "d"),
    ("p2c-work", {"d": 1.5}, "d"),
    ("p2c-work", {"seed": "x"}, "seed"),
    ("p2c-work", {"stat": "bogus"}, "stat"),
    ("short-long", {"threshold_tokens": 0}, "threshold_tokens"),
    ("short-long", {"long_fraction": 1.0}, "long_fraction"),
    ("short-long", {"window": 0}, "window"),
    ("short-long", {"stat": "rank"}, "stat"),
])  # fmt: skip
def test_bad_router_config_names_the_field(name, params, field):
    cfg = SimConfig(num_instances=2, router=name, router_params=params)
    with pytest.raises(ValueError, match=rf"^router_params\.{field}: "):
        build_cluster(cfg)


def test_unknown_router_parameter_is_a_value_error():
    cfg = SimConfig(num_instances=2, router="p2c-work", router_params={"k": 3})
    with pytest.raises(ValueError, match=r"^router_params\.k: Extra inputs are not permitted$"):
        build_cluster(cfg)
