"""`presched replay`: an open-loop load generator for any OpenAI-compatible endpoint (vLLM,
SGLang, the presched gateway), reporting the simulator's metrics with the simulator's code.

    from presched.serve.replay import ReplayConfig, run_replay
    res = run_replay(requests, ReplayConfig(url="http://127.0.0.1:8000"))
    res.summary["p99_e2el_ms"], res.summary["max_send_lag_ms"]; res.plot("replay.png")

Who calls it: the `presched replay` command (`replay_cli.py`), tests, benchmark scripts.

How a request is sent
- At its arrival time: request i leaves at `(arrival_i - arrival_0) * time_scale` seconds after
  the start (the first request at once). It is a true open-loop generator: nothing waits for a
  reply before sending the next request. When the generator itself is late (a busy event loop),
  arrivals are NOT shifted: the lateness is measured per request (`send_lag_ms`) and reported
  (`mean/p99/max_send_lag_ms`). With `max_concurrency` a request may also wait for a client-side
  slot; that wait is reported apart (`mean/max_client_wait_ms`).
- Prompt: `Request.prompt` when the data has text, else a synthetic prompt of about
  `prompt_tokens` tokens (`synthetic_prompt`: common English words drawn per request, so no two
  prompts share a prefix-cache block; one token per word with large-vocabulary BPE tokenizers,
  more with small ones; pass `count_tokens` to fit it to the served tokenizer). The chat
  endpoint's template adds a few tokens of its own.
- Connections: HTTP/1.1 keep-alive, one per request in flight (opened as concurrency first
  reaches a new high, then reused); every body is built before the clock starts.
- Length: with `force_lengths` and a known true length, `max_tokens` = that length
  (`Request.target_tokens`) and `ignore_eos: true` (vLLM, SGLang), so the server generates exactly
  the data's output length; otherwise `max_tokens` = `Request.max_tokens` or `max_tokens_default`.

What is measured (seconds on one monotonic clock; `arrival` = when the request was handed to the
HTTP client, as `vllm bench serve` measures)
- first_token: the first SSE event that carries content (text / delta.content); ITL: the gaps
  between consecutive content events (one per event: a server that merges tokens into one event
  shows one gap, as in `vllm bench serve`); finish: when the stream ended.
- output tokens: the final usage event's `completion_tokens` (the true count). A server that
  sends none: the number of content events, flagged (`usage_missing`).
- Non-streaming (`stream=False`): first_token = finish (there is no earlier token to see), so
  TTFT = E2E and the TPOT / ITL figures are reported as NaN.
- first_scheduled: arrival + the `x-presched-queue-wait-ms` response header (the presched
  gateway sends it); without it NaN, and every queue-wait figure is NaN.
- instance: the `x-presched-backend` header (an index, or names numbered in order of first
  appearance); -1 without it.
- Failures: HTTP status >= 400, a transport error (refused, reset, timeout), an error event in
  the stream, a stream cut before `[DONE]`, or a reply with no token. A failed request is counted
  (`failed`, `errors_by_status`: keys are the HTTP status, the transport error's class name, or
  `protocol` / `no_tokens`), kept in `rows` with its message, and left out of the latency figures.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import time
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
from pydantic import Field, field_validator
from rich.table import Table

from presched.config import Config
from presched.metrics.records import RecordTable
from presched.metrics.summary import GoodputSLO, summarize
from presched.serve.sse import sse_lines
from presched.workload.request import Request

QUEUE_WAIT_HEADER = "x-presched-queue-wait-ms"
BACKEND_HEADER = "x-presched-backend"


class ReplayConfig(Config):
    """Where to send a workload and how (`presched replay` options; `--set replay.FIELD=VALUE`)."""

    url: str = Field(
        "http://127.0.0.1:8000",
        description="Base URL of the OpenAI-compatible server (vLLM, SGLang, the presched gateway), without /v1, e.g. http://127.0.0.1:8000.",
    )
    endpoint: Literal["completions", "chat"] = Field(
        "completions",
        description="'completions' (POST /v1/completions, prompt text) or 'chat' (POST /v1/chat/completions, one user message).",
    )
    model: str | None = Field(
        None,
        description="Served model name sent in every request; default: the first model GET /v1/models lists.",
    )
    api_key: str | None = Field(
        None,
        description="API key sent as 'Authorization: Bearer KEY' (never written to the result files).",
    )
    tenant_keys: dict[str, str] = Field(
        default_factory=dict,
        description="API key per tenant name: a request of a listed tenant is sent with its tenant's key (the presched gateway tells tenants apart by key); others use api_key.",
    )
    stream: bool = Field(
        True,
        description="Stream the reply (SSE) and time every token; false: one JSON reply, TTFT = E2E and no TPOT/ITL.",
    )
    force_lengths: bool = Field(
        True,
        description="Generate exactly the data's true output length: max_tokens = the request's true length and ignore_eos=true where the data has one.",
    )
    max_tokens_default: int = Field(
        256,
        ge=1,
        description="max_tokens of a request whose length is not forced and that has no max_tokens of its own.",
    )
    time_scale: float = Field(
        1.0,
        ge=0,
        description="Multiply every arrival time (relative to the first) by this: 2 = half the rate, 0 = send everything at once.",
    )
    max_concurrency: int | None = Field(
        None,
        ge=1,
        description="Client-side cap on requests in flight (others wait for a slot, reported as client wait); none = open loop, no cap.",
    )
    timeout_s: float = Field(
        600.0,
        gt=0,
        description="Seconds to wait for a connection or for the next piece of a reply before the request counts as failed.",
    )
    include_usage: bool = Field(
        True,
        description="Ask for the usage event in streams (stream_options.include_usage) to count output tokens exactly.",
    )
    seed: int = Field(
        0,
        ge=0,
        description="Seed of the synthetic prompts (a request without text gets words drawn from seed and its id).",
    )
    extra_body: dict[str, Any] = Field(
        default_factory=dict,
        description="Fields merged into every JSON request body (they win over replay's own), e.g. {temperature: 0}.",
    )

    @field_validator("url")
    @classmethod
    def _http_url(cls, v: str) -> str:
        v = v.strip().rstrip("/")
        if not v.startswith(("http://", "https://")) or len(v.split("://", 1)[1]) == 0:
            raise ValueError(f"expected an http:// or https:// base URL, got {v!r}")
        return v.removesuffix("/v1")

    @property
    def path(self) -> str:
        return "/v1/chat/completions" if self.endpoint == "chat" else "/v1/completions"


class ReplayError(Exception):
    """The run cannot start (server unreachable, no model to ask for): the message says why."""


# --- prompts and bodies --------------------------------------------------------------------------
_WORDS = (
    "the of and to in is you that it he was for on are as with his they at be this have from or "
    "one had by word but not what all were we when your can said there use an each which she do "
    "how their if will up other about out many then them these so some her would make like him "
    "into time has look two more write go see number no way could people my than first water been "
    "call who oil its now find long down day did get come made may part"
).split()


def synthetic_prompt(
    request: Request, seed: int = 0, count_tokens: Callable[[str], int] | None = None
) -> str:
    """About `request.prompt_tokens` tokens of common English words, drawn from (seed, id).

    Without `count_tokens` it is one word per token: exact for large-vocabulary BPE tokenizers
    (o200k_base: 1.00 tokens per word, measured), where each of these words with its leading
    space is one token; a small vocabulary counts more (~1.2 per word with a 4k byte-level BPE).
    With `count_tokens` the word count is refitted (up to 4 times) until its count matches."""
    target = request.prompt_tokens
    rng = random.Random(f"{seed}:{request.id}")
    words: list[str] = []

    def text(n: int) -> str:
        if len(words) < n:
            words.extend(rng.choices(_WORDS, k=n - len(words)))
        return " ".join(words[:n])

    n = target
    out = text(n)
    if count_tokens is not None:
        for _ in range(4):
            got = count_tokens(out)
            if got == target or got <= 0:
                break
            n = max(1, n + (target - got) if abs(target - got) < 4 else round(n * target / got))
            out = text(n)
    return out


def _lengths(r: Request, cfg: ReplayConfig) -> tuple[int, bool]:
    """(max_tokens, ignore_eos) for one request."""
    if cfg.force_lengths and r.output_tokens is not None:
        return r.target_tokens, True
    return r.max_tokens or cfg.max_tokens_default, False


def request_body(r: Request, cfg: ReplayConfig, model: str, prompt: str) -> dict[str, Any]:
    """The JSON body sent for `r` (OpenAI fields plus vLLM's ignore_eos when lengths are forced)."""
    max_tokens, ignore_eos = _lengths(r, cfg)
    body: dict[str, Any] = {"model": model, "max_tokens": max_tokens, "stream": cfg.stream}
    if cfg.endpoint == "chat":
        body["messages"] = [{"role": "user", "content": prompt}]
    else:
        body["prompt"] = prompt
    if ignore_eos:
        body["ignore_eos"] = True
    if cfg.stream and cfg.include_usage:
        body["stream_options"] = {"include_usage": True}
    body.update(cfg.extra_body)
    return body


# --- one request on the wire ---------------------------------------------------------------------
@dataclass
class _Outcome:
    status: int = 0
    error: str | None = None
    kind: str | None = None  # key in errors_by_status when failed
    first_token: float = math.nan
    finish: float = math.nan
    events: list[float] = field(default_factory=list)
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    finish_reason: str | None = None
    queue_wait_ms: float = math.nan
    backend: str | None = None

    def fail(self, kind: str, error: str) -> _Outcome:
        self.kind, self.error = kind, error[:500]
        return self


def _has_content(choice: dict, chat: bool) -> bool:
    if not chat:
        return bool(choice.get("text"))
    delta = choice.get("delta") or {}
    return bool(delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning"))


def _read_headers(out: _Outcome, headers) -> None:
    out.backend = headers.get(BACKEND_HEADER)
    wait = headers.get(QUEUE_WAIT_HEADER)
    if wait is not None:
        try:
            out.queue_wait_ms = float(wait)
        except ValueError:
            pass


def _stream_error(obj: dict) -> str:
    e = obj.get("error")
    return json.dumps(e)[:500] if not isinstance(e, str) else e


async def _send(client, request, stream: bool, chat: bool, clock: Callable[[], float]) -> _Outcome:
    """Send one pre-built httpx request and time its reply; failures are returned, not raised."""
    import httpx

    out = _Outcome()
    try:
        resp = await client.send(request, stream=stream)
        try:
            out.status = resp.status_code
            _read_headers(out, resp.headers)
            if resp.status_code >= 400:
                return out.fail(
                    str(resp.status_code), (await resp.aread()).decode(errors="replace")
                )
            if stream:
                await _read_stream(resp, out, chat, clock)
            else:
                _read_reply(resp.json(), out, chat, clock())
            return out
        finally:
            await resp.aclose()
    except httpx.HTTPError as e:
        why = str(e) or repr(e.__cause__ or e.__context__ or "")
        return out.fail(type(e).__name__, f"{type(e).__name__}: {why}")
    except ValueError as e:  # a reply that is not JSON
        return out.fail("protocol", f"malformed reply: {e}")


async def _read_stream(resp, out: _Outcome, chat: bool, clock: Callable[[], float]) -> None:
    done = False
    async for line in sse_lines(resp.aiter_bytes()):
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if data == "[DONE]":  # read on to the end of the body, so the connection is reused
            done = True
            continue
        t = clock()
        try:
            obj = json.loads(data)
        except json.JSONDecodeError:
            obj = None
        if not isinstance(obj, dict):
            out.fail("protocol", f"malformed SSE event: {data[:200]}")
            return
        if "error" in obj:
            out.fail("protocol", _stream_error(obj))
            return
        if obj.get("usage"):
            out.completion_tokens = obj["usage"].get("completion_tokens")
            out.prompt_tokens = obj["usage"].get("prompt_tokens")
        choices = obj.get("choices") or ()
        if any(_has_content(ch, chat) for ch in choices):
            out.events.append(t)
        for ch in choices:
            out.finish_reason = ch.get("finish_reason") or out.finish_reason
    out.finish = clock()
    out.first_token = out.events[0] if out.events else out.finish
    if not done:
        out.fail("protocol", "the stream ended without data: [DONE]")


def _read_reply(obj: Any, out: _Outcome, chat: bool, now: float) -> None:
    out.finish = out.first_token = now
    if not isinstance(obj, dict):
        out.fail("protocol", f"malformed reply: {str(obj)[:200]}")
        return
    if "error" in obj:
        out.fail("protocol", _stream_error(obj))
        return
    choices = obj.get("choices") or [{}]
    out.finish_reason = choices[0].get("finish_reason")
    usage = obj.get("usage") or {}
    out.completion_tokens = usage.get("completion_tokens")
    out.prompt_tokens = usage.get("prompt_tokens")
    if out.completion_tokens is None:  # count words of the reply instead, flagged usage_missing
        text = (choices[0].get("message") or {}).get("content") if chat else choices[0].get("text")
        out.events = [now] * len(str(text or "").split())


# --- the run -------------------------------------------------------------------------------------
@dataclass
class _Record:
    """What `RecordTable.from_seqs` needs of one completed request."""

    id: str
    tenant: str
    arrival: float
    first_scheduled: float
    first_token: float
    finish: float
    max_itl: float
    prompt_tokens: int
    generated: int
    instance: int
    request: Request
    preemptions: int = 0
    recomputed_tokens: int = 0


@dataclass(repr=False)
class ReplayResult:
    """One replay: `summary` (simulator metric names plus failed, errors_by_status, send lag),
    `rows` (one dict per request, failed ones included), `records` (completed requests only)."""

    config: ReplayConfig
    model: str
    summary: dict[str, Any]
    rows: list[dict[str, Any]]
    records: RecordTable | None
    itl: tuple[np.ndarray, np.ndarray]
    meta: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:  # short: asyncio may repr the task holding it
        s = self.summary
        done = s.get("completed", 0)
        return f"ReplayResult({s['requests']} requests, {done} completed, {s['failed']} failed)"

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows)

    def to_json(self, path: str | Path) -> Path:
        """Config (without API keys), model, summary and `meta`; NaN is written as null."""
        cfg = json.loads(self.config.model_dump_json())
        cfg["api_key"] = "***" if self.config.api_key else None
        cfg["tenant_keys"] = {k: "***" for k in self.config.tenant_keys}
        doc = {"config": cfg, "model": self.model, "meta": self.meta, "summary": self.summary}
        path = Path(path)
        path.write_text(json.dumps(nan_to_none(doc), indent=2, default=str))
        return path

    def to_csv(self, path: str | Path) -> Path:
        path = Path(path)
        self.frame().to_csv(path, index=False)
        return path

    def table(self) -> Table:
        """Every summary figure, as `presched simulate` prints them."""
        s = self.summary
        title = f"replay: {s.get('completed', 0)}/{s['requests']} completed, {s['failed']} failed"
        caption = f"{self.model} ({self.config.endpoint}) at {self.config.url}"
        table = Table(title=title, caption=caption)
        table.add_column("metric")
        table.add_column("value", justify="right")
        for k, v in s.items():
            if isinstance(v, dict):
                v = ", ".join(f"{a}: {b}" for a, b in v.items()) or "-"
            table.add_row(k, f"{v:.4g}" if isinstance(v, float) else str(v))
        return table

    def plot(self, path: str | Path) -> Path:
        """PNG: CDFs of E2E latency, TTFT and ITL, and the generator's send lag over the run."""
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        df = self.frame()
        ok = df[df["ok"]] if len(df) else df
        fig, axes = plt.subplots(2, 2, figsize=(10, 7.5))
        panels = [
            (axes[0, 0], ok.get("e2el_s"), "E2E latency (s)"),
            (axes[0, 1], ok.get("ttft_s"), "TTFT (s)"),
            (axes[1, 0], self.itl[0] if self.config.stream else None, "inter-token gap (s)"),
        ]
        for ax, col, label in panels:
            x = np.sort(np.asarray(col if col is not None else [], dtype=float))
            x = x[np.isfinite(x)]
            if x.size:
                ax.step(x, np.arange(1, x.size + 1) / x.size, where="post")
            else:
                ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
            ax.set_xlabel(label)
            ax.set_ylabel("fraction of requests" if "gap" not in label else "fraction of gaps")
            ax.grid(True, alpha=0.3)
        ax = axes[1, 1]
        if len(df):
            ax.plot(df["scheduled_s"], df["send_lag_ms"], ".", ms=3)
        ax.set_xlabel("scheduled send time (s)")
        ax.set_ylabel("generator send lag (ms)")
        ax.grid(True, alpha=0.3)
        s = self.summary
        fig.suptitle(f"replay of {s['requests']} requests to {self.model} ({self.config.endpoint}"
                     f"{', stream' if self.config.stream else ''}): {s['failed']} failed, "
                     f"max send lag {s['max_send_lag_ms']:.1f} ms", fontsize=10)  # fmt: skip
        fig.tight_layout()
        path = Path(path)
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return path


def nan_to_none(x):
    """`x` with every non-finite float (NaN, inf) replaced by None, for strict JSON."""
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {k: nan_to_none(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [nan_to_none(v) for v in x]
    return x


class _Connections:
    """HTTP/1.1 keep-alive connections, one per request in flight, reused last-in first-out.

    Each is a single-connection httpx client: httpcore's shared pool re-scans all of its
    connections on every request (quadratic in the number in flight: measured 8 ms of CPU per
    request at ~800 in flight, enough to make the generator itself the bottleneck)."""

    def __init__(self) -> None:
        import httpx

        self._httpx = httpx
        self._ssl = httpx.create_ssl_context()  # shared: building one costs ~20-50 ms
        # reconnect after 2 s idle, well before servers drop idle connections (uvicorn, so vLLM
        # and SGLang: 5 s): reusing one the server is closing fails the request (ReadError)
        self._limits = httpx.Limits(
            max_connections=1, max_keepalive_connections=1, keepalive_expiry=2.0
        )
        self.free: list = []
        self.all: list = []

    def take(self):
        if self.free:
            return self.free.pop()
        client = self._httpx.AsyncClient(verify=self._ssl, limits=self._limits)
        self.all.append(client)
        return client

    def give(self, client) -> None:
        self.free.append(client)

    async def __aenter__(self) -> _Connections:
        return self

    async def __aexit__(self, *exc) -> None:
        await asyncio.gather(*(c.aclose() for c in self.all), return_exceptions=True)


async def _first_model(client, url: str) -> str:
    import httpx

    try:
        resp = await client.get("/v1/models")
    except httpx.HTTPError as e:
        raise ReplayError(f"cannot reach {url}: {type(e).__name__}: {e}") from None
    if resp.status_code >= 400:
        raise ReplayError(f"{url}/v1/models answered HTTP {resp.status_code}; give the model name "
                          f"(model / --model): {resp.text[:200]}")  # fmt: skip
    try:
        return str(resp.json()["data"][0]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        raise ReplayError(
            f"{url}/v1/models lists no model; give the model name (model / --model)"
        ) from None


async def replay_async(
    requests: Iterable[Request],
    cfg: ReplayConfig,
    progress: Callable[[int, int], None] | None = None,
    count_tokens: Callable[[str], int] | None = None,
    slo: GoodputSLO | None = None,
) -> ReplayResult:
    """Send `requests` to `cfg.url` at their arrival times and measure every reply.

    `progress(done, total)` is called as each request ends (completed or failed); `count_tokens`
    fits synthetic prompts to the served tokenizer; `slo` adds request goodput. Raises
    ReplayError when the model has to be looked up and the server cannot be asked."""
    import httpx

    reqs = sorted(requests, key=lambda r: r.arrival)
    if not reqs:
        raise ValueError("requests: no request to replay")
    total = len(reqs)
    timeout = httpx.Timeout(cfg.timeout_s, pool=None)
    base_headers = {"Authorization": f"Bearer {cfg.api_key}"} if cfg.api_key else {}
    builder = httpx.AsyncClient(base_url=cfg.url, timeout=timeout, headers=base_headers)
    async with builder, _Connections() as conns:
        model = cfg.model or await _first_model(builder, cfg.url)
        # everything is built before the clock starts, so sending costs only the HTTP work
        built = []
        for r in reqs:
            prompt = r.prompt
            if prompt is None:
                prompt = synthetic_prompt(r, cfg.seed, count_tokens)
            key = cfg.tenant_keys.get(r.tenant)
            body = request_body(r, cfg, model, prompt)
            auth = {"Authorization": f"Bearer {key}"} if key else None
            built.append(builder.build_request("POST", cfg.path, json=body, headers=auth))
        chat = cfg.endpoint == "chat"
        first = reqs[0].arrival
        due = [(r.arrival - first) * cfg.time_scale for r in reqs]
        sem = asyncio.Semaphore(cfg.max_concurrency) if cfg.max_concurrency else None
        dispatched = [math.nan] * total
        sent = [math.nan] * total
        outcomes: list[_Outcome | None] = [None] * total
        done = 0
        t0 = time.perf_counter()

        def clock() -> float:
            return time.perf_counter() - t0

        async def one(i: int) -> None:
            nonlocal done
            try:
                if sem is not None:
                    await sem.acquire()
                client = conns.take()
                sent[i] = clock()
                try:
                    outcomes[i] = await _send(client, built[i], cfg.stream, chat, clock)
                finally:
                    conns.give(client)
                    if sem is not None:
                        sem.release()
            except Exception as e:
                outcomes[i] = _Outcome().fail(type(e).__name__, f"{type(e).__name__}: {e}")
            done += 1
            if progress is not None:
                progress(done, total)

        tasks = []
        for i in range(total):
            delay = due[i] - clock()
            if delay > 0:
                await asyncio.sleep(delay)
            dispatched[i] = clock()
            tasks.append(asyncio.create_task(one(i)))
        await asyncio.gather(*tasks)
        wall = clock()
    return _result(reqs, cfg, model, due, dispatched, sent, outcomes, wall, slo)


def run_replay(
    requests: Iterable[Request],
    cfg: ReplayConfig,
    progress: Callable[[int, int], None] | None = None,
    count_tokens: Callable[[str], int] | None = None,
    slo: GoodputSLO | None = None,
) -> ReplayResult:
    """`replay_async` in a fresh event loop (call `replay_async` from inside a running loop)."""
    return asyncio.run(replay_async(requests, cfg, progress, count_tokens, slo))


def _result(
    reqs: Sequence[Request],
    cfg: ReplayConfig,
    model: str,
    due: list[float],
    dispatched: list[float],
    sent: list[float],
    outcomes: Sequence[_Outcome],
    wall: float,
    slo: GoodputSLO | None,
) -> ReplayResult:
    rows, recs, gaps = [], [], []
    errors: Counter[str] = Counter()
    backends: dict[str, int] = {}
    for i, (r, o) in enumerate(zip(reqs, outcomes)):
        row, gap = _row(r, o, cfg, due[i], dispatched[i], sent[i], backends)
        rows.append(row)
        if not row["ok"]:
            errors[o.kind] += 1
            continue
        gaps.append(gap)
        recs.append(_Record(r.id, r.tenant, row["sent_s"], row["first_scheduled_s"],
                            o.first_token, o.finish, row["max_itl_s"], row["prompt_tokens"],
                            row["output_tokens"], row["instance"], r))  # fmt: skip

    records = RecordTable.from_seqs(recs) if recs else None
    v = np.concatenate(gaps) if gaps else np.empty(0)
    itl = (v, np.ones(v.size, dtype=np.int64))
    summary: dict[str, Any] = {"completed": 0}
    if records is not None:
        with warnings.catch_warnings(), np.errstate(invalid="ignore"):
            warnings.simplefilter("ignore", RuntimeWarning)  # NaN queue waits without the header
            summary = summarize(records, itl, slo)
        _finite_queue_wait(summary, records)
        if not cfg.stream:  # no token before the last one was seen
            for k in list(summary):
                if k.endswith(("_tpot_ms", "_itl_ms")):
                    summary[k] = math.nan
    lag = np.asarray([row["send_lag_ms"] for row in rows])
    wait = np.asarray([row["client_wait_ms"] for row in rows])
    span = due[-1] - due[0]
    summary.update({
        "requests": len(reqs),
        "failed": int(sum(errors.values())),
        "errors_by_status": dict(sorted(errors.items())),
        "usage_missing": int(sum(row["usage_missing"] for row in rows)),
        "offered_rate": (len(reqs) - 1) / span if span > 0 else math.nan,
        "wall_s": wall,
        "mean_send_lag_ms": float(lag.mean()),
        "p99_send_lag_ms": float(np.percentile(lag, 99)),
        "max_send_lag_ms": float(lag.max()),
        "mean_client_wait_ms": float(wait.mean()),
        "max_client_wait_ms": float(wait.max()),
    })  # fmt: skip
    return ReplayResult(cfg, model, summary, rows, records, itl)


def _row(r: Request, o: _Outcome, cfg: ReplayConfig, due: float, dispatched: float, sent: float,
         backends: dict[str, int]) -> tuple[dict[str, Any], np.ndarray]:  # fmt: skip
    """One request's CSV row (times in seconds from the start), and its inter-token gaps."""
    generated = o.completion_tokens if o.completion_tokens is not None else len(o.events)
    if o.kind is None and generated <= 0:
        o.fail("no_tokens", "the reply has no output token")
    ok = o.kind is None
    instance = -1  # backend header: an index, or a name numbered in order of first appearance
    if o.backend is not None and o.backend.isdigit():
        instance = int(o.backend)
    elif o.backend is not None:
        instance = backends.setdefault(o.backend, len(backends))
    ev = np.asarray(o.events, dtype=float)
    gap = np.diff(ev) if cfg.stream and ev.size > 1 else np.empty(0)
    row = {
        "id": r.id, "tenant": r.tenant, "ok": ok, "status": o.status, "error": o.error,
        "scheduled_s": due, "sent_s": sent,
        "send_lag_ms": (dispatched - due) * 1e3, "client_wait_ms": (sent - dispatched) * 1e3,
        "first_scheduled_s": sent + o.queue_wait_ms / 1e3, "first_token_s": o.first_token,
        "finish_s": o.finish, "queue_wait_s": o.queue_wait_ms / 1e3,
        "ttft_s": o.first_token - sent, "e2el_s": o.finish - sent,
        "prompt_tokens": o.prompt_tokens if o.prompt_tokens is not None else r.prompt_tokens,
        "data_prompt_tokens": r.prompt_tokens, "max_tokens_sent": _lengths(r, cfg)[0],
        "output_tokens": generated if ok else None,
        "usage_missing": ok and o.completion_tokens is None,
        "finish_reason": o.finish_reason, "events": len(o.events),
        "max_itl_s": float(gap.max()) if gap.size else (0.0 if cfg.stream else math.nan),
        "backend": o.backend, "instance": instance,
    }  # fmt: skip
    return row, gap


def _finite_queue_wait(summary: dict[str, Any], rec: RecordTable) -> None:
    """summarize's long-request P99 and max queue wait are NaN as soon as one request lacks the
    queue-wait header; recompute them over the requests that have it (still NaN if none has)."""
    wait = rec.queue_wait
    finite = np.isfinite(wait)
    if finite.all() or not finite.any():
        return
    n = len(rec)
    half = max(n // 2, 1)
    longest = np.argsort(rec.output_tokens, kind="stable")[n - half :]
    w_long = wait[longest][np.isfinite(wait[longest])]
    summary["long_p99_queue_wait_ms"] = (
        float(np.percentile(w_long, 99) * 1e3) if w_long.size else math.nan
    )
    summary["max_queue_wait_ms"] = float(wait[finite].max() * 1e3)
