"""The gateway's decisions without HTTP: `Gateway` driven step by step on an asyncio loop, as the
ASGI front (or an Envoy ext_proc front) drives it."""

from __future__ import annotations

import asyncio

import pytest

from presched.serve.config import ServeConfig
from presched.serve.gateway import Gateway, GatewayError
from presched.workload.request import Request


def make_gateway(n_backends=2, max_in_flight=1, **cfg) -> Gateway:
    backends = [{"url": f"http://127.0.0.1:{9000 + i}", "model": "m", "max_in_flight": max_in_flight}
                for i in range(n_backends)]  # fmt: skip
    return Gateway(ServeConfig(backends=backends, log={"path": None}, **cfg))


def req(i: int, n: int | None = None) -> Request:
    return Request(id=f"r{i}", prompt_tokens=10, model="m", max_tokens=n)


def run(coro):
    return asyncio.run(coro)


def test_releases_at_most_max_in_flight_in_policy_order():
    async def main():
        gw = make_gateway(1, max_in_flight=2, policy="sjf-oracle")
        seqs = [gw.accept(req(i, n), target=n) for i, n in enumerate([50, 40, 30, 20, 10])]
        started = [s for s in seqs if s.released.done()]
        assert [s.id for s in started] == ["r0", "r1"] and gw.num_waiting == 3
        order = []
        for _ in range(3):
            done = gw.backends[0].running[0]
            gw.finish(done, 5)
            order.append(gw.backends[0].running[-1].id)
        assert order == ["r4", "r3", "r2"]  # shortest first among the waiting
        assert gw.finished == 3 and gw.num_waiting == 0

    run(main())


def test_a_backend_going_down_hands_its_queue_to_the_others():
    async def main():
        gw = make_gateway(2, max_in_flight=1, router="round-robin")
        seqs = [gw.accept(req(i)) for i in range(6)]  # 3 per backend: 1 running, 2 waiting
        b0, b1 = gw.backends
        waiters = [asyncio.ensure_future(gw.wait(s)) for s in seqs]
        await asyncio.sleep(0)
        on_b0 = [s for s in seqs if s.instance == 0]
        gw.set_health(b0, False)
        assert b0.num_waiting == 0 and b1.num_waiting == 4
        # the moved requests' waiters are released by the healthy backend, one slot at a time
        for _ in range(5):
            gw.finish(b1.running[0], 3)
            await asyncio.sleep(0)
        assert all(w.done() for w in waiters if seqs[waiters.index(w)] not in b0.running)
        assert {s.instance for s in on_b0 if s not in b0.running} == {1}
        gw.cancel(b0.running[0])  # the one that was running on the dead backend ends
        assert gw.num_waiting == 0 and not b0.running

    run(main())


def test_failed_request_moves_then_runs_out_of_backends():
    async def main():
        gw = make_gateway(3, max_in_flight=4, retries=1)
        seq = gw.accept(req(0))
        first = seq.instance
        gw.failed(seq)
        assert seq.instance != first and not gw.backends[first].healthy
        assert seq.released.done()  # a free slot on the next backend: released at once
        with pytest.raises(GatewayError) as e:
            gw.failed(seq)  # retries=1: a second failure is the end
        assert e.value.status == 502
        assert all(not b.running for b in gw.backends)

    run(main())


def test_no_healthy_backend_is_503_and_a_full_queue_is_429():
    async def main():
        gw = make_gateway(1, max_in_flight=1, max_queue=2)
        gw.accept(req(0))
        gw.accept(req(1))
        gw.accept(req(2))
        with pytest.raises(GatewayError) as e:
            gw.accept(req(3))
        assert e.value.status == 429 and e.value.retry_after >= 1
        gw.set_health(gw.backends[0], False)
        gw.cancel(gw.backends[0].running[0])
        assert gw.num_waiting == 2  # kept (no other backend) until it comes back
        gw2 = make_gateway(1)
        gw2.set_health(gw2.backends[0], False)
        with pytest.raises(GatewayError) as e:
            gw2.accept(req(9))
        assert e.value.status == 503
        gw.set_health(gw.backends[0], True)  # back: the queue drains again
        assert gw.backends[0].num_running == 1 and gw.num_waiting == 1

    run(main())


def test_cancel_while_waiting_keeps_router_books_balanced():
    async def main():
        gw = make_gateway(2, max_in_flight=1, router="least-work")
        seqs = [gw.accept(req(i)) for i in range(6)]
        for s in seqs:
            if not s.released.done():
                gw.cancel(s)
                assert s.released.cancelled()
        for b in gw.backends:
            for s in list(b.running):
                gw.finish(s, 7)
        assert gw.num_waiting == 0
        assert sum(gw.router._count.values()) == 0  # every routed request was retired once

    run(main())
