"""Faults through the real Envoy: an endpoint that dies mid-stream, one that is dead when picked,
no endpoint at all. Each test puts the stack back as it found it."""

from __future__ import annotations

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


def test_an_endpoint_killed_mid_stream_the_rest_served_each_logged_once(stack):
    st, gw = stack.st, stack.st.picker.gw
    n_rows = len(stack.rows())
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
    after = [post(stack.url, {"prompt": SHORT, "max_tokens": 3}) for _ in range(6)]
    stack.idle()
    codes = [a.status_code for a in after]
    # at most the first pick of the dead endpoint fails (Envoy's 503 marks it down at once)
    assert set(codes) <= {200, 503} and codes.count(503) <= 1, codes
    assert all(a.headers.get("x-presched-endpoint") != victim for a in after if a.status_code == 200)
    rows = stack.rows()
    assert [x["status"] for x in rows if x["id"] == rid] == [499]
    assert len(rows) == n_rows + 7  # every request answered once and logged once
    assert not st.call_soon(lambda: gw.by_address(victim).healthy)
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
