"""The gateway's decisions without HTTP: `Gateway` driven step by step on an asyncio loop, as the
ASGI front (or an Envoy ext_proc front) drives it."""

from __future__ import annotations

import asyncio

import pytest

from presched.schedule.fcfs import FCFS
from presched.serve.config import ServeConfig, TenantConfig
from presched.serve.errors import GatewayError, PolicyError
from presched.serve.gateway import Gateway
from presched.serve.tenants import QueueShares
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


# --- policies that cannot run, or fail at run time ------------------------------------------------
class Faulty(FCFS):
    """FCFS whose hook `hook` raises for the request with id 'bad' (a stand-in for a policy
    bug or an input it cannot handle)."""

    def __init__(self, hook: str) -> None:
        self.hook = hook

    def _maybe(self, hook: str, seq) -> None:
        if hook == self.hook and seq.id == "bad":
            raise KeyError(f"broken {hook}")

    def on_arrival(self, seq, now):
        self._maybe("on_arrival", seq)

    def priority(self, seq, now):
        self._maybe("priority", seq)
        return seq.arrival

    def admit(self, seq, running, now):
        self._maybe("admit", seq)
        return True

    def on_schedule(self, seq, now):
        self._maybe("on_schedule", seq)

    def on_tokens(self, seq, n, now):
        self._maybe("on_tokens", seq)

    def on_finish(self, seq, now):
        self._maybe("on_finish", seq)


def with_policy(gw: Gateway, policy) -> Gateway:
    for b in gw.backends:
        b.policy, b.queue = policy, policy.new_queue()
    return gw


@pytest.mark.parametrize("hook", ["on_arrival", "priority", "admit", "on_schedule"])
def test_a_policy_hook_that_raises_fails_only_its_request_and_frees_its_slot(hook):
    async def main():
        gw = with_policy(make_gateway(1, max_in_flight=1), Faulty(hook))
        first = gw.accept(req(0))
        bad = gw.accept(Request(id="bad", prompt_tokens=10, model="m"))
        after = gw.accept(req(2))
        gw.finish(first, 3)  # frees the slot: `bad` is admitted or scheduled now
        with pytest.raises(PolicyError) as e:
            await gw.wait(bad)
        assert e.value.status == 500 and hook in str(e.value)
        assert gw.policy_errors == 1
        assert await gw.wait(after) is gw.backends[0]  # the next request got the slot
        assert gw.backends[0].running == [after] and gw.num_waiting == 0
        gw.cancel(bad)  # what the app does when it ends the failed request: nothing left to do
        assert gw.backends[0].running == [after]

    run(main())


@pytest.mark.parametrize("hook", ["on_tokens", "on_finish"])
def test_a_policy_hook_that_raises_on_a_running_request_is_contained(hook):
    async def main():
        gw = with_policy(make_gateway(1, max_in_flight=1), Faulty(hook))
        bad = gw.accept(Request(id="bad", prompt_tokens=10, model="m"))
        nxt = gw.accept(req(1))
        gw.tokens(bad, 1)
        gw.finish(bad, None)  # no usage: no second on_tokens
        assert gw.policy_errors == 1 and gw.finished == 1
        assert gw.backends[0].running == [nxt] and nxt.released.done()

    run(main())


def test_policy_start_up_check_runs_the_lifecycle_and_names_the_field():
    make_gateway(1, policy="mlfq")  # reads no prediction: starts (it crashed with a KeyError)
    with pytest.raises(ValueError, match=r"^predictor: policy 'kv-admission' reads length predictions"):
        make_gateway(1, policy="kv-admission", policy_params={"kv_tokens": 10_000})
    with pytest.raises(ValueError, match=r"^predictor: policy 'mlfq'"):
        make_gateway(1, policy="mlfq", policy_params={"within": "mean"})
    with pytest.raises(ValueError, match=r"^policy_params\.e2e_slo_s: policy 'slo'"):
        Gateway(ServeConfig(backends=[{"url": "http://127.0.0.1:9"}], log={"path": None},
                            policy="slo", policy_params={"tpot_s": 0.01}), predicts=True)  # fmt: skip


