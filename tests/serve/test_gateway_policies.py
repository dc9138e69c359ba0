"""Every registered policy inside the gateway: start-up refusals name the field, and random
lifecycles (arrivals, tokens, completions, cancels, failures, backends going down and up) leave
no exception, no slot and no per-request policy state behind.

Driven on `Gateway` directly, as the ASGI app drives it (no HTTP: the HTTP paths are covered in
test_gateway_api.py and test_gateway_order.py). The clock is a test clock the driver advances.
"""

from __future__ import annotations

import asyncio
import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from presched.schedule.registry import POLICIES
from presched.serve.config import ServeConfig
from presched.serve.errors import GatewayError
from presched.serve.gateway import Gateway
from presched.serve.probe import probe_estimate
from presched.workload.request import Request

# what each policy needs of the configuration to run in a gateway (SLOs, a TPOT, KV capacity)
PARAMS = {"slo": {"e2e_slo_s": 30.0, "tpot_s": 0.01}}
FIELD = re.compile(r"^(predictor|policy|policy_params\.\w+): ")


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def make(policy: str, predicts: bool, mode: str = "queue", n_backends: int = 2, **cfg) -> Gateway:
    backends = [{"url": f"http://127.0.0.1:{9000 + i}", "model": "m", "max_in_flight": 2,
                 "kv_tokens": 4000} for i in range(n_backends)]  # fmt: skip
    tenants = [{"name": "a", "api_key": "ka", "weight": 2}, {"name": "b", "api_key": "kb"}]
    conf = ServeConfig(backends=backends, log={"path": None}, policy=policy, mode=mode,
                       policy_params=PARAMS.get(policy, {}), tenants=tenants, max_queue=12, **cfg)  # fmt: skip
    return Gateway(conf, predicts=predicts, clock=Clock())


def references(root, ids: set[int]) -> list[str]:
    """Paths from `root` to any of the requests whose ids are `ids`, or to an int equal to one
    of those ids (a dict keyed by id(seq)): per-request state a policy still holds."""
    found, seen, todo = [], set(), [(root, "policy")]
    while todo:
        obj, path = todo.pop()
        if isinstance(obj, int) and not isinstance(obj, bool):
            if obj in ids:
                found.append(path)
            continue
        if isinstance(obj, (str, bytes, float, bool, type(None))) or id(obj) in seen:
            continue
        seen.add(id(obj))
        if id(obj) in ids:
            found.append(path)
            continue
        if isinstance(obj, dict):
            todo += [(k, f"{path}[key]") for k in obj] + [(v, f"{path}[{k!r}]") for k, v in obj.items()]
        elif isinstance(obj, (list, tuple, set, frozenset)):
            todo += [(v, f"{path}[{i}]") for i, v in enumerate(obj)]
        elif type(obj).__module__.startswith("presched"):  # policies, their states, trackers
            attrs = dict(getattr(obj, "__dict__", {}))
            for cls in type(obj).__mro__:
                for name in getattr(cls, "__slots__", ()):
                    if hasattr(obj, name):
                        attrs[name] = getattr(obj, name)
            todo += [(v, f"{path}.{k}") for k, v in attrs.items()]
    return found


# arrivals outnumber completions, so queues build up and cancels and moves hit waiting requests
OPS = st.lists(st.tuples(st.sampled_from(["arrive"] * 4 + ["tokens", "finish", "cancel", "cancel",
                                          "gone", "failed", "down", "up"]),
                         st.integers(0, 50), st.integers(1, 40), st.floats(0, 5)),  # fmt: skip
               min_size=1, max_size=60)


def drive(gw: Gateway, clock: Clock, ops, predicts: bool) -> None:
    seqs, live = [], []  # every request accepted; those not yet ended

    def end(seq) -> None:
        live.remove(seq)
        gw.cancel(seq)  # what the app does for any request that did not complete

    def running():
        return [s for s in live if s.released.done() and not s.released.cancelled()
                and s.released.exception() is None and s in gw.backends[s.instance].running]  # fmt: skip

    for op, i, n, dt in ops:
        clock.t += dt
        if op == "arrive":
            tenant = "ab"[i % 2]
            est = probe_estimate(float(n) * 3) if predicts else None
            r = Request(id=f"r{len(seqs)}", prompt_tokens=n, tenant=tenant, model="m", max_tokens=n)
            try:
                s = gw.accept(r, target=n, estimate=est)
            except GatewayError as e:
                assert e.status in (429, 503), e
                continue
            seqs.append(s)
            live.append(s)
        elif op in ("tokens", "finish", "failed") and running():
            s = running()[i % len(running())]
            if op == "tokens":
                s.on_token(gw.now())
                gw.tokens(s, 1)
            elif op == "finish":
                live.remove(s)
                gw.finish(s, s.generated + n)
            else:
                try:
                    gw.failed(s)
                except GatewayError as e:
                    assert e.status in (502, 503), e
                    end(s)
        elif op == "cancel" and live:
            end(live[i % len(live)])
        elif op == "gone" and live:  # the client left while waiting: its task is cancelled
            s = live[i % len(live)]
            if not s.released.done():
                s.released.cancel()
        elif op in ("down", "up"):
            gw.set_health(gw.backends[i % len(gw.backends)], op == "up")
    for b in gw.backends:
        gw.set_health(b, True)
    while live:
        run = running()
        if run:
            live.remove(run[0])
            gw.finish(run[0], run[0].generated + 1)
        else:
            end(live[0])
    assert gw.policy_errors == 0
    for b in gw.backends:
        assert not b.running and len(b.queue) == 0, b
        assert references(b.policy, {id(s) for s in seqs}) == [], b.policy.name
    assert gw.num_waiting == 0 and gw.shares.counts == {}
    assert gw.accepted == len(seqs)


