"""benchmarks/gateway_overhead.py's load generator: a lean keep-alive HTTP/1.1 client (raw asyncio
streams), the request bodies, open-loop Poisson arrivals and one measured load run."""

from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Any

import numpy as np

MAX_TOKENS = 16
PROMPT_WORDS = (
    "the", "model", "serves", "requests", "in", "order", "of", "their", "predicted", "length",
    "while", "tenants", "share", "one", "engine", "behind", "a", "gateway",
)  # fmt: skip


# --- the load generator ----------------------------------------------------------------------
class Pool:
    """Keep-alive HTTP/1.1 connections to one server; `post` sends one request, reads the whole
    response and returns (status, body, seconds to the first body bytes). A connection idle for
    longer than `max_idle_s` is dropped (uvicorn closes them after 5 s); one that the server
    closed anyway is replaced once, as HTTP clients do."""

    def __init__(self, port: int, max_idle_s: float = 3.0) -> None:
        self.port = port
        self.max_idle_s = max_idle_s
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter, float]] = []
        self.head = f"Host: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n".encode()

    async def _conn(self, t: float):
        while self.idle:
            reader, writer, used = self.idle.pop()
            if t - used < self.max_idle_s and not reader.at_eof():
                return reader, writer, True
            writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        return reader, writer, False

    async def post(self, path: str, body: bytes, t_send: float) -> tuple[int, bytes, float]:
        msg = (
            b"POST "
            + path.encode()
            + b" HTTP/1.1\r\n"
            + self.head
            + b"Content-Length: "
            + str(len(body)).encode()
            + b"\r\n\r\n"
            + body
        )
        reader, writer, reused = await self._conn(t_send)
        writer.write(msg)
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()
            if not reused:
                raise
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            writer.write(msg)
            head = await reader.readuntil(b"\r\n\r\n")
        try:
            status = int(head[9:12])
            low = head.lower()
            parts = []
            t_first = 0.0
            if b"transfer-encoding: chunked" in low:
                while True:
                    size = int((await reader.readline()).split(b";")[0], 16)
                    if size == 0:
                        await reader.readline()
                        break
                    parts.append((await reader.readexactly(size + 2))[:-2])
                    if not t_first:
                        t_first = time.perf_counter() - t_send
            else:
                i = low.index(b"content-length:") + 15
                parts.append(await reader.readexactly(int(low[i : low.index(b"\r\n", i)])))
                t_first = time.perf_counter() - t_send
        except BaseException:
            writer.close()
            raise
        if b"connection: close" in low:
            writer.close()
        else:
            self.idle.append((reader, writer, time.perf_counter()))
        return status, b"".join(parts), t_first

    def close(self) -> None:
        for _, w, _ in self.idle:
            w.close()
        self.idle.clear()


def make_bodies(n: int, stream: bool, seed: int = 0) -> list[bytes]:
    """`n` request bodies with distinct ~60-token prompts (so no cache anywhere helps)."""
    rng = random.Random(seed)
    return [
        json.dumps(
            {
                "model": "stub",
                "prompt": " ".join(rng.choices(PROMPT_WORDS, k=60)),
                "max_tokens": MAX_TOKENS,
                "stream": stream,
            }
        ).encode()
        for _ in range(n)
    ]


def poisson_arrivals(rate: float, duration: float, seed: int = 0) -> np.ndarray:
    """Send times (s from the start) of an open-loop Poisson stream."""
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(1.0 / rate, size=int(rate * duration * 1.5) + 10)
    t = np.cumsum(gaps) - gaps[0]
    return t[t < duration]


def response_ok(status: int, data: bytes, stream: bool) -> bool:
    """A complete answer: 200 and the stub's last event / usage."""
    if status != 200:
        return False
    if stream:
        return data.endswith(b"data: [DONE]\n\n") and data.count(b"data: ") == MAX_TOKENS + 1
    return b'"completion_tokens":' in data


async def run_load(
    pool: Pool,
    arrivals: np.ndarray,
    bodies: list[bytes],
    stream: bool,
    duration: float,
    drain_s: float = 10.0,
    max_outstanding: int | None = None,
) -> dict[str, Any]:
    """Send one body per arrival time (open loop, arrivals within `duration` s), wait for every
    answer (at most `drain_s` after the last send) and measure. Offered rate = sent / duration;
    achieved = answered / max(duration, time to the last answer). With `max_outstanding`, a
    server that falls that far behind is declared overloaded: the rest is not sent (counted as
    errors), so a ramp step past the limit does not leave a backlog that skews the next one."""
    n = len(arrivals)
    lat = np.full(n, np.nan)
    ttfb = np.full(n, np.nan)
    lag = np.zeros(n)
    ends = np.full(n, np.nan)
    errors: dict[str, int] = {}
    t0 = time.perf_counter() + 0.005

    done = [0]  # requests answered or failed

    async def one(i: int) -> None:
        t = time.perf_counter()
        lag[i] = t - (t0 + arrivals[i])
        try:
            status, data, first = await pool.post("/v1/completions", bodies[i % len(bodies)], t)
        except Exception as e:  # noqa: BLE001 - counted
            errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1
            return
        finally:
            done[0] += 1
        end = time.perf_counter()
        if not response_ok(status, data, stream):
            key = str(status) if status != 200 else "incomplete"
            errors[key] = errors.get(key, 0) + 1
            return
        lat[i], ttfb[i], ends[i] = end - t, first, end

    cpu0 = time.process_time()
    tasks = []
    for i, at in enumerate(arrivals):
        delay = t0 + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if max_outstanding is not None and len(tasks) - done[0] > max_outstanding:
            errors["overloaded"] = n - i
            break
        tasks.append(asyncio.create_task(one(i)))
    _, pending = await asyncio.wait(tasks, timeout=drain_s) if tasks else (set(), set())
    for t in pending:
        t.cancel()
    if pending:
        errors["timeout"] = len(pending)
        await asyncio.gather(*pending, return_exceptions=True)
        pool.close()  # connections with unread answers cannot be reused
    gen_cpu = time.process_time() - cpu0
    ok = ~np.isnan(lat)
    span = max(duration, float(np.nanmax(ends) - t0)) if ok.any() else float("nan")
    ms = lat[ok] * 1e3
    return {
        "offered_rps": n / duration,
        "sent": len(tasks),
        "planned": n,
        "ok": int(ok.sum()),
        "errors": errors,
        "achieved_rps": int(ok.sum()) / span,
        "p50_ms": _pct(ms, 50),
        "p90_ms": _pct(ms, 90),
        "p99_ms": _pct(ms, 99),
        "mean_ms": float(ms.mean()) if ms.size else float("nan"),
        "ttfb_p50_ms": _pct(ttfb[ok] * 1e3, 50),
        "send_lag_p99_ms": _pct(lag[: len(tasks)] * 1e3, 99),
        "generator_cpu_us_per_req": gen_cpu / max(len(tasks), 1) * 1e6,
    }


def _pct(x: np.ndarray, q: float) -> float:
    return float(np.percentile(x, q)) if len(x) else float("nan")
