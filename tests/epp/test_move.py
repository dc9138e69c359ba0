"""A request the proxy served from a fallback endpoint moves there in the router's records as
well (`PoolGateway.move_running`): the prefixes it sent and the work it carries are counted on
the endpoint that runs it. The decision core driven without gRPC, as tests/serve/test_gateway_route.py."""

from __future__ import annotations

import asyncio

from presched.epp.config import EppConfig
from presched.epp.core import PoolGateway
from presched.workload.request import Request

P = tuple(range(1, 33))  # 32 shared block hashes (512 tokens)


def pool(router, **params) -> PoolGateway:
    cfg = EppConfig(endpoints=[{"address": f"127.0.0.1:{9000 + i}", "model": "m", "max_in_flight": 8}
                               for i in range(2)], router=router, router_params=params)  # fmt: skip
    return PoolGateway(cfg.gateway_config())


def req(i, hashes=P):
    return Request(id=f"r{i}", prompt_tokens=16 * len(hashes) + 10, model="m", max_tokens=50,
                   block_hashes=hashes, hash_block_tokens=16)  # fmt: skip


def start(gw, r):
    seq = gw.accept_in(r, None, None, None)
    assert seq in gw.backends[seq.instance].running  # released to run at once (slots free)
    return seq


def test_a_moved_request_carries_its_work_to_the_endpoint_that_runs_it():
    async def main():
        gw = pool("least-work", prior_output_tokens=1000)
        b0, b1 = gw.backends
        a = start(gw, req(0))
        assert a.instance == 0 and gw.router.work(b0, 0) > 1000
        gw.move_running(a, b1)
        assert (a.instance, a.routed) == (1, 1)
        assert gw.router.work(b0, 0) == 0.0 and gw.router.work(b1, 1) > 1000
        gw.finish(a, 40)  # retired from the books of the endpoint it ran on
        assert gw.router.work(b1, 1) == 0.0

    asyncio.run(main())


def test_a_moved_request_records_its_prefix_where_it_ran():
    async def main():
        gw = pool("prefix-affinity")
        b0, b1 = gw.backends
        a = start(gw, req(0))
        assert a.instance == 0
        gw.move_running(a, b1)  # b0 failed it and is down now
        # b1 computed the prompt, so it is recorded there (b0 keeps its record: it was sent
        # the prompt too, and the router cannot know how far it got)
        assert gw.router.index.match(P, 2)[1] == 32
        b = start(gw, req(1))  # with b0 down, the same prefix follows it
        assert b.instance == 1

    asyncio.run(main())
