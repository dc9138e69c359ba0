"""The pool's books, driven without gRPC (as test_move.py): queue shares of unlisted fairness
ids, a request moved to a fallback endpoint, the endpoints file's reloads."""

from __future__ import annotations

import asyncio
import os

import pytest

from presched.epp.config import EndpointConfig, EppConfig
from presched.epp.core import Picker, PoolGateway
from presched.epp.endpoints import Pool, initial_endpoints, read_endpoints
from presched.serve.errors import GatewayError
from presched.workload.request import Request


def pool(n=1, **cfg) -> PoolGateway:
    mif = cfg.pop("mif", 1)
    eps = [{"address": f"127.0.0.1:{9000 + i}", "model": "m", "max_in_flight": mif} for i in range(n)]
    return PoolGateway(EppConfig(endpoints=eps, log={"path": None}, **cfg).gateway_config())


def req(i, tenant="default", **kw):
    return Request(id=f"r{i}", prompt_tokens=10, model="m", max_tokens=50, tenant=tenant, **kw)


def test_unlisted_fairness_ids_share_the_queue_as_one_more_tenant_of_weight_1():
    """EppConfig.tenants: "an id not listed shares the rest of the queue with weight 1". Before
    the fix the listed tenants' caps took all of max_queue and the unlisted pool got
    max(1, max_queue - sum) = 1: one request waiting in the whole picker for every other id."""

    async def main():
        gw = pool(tenants=[{"name": "team-a", "weight": 2}], max_queue=9)  # W = 2 + 1
        assert gw.shares.share("team-a") == 6 and gw.shares.share("default") == 3
        gw.accept_in(req(0), None, None, None)  # runs (one slot)
        for i in range(1, 4):  # three wait: the unlisted pool's share
            gw.accept_in(req(i, tenant="x" if i % 2 else "default"), None, None, None)
        with pytest.raises(GatewayError) as e:
            gw.accept_in(req(4, tenant="y"), None, None, None)
        assert e.value.status == 429 and "3 of max_queue 9" in str(e.value)
        for i in range(5, 11):  # the listed tenant still has its own six
            gw.accept_in(req(i, tenant="team-a"), None, None, None)
        assert gw.num_waiting == 9

    asyncio.run(main())


def test_a_request_moved_to_a_fallback_is_told_to_the_new_endpoints_policy():
    """Envoy served the request from a fallback: `move_running` put it in the new endpoint's
    running list without telling that endpoint's policy, so mlfq raised KeyError in on_tokens
    and on_finish (policy_errors 2 per fallback) and kv-admission's footprint missed it."""

    async def main():
        gw = pool(2, policy="mlfq", mif=4)
        a = gw.accept_in(req(0), None, None, None)
        old, new = gw.backends[a.instance], gw.backends[1 - a.instance]
        gw.move_running(a, new)
        assert a in new.running and a not in old.running and not old.healthy
        assert id(a) not in old.policy._state and id(a) in new.policy._state  # on_cancel / on_arrival
        gw.tokens(a, 5)
        gw.finish(a, 5)
        assert gw.policy_errors == 0 and not new.policy._state and not new.running

    asyncio.run(main())


def _write(f, text, n=[0]):  # noqa: B006 - a changed mtime at every write, even on a coarse clock
    f.write_text(text)
    n[0] += 2
    os.utime(f, ns=(n[0], n[0]))


def test_a_bad_endpoints_edit_is_logged_and_the_health_loop_goes_on(tmp_path, caplog):
    """kv-admission needs kv_tokens: an endpoint added without it made Backend() raise in
    set_endpoints inside Pool._loop, which died silently (no more reloads or health checks),
    and Pool.stop raised it again, so EppServer.stop never closed the request log."""
    from epp.conftest import fitted_predictor

    f = tmp_path / "pool.yaml"
    _write(f, "endpoints:\n  - {address: 127.0.0.1:1, kv_tokens: 1000}\n")
    cfg = EppConfig(endpoints_file=f, log={"path": None}, policy="kv-admission", health_interval_s=0.02)
    picker = Picker(cfg, fitted_predictor(), None, initial_endpoints(cfg))
    gw = picker.gw
    live = lambda: sorted(b.name for b in gw.backends if b.index not in gw.retired)  # noqa: E731

    async def main():
        pool = Pool(cfg, picker)
        await pool.start()
        _write(f, "endpoints:\n  - {address: 127.0.0.1:1, kv_tokens: 1000}\n  - {address: 127.0.0.1:2}\n")
        await asyncio.sleep(0.2)
        assert not pool._task.done() and live() == ["127.0.0.1:1"] and len(gw.backends) == 1
        _write(f, "endpoints:\n  - {address: 127.0.0.1:3, kv_tokens: 1000}\n")  # a good edit still applies
        for _ in range(100):
            if live() == ["127.0.0.1:3"]:
                break
            await asyncio.sleep(0.02)
        assert live() == ["127.0.0.1:3"]
        await pool.stop()

    try:
        asyncio.run(main())
    finally:
        picker.close()
    assert "endpoint 127.0.0.1:2: field 'kv_tokens'" in caplog.text and "keeping the endpoints in force" in caplog.text


def test_an_address_listed_twice_is_refused_naming_it(tmp_path):
    """It became two backends: in the file, in the file and `endpoints`, or in a reload."""
    f = tmp_path / "pool.yaml"
    _write(f, "endpoints:\n  - {address: 127.0.0.1:7}\n  - {address: 127.0.0.1:7}\n")
    with pytest.raises(ValueError, match=r"pool.yaml: endpoints: 127\.0\.0\.1:7 is listed twice"):
        read_endpoints(f)
    _write(f, "endpoints:\n  - {address: 127.0.0.1:7}\n")
    cfg = EppConfig(endpoints=[{"address": "127.0.0.1:7"}], endpoints_file=f, log={"path": None})
    with pytest.raises(ValueError, match=r"endpoints and endpoints_file .*: 127\.0\.0\.1:7 is listed twice"):
        initial_endpoints(cfg)
    gw = pool(1)
    with pytest.raises(ValueError, match=r"127\.0\.0\.1:9001 is listed twice"):
        gw.set_endpoints([EndpointConfig(address="127.0.0.1:9001")] * 2)
    assert [b.name for b in gw.backends] == ["127.0.0.1:9000"] and not gw.retired  # nothing changed


def test_edits_to_a_known_endpoint_apply():
    """A reload that changed max_in_flight, kv_tokens or model of a listed endpoint was ignored
    (only additions and removals were), while the log said "endpoints now: ..."."""

    async def main():
        gw = pool(1, policy="mlfq", mif=1)
        b = gw.backends[0]
        seqs = [gw.accept_in(req(i), None, None, None) for i in range(3)]
        assert len(b.running) == 1 and len(b.queue) == 2
        old = b.policy
        gw.set_endpoints([EndpointConfig(address=b.name, model="m", max_in_flight=3, kv_tokens=5000)])
        assert (b.max_in_flight, b.engine.kv_tokens, b.engine.max_num_seqs) == (3, 5000, 3)
        assert len(b.running) == 3 and not b.queue and gw.shares.counts == {}  # released at once
        assert b.policy is not old and not old._state and len(b.policy._state) == 3  # carried over
        gw.set_endpoints([EndpointConfig(address=b.name, model="m2", max_in_flight=3, kv_tokens=5000)])
        assert b.model == "m2" and not b.healthy  # down until a health check (of the new model)
        for s in seqs:
            gw.tokens(s, 2)
            gw.finish(s, 2)
        assert gw.policy_errors == 0 and not b.policy._state and len(gw.backends) == 1

    asyncio.run(main())
