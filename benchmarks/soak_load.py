"""The soak benchmark's load: requests that carry their id, and an open-loop client that records
what came back.

    recs, times = plan(rng, "s", rps=50, duration=60, model="stub", tokens=(4, 32), chaos=True, seed=0)
    client = Client("http://127.0.0.1:8080", timeout_s=30, max_outstanding=2000)
    tasks = []; await offer(client, recs, times, tasks); await asyncio.gather(*tasks)

Each request's prompt starts with `soak-<uid>`; the gateway logs prompts, so its log joins to
the client's records (`soak_account.account`). Outcomes: 'ok' (a complete 200: `[DONE]` at the
end of a stream, `choices` in a body), 'answered' (a complete error response), 'stream_error'
(a 200 stream that ended with an error event), 'left' (the client left after the first event,
on purpose), 'timeout' (no answer within `timeout_s`), 'conn_error', 'cut' (ended without
`[DONE]` or an error), 'not_sent' (skipped: `max_outstanding` were in flight).
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from urllib.parse import urlsplit

import numpy as np
from soak_account import MALFORMED
from soak_backends import KEYS, MAX_BODY

WORDS = [
    "the",
    "gateway",
    "orders",
    "requests",
    "by",
    "their",
    "predicted",
    "length",
    "while",
    "engines",
    "crash",
    "and",
    "stall",
]


class Rec:
    """One request as the client saw it."""

    __slots__ = (
        "body",
        "headers",
        "kind",
        "msg",
        "outcome",
        "path",
        "rid",
        "status",
        "stream",
        "t_end",
        "t_send",
        "tenant",
        "uid",
    )  # fmt: skip

    def __init__(self, uid: str, tenant: str, kind: str, stream: bool) -> None:
        self.uid, self.tenant, self.kind, self.stream = uid, tenant, kind, stream
        self.t_send = self.t_end = None
        self.status = self.rid = self.msg = None
        self.outcome = "not_sent"

    def row(self) -> dict:
        return {k: getattr(self, k) for k in ("uid", "tenant", "kind", "stream", "status", "rid",
                                              "outcome", "msg", "t_send", "t_end")}  # fmt: skip


def build(
    rng: random.Random, uid: str, tenant: str, kind: str, model: str, tokens: tuple[int, int]
) -> Rec:
    """A request of `kind` ('normal', 'leave' or one of MALFORMED) whose prompt starts with its id."""
    stream = kind == "leave" or rng.random() < 0.5
    rec = Rec(uid, tenant, kind, stream)
    chat = kind == "chat_with_prompt" or (kind in ("normal", "leave") and rng.random() < 0.25)
    text = f"soak-{uid} " + " ".join(rng.choices(WORDS, k=24))
    body: dict = {
        "model": model,
        "max_tokens": rng.randint(*tokens),
        "stream": stream,
        "ignore_eos": True,
    }
    body.update({"messages": [{"role": "user", "content": text}]} if chat else {"prompt": text})
    key = KEYS[tenant]
    if kind == "max_tokens_string":
        body["max_tokens"] = "many"
    elif kind == "max_tokens_negative":
        body["max_tokens"] = -3
    elif kind == "unknown_model":
        body["model"] = "no-such-model"
    elif kind == "n_3":
        body["n"] = 3
    elif kind == "too_large":
        body["prompt"] = text + " pad" * (MAX_BODY // 3)
    elif kind == "bad_key":
        key = "sk-wrong"
    elif kind == "chat_with_prompt":
        body["prompt"] = text
    raw = json.dumps(body).encode()
    if kind == "truncated_json":
        raw = raw[:-9]
    elif kind == "not_object":
        raw = json.dumps([text]).encode()
    rec.path = "/v1/chat/completions" if chat else "/v1/completions"
    rec.headers = {"authorization": f"Bearer {key}", "content-type": "application/json"}
    rec.body = raw
    return rec


def _message(data: bytes) -> str | None:
    """The OpenAI error message of a body or of the last SSE event, if there is one."""
    text = data[-2000:].decode("utf-8", "replace")
    m = re.search(r'"message":\s*"((?:[^"\\]|\\.)*)"', text)
    return m[1][:300] if m else None


class Client:
    """Sends `Rec`s to the gateway and records what came back (open loop, bounded).

    A lean HTTP/1.1 client on asyncio streams (httpx's connection pool costs O(connections) per
    request, and at a thousand requests in flight the load generator, not the gateway, became the
    bottleneck). Keep-alive: a connection whose answer was read to its end goes back to a LIFO
    idle list and is reused if idle under `idle_s` (uvicorn closes them after 5 s) and its answer
    was a 200 (servers close connections after some errors). A request is resent only when a
    reused connection turns out closed before any byte of the answer (the server never read it;
    were it read, the log would show the request twice, as `duplicated`); any other failure is
    recorded, not retried. Leaving or timing out closes the connection, which the gateway sees
    as a disconnect."""

    def __init__(
        self, base: str, timeout_s: float, max_outstanding: int, idle_s: float = 2.0
    ) -> None:
        u = urlsplit(base)
        self.host, self.port, self.idle_s = u.hostname, u.port, idle_s
        self.timeout_s, self.max_outstanding = timeout_s, max_outstanding
        self.idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter, float]] = []
        self.in_flight = 0
        self.t0 = time.monotonic()

    async def send(self, rec: Rec) -> None:
        rec.t_send = time.monotonic() - self.t0
        self.in_flight += 1
        conn = None
        try:
            async with asyncio.timeout(self.timeout_s):
                conn, reused = await self._conn()
                try:
                    keep = await self._send(rec, *conn)
                except (ConnectionError, asyncio.IncompleteReadError) as e:
                    if not reused or rec.status is not None or getattr(e, "partial", b""):
                        raise
                    conn[1].close()  # the server had closed this idle connection: it never
                    conn = await asyncio.open_connection(self.host, self.port, limit=2**20)
                    keep = await self._send(rec, *conn)  # read the request; send it once more
                if keep:
                    self.idle.append((*conn, time.monotonic()))
                    conn = None
        except TimeoutError:
            rec.outcome = "timeout"
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
            rec.outcome, rec.msg = "conn_error", f"{type(e).__name__}: {e}"[:300]
        finally:
            if conn is not None:
                conn[1].close()
            rec.t_end = time.monotonic() - self.t0
            self.in_flight -= 1

    async def _conn(self) -> tuple[tuple[asyncio.StreamReader, asyncio.StreamWriter], bool]:
        """(reader, writer), and whether it is a reused keep-alive connection."""
        now = time.monotonic()
        while self.idle:
            reader, writer, used = self.idle.pop()
            if now - used < self.idle_s and not reader.at_eof():
                return (reader, writer), True
            writer.close()
        return await asyncio.open_connection(self.host, self.port, limit=2**20), False

    async def _send(
        self, rec: Rec, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> bool:
        """One exchange; True if the connection can be reused."""
        head = "".join(f"{k}: {v}\r\n" for k, v in rec.headers.items())
        writer.write(f"POST {rec.path} HTTP/1.1\r\nhost: {self.host}:{self.port}\r\n{head}"
                     f"content-length: {len(rec.body)}\r\n\r\n".encode() + rec.body)  # fmt: skip
        lines = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        rec.status = int(lines[0].split(" ", 2)[1])
        hdrs = {
            k.strip().lower(): v.strip() for k, _, v in (x.partition(":") for x in lines[1:] if x)
        }
        rec.rid = hdrs.get("x-request-id")
        leave = rec.kind == "leave" and rec.status == 200 and rec.stream
        buf = bytearray()
        if "chunked" in hdrs.get("transfer-encoding", "").lower():
            while True:
                size = int((await reader.readuntil(b"\r\n")).split(b";")[0], 16)
                if size == 0:
                    await reader.readuntil(b"\r\n")
                    break
                buf += (await reader.readexactly(size + 2))[:-2]
                if leave and b"data: " in buf:
                    rec.outcome = "left"  # closing the connection mid-stream
                    return False
        elif "content-length" in hdrs:
            buf += await reader.readexactly(int(hdrs["content-length"]))
        else:
            buf += await reader.read()  # the body ends when the server closes
        data = bytes(buf)
        if rec.status == 200 and rec.stream:
            if data.endswith(b"data: [DONE]\n\n"):
                rec.outcome = "ok"
            elif (msg := _message(data)) is not None:
                rec.outcome, rec.msg = "stream_error", msg
            else:
                rec.outcome = "cut"
        elif rec.status == 200:
            rec.outcome = "ok" if b'"choices"' in data else "cut"
        else:
            rec.outcome, rec.msg = "answered", _message(data)
        framed = "content-length" in hdrs or "chunked" in hdrs.get("transfer-encoding", "").lower()
        return framed and rec.status == 200 and hdrs.get("connection", "").lower() != "close"

    async def aclose(self) -> None:
        for _, writer, _ in self.idle:
            writer.close()
        self.idle.clear()


async def offer(client: Client, recs: list[Rec], times: np.ndarray, tasks: list) -> None:
    """Start each request at its time (s from now); skip it when too many are in flight."""
    t0 = time.monotonic()
    for rec, at in zip(recs, times):
        delay = t0 + at - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        if client.in_flight >= client.max_outstanding:
            continue  # stays "not_sent"
        tasks.append(asyncio.create_task(client.send(rec)))


def plan(rng: random.Random, prefix: str, rps: float, duration: float, model: str,
         tokens: tuple[int, int], chaos: bool, seed: int, flood_every: float | None = None,
         flood_size: float = 2.0) -> tuple[list[Rec], np.ndarray]:  # fmt: skip
    """Poisson arrival times at `rps` and their requests: tenant victim 20 %, flood 80 %; with
    `chaos` 5 % malformed (each kind equally often) and 5 % streams that leave. With
    `flood_every`, the flood tenant also sends bursts of `flood_size * rps` normal requests spread
    over 1 s, at flood_every / 4 s and every flood_every s after."""
    gaps = np.random.default_rng(seed).exponential(1.0 / rps, int(rps * duration * 1.3) + 20)
    times = np.cumsum(gaps) - gaps[0]
    times = list(times[times < duration])
    tenants = ["victim" if rng.random() < 0.2 else "flood" for _ in times]
    n_poisson = len(times)
    t = flood_every / 4 if flood_every else duration
    while t < duration - 1:
        burst = sorted(t + rng.random() for _ in range(int(flood_size * rps)))
        times += burst
        tenants += ["flood"] * len(burst)
        t += flood_every
    order = np.argsort(times, kind="stable")
    recs = []
    for i, j in enumerate(order):
        u, kind = rng.random(), "normal"
        if chaos and j < n_poisson and u < 0.05:
            kind = rng.choice(MALFORMED)
        elif chaos and j < n_poisson and u < 0.10:
            kind = "leave"
        recs.append(build(rng, f"{prefix}{i}", tenants[j], kind, model, tokens))
    return recs, np.asarray(times)[order]
