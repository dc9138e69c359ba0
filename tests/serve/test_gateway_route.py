"""The router chooses among the backends a request can use (healthy, serving its model, not
failed it), so its records (prefixes sent, per-backend work) follow the backend the request is
actually sent to. `Gateway` driven without HTTP, as in test_gateway_core.py."""

from __future__ import annotations

import asyncio

from presched.serve.config import ServeConfig
from presched.serve.gateway import Gateway
from presched.workload.request import Request

P = tuple(range(1, 33))  # 32 shared block hashes (512 tokens)


def make_gateway(router, models=("m", "m"), **params) -> Gateway:
    backends = [{"url": f"http://127.0.0.1:{9000 + i}", "model": m, "max_in_flight": 8}
                for i, m in enumerate(models)]  # fmt: skip
    return Gateway(ServeConfig(backends=backends, log={"path": None}, router=router, router_params=params))


def req(i, hashes=P, model="m"):
    return Request(id=f"r{i}", prompt_tokens=16 * len(hashes) + 10, model=model, max_tokens=50,
                   block_hashes=hashes, hash_block_tokens=16)  # fmt: skip


def test_a_prefix_sent_while_the_first_backend_was_down_is_remembered_where_it_went():
    async def main():
        gw = make_gateway("prefix-affinity")
        b0, b1 = gw.backends
        gw.set_health(b0, False)
        a = gw.accept(req(0))  # unrestricted, the router would pick 0 (lowest index)
        assert a.routed == a.instance == 1
        assert gw.router.index.match(P, 2) == [0, 32]
        gw.set_health(b0, True)
        assert gw.accept(req(1)).instance == 1  # the same prefix follows it to where it is

    asyncio.run(main())


def test_least_work_counts_the_work_on_the_backend_that_runs_it():
    async def main():
        gw = make_gateway("least-work", prior_output_tokens=1000)
        b0, b1 = gw.backends
        gw.set_health(b0, False)
        a = gw.accept(req(0))
        gw.set_health(b0, True)
        assert a.instance == 1
        assert gw.router.work(b0, 0) == 0.0 and gw.router.work(b1, 1) > 1000
        assert gw.accept(req(1)).instance == 0  # the empty backend
        gw.finish(a, 40)  # retired from the books of the backend it ran on
        assert gw.router.work(b1, 1) == 0.0

    asyncio.run(main())


def test_a_backend_of_another_model_is_never_chosen_nor_charged():
    async def main():
        gw = make_gateway("least-work", models=("other", "m"), prior_output_tokens=1000)
        seqs = [gw.accept(req(i)) for i in range(3)]
        assert [s.instance for s in seqs] == [1, 1, 1] and [s.routed for s in seqs] == [1, 1, 1]
        assert gw.router.work(gw.backends[0], 0) == 0.0

    asyncio.run(main())


def test_a_request_failed_by_its_backend_is_routed_again_among_the_others():
    async def main():
        gw = make_gateway("prefix-work", models=("m", "m", "m"))
        a = gw.accept(req(0))
        first = a.instance
        gw.failed(a)  # marks `first` down; the router retires a there and routes it again
        assert a.instance != first and a.routed == a.instance
        match = gw.router.index.match(P, 3)
        assert match[a.instance] == 32
        assert gw.router.work(gw.backends[first], first) == 0.0
        assert gw.router.work(gw.backends[a.instance], a.instance) > 0

    asyncio.run(main())