def test_a_wakeup_at_time_zero_is_kept():
    class WakeAtZero(FCFS):
        """Refuses the first admission and asks to decide again at t = 0."""

        def __init__(self) -> None:
            self.asked = 0

        def admit(self, seq, running, now):
            self.asked += 1
            return self.asked > 1

        def wakeup(self, now):
            return 0.0

    async def main():
        backends = [{"url": "http://127.0.0.1:9", "model": "m", "max_in_flight": 1}]
        gw = Gateway(ServeConfig(backends=backends, log={"path": None}), clock=lambda: 5.0)  # now = 0.0
        with_policy(gw, WakeAtZero())
        seq = gw.accept(req(0))
        assert not seq.released.done()  # refused once
        for _ in range(3):
            await asyncio.sleep(0)
        assert seq.released.done()  # decided again at the wakeup (a 0.0 wakeup was dropped)

    run(main())


# --- per-tenant queue shares --------------------------------------------------------------------
def test_a_flooding_tenant_gets_429_while_another_is_still_accepted():
    tenants = [{"name": "flood", "api_key": "k1"}, {"name": "calm", "api_key": "k2"}]

    async def main():
        gw = make_gateway(1, max_in_flight=1, max_queue=4, tenants=tenants)
        flood = [Request(id=f"f{i}", prompt_tokens=5, tenant="flood", model="m") for i in range(4)]
        for r in flood[:3]:  # one runs, two wait: its share of 4 is 2
            gw.accept(r)
        with pytest.raises(GatewayError) as e:
            gw.accept(flood[3])
        assert e.value.status == 429 and "'flood'" in str(e.value) and e.value.kind == "rate_limit_error"
        for i in range(2):
            gw.accept(Request(id=f"c{i}", prompt_tokens=5, tenant="calm", model="m"))
        assert gw.shares.counts == {"flood": 2, "calm": 2} and gw.num_waiting == 4

    run(main())


def test_queue_shares_follow_the_weights_and_the_rest_is_shared():
    tenants = [TenantConfig(name="gold", api_key="a", weight=3), TenantConfig(name="free", api_key="b")]
    s = QueueShares(tenants, 10)
    assert (s.share("gold"), s.share("free"), s.share("other")) == (7, 2, 1)
    s.add("other")
    assert s.waiting("another") == 1  # unconfigured names share one pool
    s.sub("other")
    assert s.counts == {}
    assert QueueShares([], 10).share("default") == 10


def test_a_queue_that_fails_on_a_rekey_fails_its_waiting_requests_and_starts_afresh():
    class BrokenRekey(FCFS):
        """Keys change at t = 1 (`rekey_at`); from then on `priority` raises while `broken`."""

        broken = False

        def priority(self, seq, now):
            if self.broken:
                raise ValueError("cannot order")
            return seq.arrival

        def rekey_at(self, seq, now):
            return 1.0 if now < 1.0 else None

    async def main():
        t = [0.0]
        backends = [{"url": "http://127.0.0.1:9", "model": "m", "max_in_flight": 1}]
        gw = Gateway(ServeConfig(backends=backends, log={"path": None}), clock=lambda: t[0])
        policy = BrokenRekey()
        with_policy(gw, policy)
        seqs = [gw.accept(req(i)) for i in range(3)]
        policy.broken, t[0] = True, 2.0
        gw.finish(seqs[0], 3)  # the next decision re-keys the two waiting requests: it raises
        for s in seqs[1:]:
            with pytest.raises(PolicyError, match="the waiting queue"):
                await gw.wait(s)
        assert gw.policy_errors == 2 and gw.num_waiting == 0 and gw.shares.counts == {}
        policy.broken = False
        assert await gw.wait(gw.accept(req(9))) is gw.backends[0]  # a fresh queue serves

    run(main())
