"""The gateway keeps nothing of a request once it has ended: rounds of requests through the real
gateway (uvicorn on loopback, its SQLite log) and the stub (a TEST DOUBLE of an engine, real
HTTP) leave no request object alive, no more objects of any kind than before, and nothing in the
gateway's books.

Each round: streams and whole responses, some chat, some clients that leave while queued (one
slot, so most requests wait), all at once. After a warm-up round, the objects the garbage
collector tracks (containers: dicts holding objects, lists, tasks, futures, class instances) are
counted by type after each round; a request that left one such object behind adds a hundred a
round. Not measured here: bytes. The process-wide live heap (`sys.getallocatedblocks`, the
`presched_python_allocated_blocks` of /metrics) moves by thousands of blocks between rounds in
this process (the test's client, three event loops, CPython's free lists), and resident memory
keeps the allocator's high-water mark (docs/gateway.md, Memory); `benchmarks/held_memory.py`
and the soak measure those. A leak of bare strings or numbers (not containers) is not seen.
"""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections import Counter

import httpx

from presched.serve.seq import GatewaySeq
from presched.workload.request import Request
from serve.test_gateway_faults import await_until, client, drive, settled, start_gateway

ROUND = 100  # requests per round


def _dead_ref(o) -> bool:
    """A weak reference whose object is gone: sqlite3 keeps these for its cursors (the log
    writer's) and drops them every 200 cursors."""
    return type(o) is weakref.ref and o() is None


async def _one(c: httpx.AsyncClient, url: str, i: int) -> None:
    chat = i % 4 == 1
    payload = {"model": "stub", "max_tokens": 3 + i % 5, "stream": i % 2 == 0}
    payload.update({"messages": [{"role": "user", "content": f"round request {i}"}]} if chat
                   else {"prompt": f"round request {i} " + "word " * (i % 7)})  # fmt: skip
    timeout = 0.3 if i % 5 == 3 else 8.0  # these leave, mostly while queued (the gateway logs 499)
    try:
        async with c.stream("POST", url + ("/v1/chat/completions" if chat else "/v1/completions"),
                            json=payload, timeout=timeout) as r:  # fmt: skip
            await r.aread()
    except httpx.TimeoutException:
        pass


def test_rounds_of_requests_leave_nothing_of_theirs_behind(asgi_server, stub_server, tmp_path):
    up, eng = stub_server(token_s=0.001)
    g = start_gateway(asgi_server, tmp_path, [("a", up)], max_in_flight=1)
    gw = g.gw
    counts: list[Counter] = []

    async def main():
        limits = httpx.Limits(max_connections=ROUND, max_keepalive_connections=0)  # no reuse races
        async with client(limits=limits) as c:
            gc.collect()
            counts.append(Counter(type(o) for o in gc.get_objects() if not _dead_ref(o)))  # before
            for r in range(4):
                await asyncio.gather(*(_one(c, g.url, r * ROUND + i) for i in range(ROUND)))
                await await_until(lambda: gw.ended == gw.accepted and g.log.count() >= gw.accepted,
                                  what="every request ended and logged")  # fmt: skip
                await asyncio.sleep(0.2)  # connections the leaving clients closed are gone
                eng.started.clear()  # the stub's own record of what it ran
                gc.collect()
                counts.append(Counter(type(o) for o in gc.get_objects() if not _dead_ref(o)))

    drive(g, main)
    df = settled(g)
    assert len(df) > 3 * ROUND and (df["status"] == 499).sum() >= ROUND // 10  # some left queued
    # no request outlives its end, not even in a queue's heap (others' may: earlier tests')
    assert [(c[GatewaySeq], c[Request]) for c in counts[1:]] == [(counts[0][GatewaySeq], counts[0][Request])] * 4
    grown = {t.__qualname__: n for t, n in (counts[4] - counts[2]).items() if n >= ROUND // 4}
    assert not grown, f"objects that grew over 2 rounds of {ROUND} requests: {grown}"
    b = gw.backends[0]
    assert not b.running and not b.queue and not b.queue._heap and not b.queue._timers
    assert len(gw._wakeups) <= 1 and gw.shares.waiting("default") == 0
