"""What the `presched replay` tests share: requests, a recording ASGI wrapper (when each request
reached the server), the one-clock causality check, a closed port."""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest

from presched.workload.request import Request


def make_reqs(lengths, gap_s=0.0, **kw) -> list[Request]:
    return [Request(id=f"r{i}", prompt_tokens=16, arrival=i * gap_s, output_tokens=n, **kw)
            for i, n in enumerate(lengths)]  # fmt: skip


class Recorder:
    """ASGI wrapper around a real app: notes when each generation request reaches the server
    (same process, same perf_counter clock) and can add response headers, as the presched
    gateway adds x-presched-queue-wait-ms / x-presched-backend."""

    def __init__(self, app, headers=None):
        self.app, self.headers, self.received, self.ports = app, headers, [], []
        self.in_flight = self.max_in_flight = 0
        self.auth: list[str] = []

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or not scope["path"].endswith("completions"):
            return await self.app(scope, receive, send)
        self.received.append(time.perf_counter())
        self.ports.append(scope["client"][1])
        self.auth.append(dict(scope["headers"]).get(b"authorization", b"").decode())
        extra = self.headers(len(self.received)) if self.headers else {}

        finished = False

        def finish():
            nonlocal finished
            if not finished:
                finished, self.in_flight = True, self.in_flight - 1

        async def send_with_headers(msg):
            if msg["type"] == "http.response.start" and extra:
                added = [(k.encode(), v.encode()) for k, v in extra.items()]
                msg = dict(msg, headers=[*msg["headers"], *added])
            if msg["type"] == "http.response.body" and not msg.get("more_body", False):
                # a request stops counting when its last byte is handed to the server, not when
                # the app's coroutine returns: the client may read that byte and start its next
                # request before a busy server thread gets back to this coroutine
                finish()
            await send(msg)

        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await self.app(scope, receive, send_with_headers)
        finally:
            finish()


def assert_one_clock(received: list[float], rows: list[dict], before: float) -> None:
    """The server's receive times (perf_counter, same process) agree with the generator's own
    timestamps (seconds from its start t0): some t0 >= `before` (taken just before the run) has
    every request sent before the server got it and got by the server before its first token
    came back: max(recv - first_token) <= t0 <= min(recv - sent), compared in sorted order
    (which server receipt belongs to which request is not known; the k-th smallest of each
    keeps both bounds). A timing relation that holds on any machine, however slow."""
    recv = np.sort(np.asarray(received))
    sent = np.sort([r["sent_s"] for r in rows])
    first = np.sort([r["first_token_s"] for r in rows])
    assert len(recv) == len(rows)
    lo, hi = max(before, float(np.max(recv - first))), float(np.min(recv - sent))
    assert lo <= hi + 1e-6, (lo, hi)
    for r in rows:  # the generator's own books: sent = schedule + its lateness + slot wait
        assert r["send_lag_ms"] >= 0 and r["client_wait_ms"] >= 0
        parts = r["scheduled_s"] + (r["send_lag_ms"] + r["client_wait_ms"]) / 1e3
        assert r["sent_s"] == pytest.approx(parts)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
