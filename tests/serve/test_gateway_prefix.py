"""The gateway hashes prompts for prefix-aware routers, with the simulator's chain hash, over
real HTTP in front of two stand-in engines (`StubEngine`, a test double: the routing decision
is the gateway's, so what the engines do does not matter here)."""

from __future__ import annotations

import httpx

from presched.serve.app import build_app
from presched.serve.config import ServeConfig
from presched.serve.tokens import encoder
from presched.workload.prefix import chain_hashes

SYSTEM = " ".join(f"rule{i} says be brief and exact." for i in range(60))  # ~500 tokens


def post(url, prompt):
    r = httpx.post(url + "/v1/completions", timeout=30,
                   json={"model": "stub", "prompt": prompt, "max_tokens": 2})  # fmt: skip
    assert r.status_code == 200, r.text
    return r


def test_prefix_affinity_sends_a_shared_prefix_to_the_backend_that_got_it(asgi_server, stub_server):
    (u0, _), (u1, _) = stub_server(), stub_server()
    backends = [{"url": u, "model": "stub", "max_in_flight": 4} for u in (u0, u1)]
    app = build_app(ServeConfig(backends=backends, log={"path": None}, router="prefix-affinity"))
    url = asgi_server(app)
    gw = app.state.gateway.gw
    seen = []
    route = gw.router.route

    def spy(seq, instances, now, allowed=None):
        i = route(seq, instances, now, allowed)
        seen.append((seq.request, i))
        return i

    gw.router.route = spy
    other = "Something unrelated entirely, " * 20
    encode, _ = encoder(None)
    gw.router.index.add(1, chain_hashes(encode(other), 16), 16)  # as if sent to backend 1 before
    post(url, SYSTEM + " Question one?")  # no match, both idle: the lowest index, 0
    post(url, other + " and more")  # its prefix went to 1
    post(url, SYSTEM + " Question two, a different one?")
    post(url, SYSTEM + " Question three?")
    where = [i for _, i in seen]
    assert where == [0, 1, 0, 0]
    first = seen[0][0]
    assert first.hash_block_tokens == 16 and len(first.block_hashes) >= 20
    assert first.block_hashes == chain_hashes(encode(SYSTEM + " Question one?"), 16)
    shared = sum(a == b for a, b in zip(first.block_hashes, seen[2][0].block_hashes))
    assert shared >= 20


def test_routers_without_prefix_leave_prompts_unhashed(asgi_server, stub_server):
    u, _ = stub_server()
    app = build_app(ServeConfig(backends=[{"url": u, "model": "stub"}], log={"path": None}))
    assert app.state.gateway.encode is None
    url = asgi_server(app)
    post(url, SYSTEM)
