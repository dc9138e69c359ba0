from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from builders import make_requests

from presched.schedule.routers import ROUTERS
from presched.sim.config import EngineConfig
from presched.sim.setup import SimConfig, simulate


def inst(i, seqs=()):
    seqs = list(seqs)
    return SimpleNamespace(index=i, num_outstanding=len(seqs), outstanding=lambda: iter(seqs))


def s(prompt, gen, target, first_token=None, estimate=None):
    return SimpleNamespace(prompt_tokens=prompt, generated=gen, target=target,
                           first_token=first_token, estimate=estimate)  # fmt: skip


def test_round_robin_cycles():
    r = ROUTERS.create("round-robin")
    insts = [inst(i) for i in range(3)]
    assert [r.route(None, insts, 0.0) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_least_requests_picks_fewest_lowest_index_on_ties():
    r = ROUTERS.create("least-requests")
    insts = [inst(0, [s(1, 0, 1)] * 2), inst(1, [s(1, 0, 1)]), inst(2, [s(1, 0, 1)])]
    assert r.route(None, insts, 0.0) == 1


def test_least_work_counts_expected_remaining_tokens():
    oracle = ROUTERS.create("least-work-oracle", prompt_weight=0.0)
    # instance 0: one request with 500 tokens left; instance 1: three with 10 left each
    insts = [inst(0, [s(10, 0, 500, 1.0)]), inst(1, [s(10, 0, 10, 1.0)] * 3)]
    assert oracle.route(None, insts, 0.0) == 1
    # without lengths, least-work uses the running mean of completed lengths (prior 256):
    # 1 x 256 < 3 x 256
    blind = ROUTERS.create("least-work", prompt_weight=0.0)
    assert blind.route(None, insts, 0.0) == 0
    # a predictor's estimate is used when present: 1000 > 3 x 256
    est = SimpleNamespace(point=1000.0)
    insts = [inst(0, [s(10, 0, 500, 1.0, est)]), inst(1, [s(10, 0, 10, 1.0)] * 3)]
    assert blind.route(None, insts, 0.0) == 1


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
    perfect = LengthEstimate.from_quantiles(np.repeat(outs[:, None], len(LEVELS), axis=1).astype(float))
    base = SimConfig(num_instances=4, router="least-work", engine=EngineConfig(max_num_seqs=8))
    blind = simulate(reqs, base).records.e2el
    informed = simulate(reqs, base, estimates=perfect).records.e2el
    oracle = simulate(reqs, base.model_copy(update={"router": "least-work-oracle"})).records.e2el
    assert np.array_equal(informed, oracle)  # perfect predictions route exactly as the oracle
    assert not np.array_equal(informed, blind)  # and the router did read them
    with pytest.raises(ValueError, match="estimates: 1 rows for 800 requests"):
        simulate(reqs, base, estimates=LengthEstimate.from_quantiles(perfect.quantiles[:1]))
