"""Faults through the real Envoy: an endpoint that dies mid-run (Envoy falls back to the next listed one),
no endpoint at all. Each test puts the stack back as it found it."""

from __future__ import annotations

import threading
import time

import httpx

from epp.test_through_envoy import SHORT, post


def _addrs(stack) -> list[str]:
    return [e.address for e in stack.st.picker.cfg.endpoints]


def _until(pred, timeout_s: float = 15.0) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError("condition not met in time")


def test_an_endpoint_killed_mid_run_envoy_falls_back_each_answered_and_logged_once(stack):
    st, gw = stack.st, stack.st.picker.gw
    n_rows = len(stack.rows())
    # health checks paused: the picker learns of the death only from what the proxy reports,
    # so it keeps picking the dead endpoint as a primary and Envoy must fall back
    st.call(st.server.pool.stop())
    try:
        with httpx.Client(timeout=30) as c:
            with c.stream("POST", f"{stack.url}/v1/completions",
                          json={"model": "tiny", "prompt": SHORT, "max_tokens": 500, "stream": True}) as r:
                rid, victim = r.headers["x-request-id"], r.headers["x-presched-endpoint"]
                it = r.iter_raw()
                next(it)
                st.stop_engine(_addrs(stack).index(victim))
                try:
                    for _ in it:
                        pass
                except httpx.HTTPError:
                    pass  # the proxy cut the stream: the endpoint is gone
        stack.idle()
        assert st.call_soon(lambda: gw.by_address(victim).healthy)  # a cut stream is no verdict
        after: list = [None] * 6
        ts = [threading.Thread(target=lambda i=i: after.__setitem__(i, post(stack.url, {"prompt": SHORT, "max_tokens": 3})))
              for i in range(6)]  # fmt: skip
        for t in ts:
            t.start()
        for t in ts:
            t.join(30)
        stack.idle()
    finally:
        st.call(st.server.pool.start())
    # 6 at once over 3 endpoints of 2 slots: the dead one is some requests' primary, and
    # Envoy's override_host retries each on the next listed endpoint: no 503
    assert [a.status_code for a in after] == [200] * 6
    assert all(a.headers["x-presched-endpoint"] != victim for a in after)
    rows = stack.rows()
    assert [x["status"] for x in rows if x["id"] == rid] == [499]
    new = {x["id"]: x for x in rows[n_rows:] if x["id"] != rid}
    assert sorted(new) == sorted(a.headers["x-request-id"] for a in after)  # each logged once
    assert len(rows) == n_rows + 7
    assert any(x["retries"] >= 1 for x in new.values())  # a fallback took it (the work moved)
    assert all(x["backend"] != victim for x in new.values())
    assert not st.call_soon(lambda: gw.by_address(victim).healthy)  # the fallback marked it down
    st.restart_engine(_addrs(stack).index(victim))
    _until(lambda: st.call_soon(lambda: gw.by_address(victim).healthy))


def test_no_endpoint_is_503_and_endpoints_can_change(stack):
    st, gw = stack.st, stack.st.picker.gw
    eps = list(st.picker.cfg.endpoints)
    st.call_soon(gw.set_endpoints, [])
    try:
        r = post(stack.url, {"prompt": SHORT, "max_tokens": 2})
        assert r.status_code == 503 and r.json()["error"]["type"] == "server_error"
        assert "no healthy backend" in r.json()["error"]["message"]
    finally:
        st.call_soon(gw.set_endpoints, eps)
    _until(lambda: st.call_soon(lambda: sum(b.healthy and b.index not in gw.retired for b in gw.backends)) == 3)
    r = post(stack.url, {"prompt": SHORT, "max_tokens": 2})
    assert r.status_code == 200
    stack.idle()