@pytest.mark.parametrize("predicts", [True, False], ids=["predictor", "no-predictor"])
@pytest.mark.parametrize("policy", POLICIES.names())
@settings(max_examples=40, deadline=None)
@given(ops=OPS, mode=st.sampled_from(["queue", "passthrough"]))
def test_every_policy_survives_the_gateway_lifecycle(policy, predicts, ops, mode):
    async def main():
        try:
            gw = make(policy, predicts, mode)
        except ValueError as e:
            assert not predicts, f"{policy} refused with a predictor: {e}"
            assert FIELD.match(str(e)), str(e)
            return
        drive(gw, gw.clock, ops, predicts)

    asyncio.run(main())


@pytest.mark.parametrize("policy", POLICIES.names())
def test_policies_that_read_predictions_are_refused_naming_the_predictor(policy):
    """Without a predictor a policy either runs (the lifecycle test) or is refused with
    `predictor: ...`; with one, every policy starts."""
    make(policy, True)
    try:
        make(policy, False)
    except ValueError as e:
        assert str(e).startswith("predictor: "), str(e)


@pytest.mark.parametrize("policy", POLICIES.names())
def test_requests_that_leave_waiting_leave_no_policy_state(policy):
    """Fill both backends' queues, cancel half the waiting requests, take a backend down (its
    waiting requests move), cancel the rest: each policy keeps nothing for any of them, and
    the requests that ran finish cleanly. (Before `on_cancel`, MLFQ kept every cancelled one.)"""

    async def main():
        gw = make(policy, True)
        seqs = [gw.accept(Request(id=f"r{i}", prompt_tokens=5 + i, tenant="ab"[i % 2], model="m"),
                          target=10 + i, estimate=probe_estimate(10.0 + i)) for i in range(12)]  # fmt: skip
        waiting = [s for s in seqs if not s.released.done()]
        assert len(waiting) == 8
        for s in waiting[::2]:
            gw.cancel(s)
        gw.set_health(gw.backends[0], False)
        assert gw.backends[0].num_waiting == 0
        for s in waiting[1::2]:
            gw.cancel(s)
        ids = {id(s) for s in waiting}
        for b in gw.backends:
            assert references(b.policy, ids) == [], b.policy.name
        for b in gw.backends:
            for s in list(b.running):
                gw.finish(s, 3)
        for b in gw.backends:
            assert references(b.policy, {id(s) for s in seqs}) == [], b.policy.name
        assert gw.policy_errors == 0 and gw.shares.counts == {}

    asyncio.run(main())


def test_vtc_refunds_the_advance_charge_of_a_cancelled_request():
    """Charged at admission w_in * prompt + w_out * predicted; cancelled after g tokens, the
    tenant keeps w_in * prompt + w_out * g (what it was served), and nothing is left keyed to
    the request."""

    async def main():
        backends = [{"url": "http://127.0.0.1:9", "model": "m", "max_in_flight": 1}]
        gw = Gateway(ServeConfig(backends=backends, log={"path": None}, policy="vtc",
                                 policy_params={"charge_predicted": "mean"}), predicts=True)  # fmt: skip
        vtc = gw.backends[0].policy
        est = probe_estimate(100.0)
        s = gw.accept(Request(id="r", prompt_tokens=10, tenant="default", model="m"), estimate=est)
        assert vtc.counters["default"] == pytest.approx(10 + 2 * est.mean)
        for _ in range(3):
            s.on_token(gw.now())
            gw.tokens(s, 1)
        gw.cancel(s)
        assert vtc.counters["default"] == pytest.approx(10 + 2 * 3) and vtc._charged == {}

    asyncio.run(main())


def test_fallback_learns_nothing_from_a_cancelled_request():
    async def main():
        backends = [{"url": "http://127.0.0.1:9", "model": "m", "max_in_flight": 1}]
        gw = Gateway(ServeConfig(backends=backends, log={"path": None}, policy="fallback",
                                 policy_params={"inner": "sjf"}), predicts=True)  # fmt: skip
        fb = gw.backends[0].policy
        a, b = (gw.accept(Request(id=f"r{i}", prompt_tokens=5, model="m"), estimate=probe_estimate(50.0))
                for i in range(2))  # fmt: skip
        a.on_token(gw.now())
        gw.cancel(a)  # running; its client left after 1 token: 1 is no true length
        assert fb.tracker.n == 0
        gw.finish(b, 40)  # a completion is learned from
        assert fb.tracker.n == 1

    asyncio.run(main())
