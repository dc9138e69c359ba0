"""The ASGI front of the gateway: OpenAI-compatible HTTP in, the `Gateway`'s decisions, the
backends' bytes out.

    POST /v1/completions, /v1/chat/completions   (stream or not)
    GET  /v1/models, /health, /metrics

For each generation request: authenticate (401) -> read and check the body (400 naming the
field, 413 when too large) -> count prompt tokens (413 over the limit) -> rate limit (429) ->
predict its length -> `Gateway.accept` (429 when the queue is full, 503 when no backend is up)
-> wait for a slot -> send upstream -> relay the backend's bytes unchanged -> `Gateway.finish`,
one log row, metrics. From `accept` on, every request ends with a response or an error and one
log row (status 499 when the client went away; its upstream request is closed, which makes vLLM
abort it, and its slot goes to the next request).

Failures: a backend that refuses, times out before its response headers, or answers 502/503 is
marked down and the request is placed on another backend (up to `retries`); a non-streaming
request whose backend dies mid-way is retried the same way (the client has seen nothing yet). A
stream that breaks after bytes were sent ends with an OpenAI-style error event
(`data: {"error": {...}}`, no `[DONE]` after it): 502 when the backend broke it or sent an event
over `max_event_bytes`, 504 when it sent nothing for `idle_timeout_s`. Every failure counts
against its backend (`Backend.note_failure`: held down, longer each time it fails again).

Shutdown: `begin_drain` (called by the server on SIGTERM) gives requests in flight
`drain_timeout_s`; those still running then end with 503 (an error event in a stream), each
with its log row.

Every answer is OpenAI-format JSON, counted, and an exception no endpoint handles is logged and
answered 500 (`serve.guard`, wrapped around the app by `build_app`).

Streaming: the gateway asks the backend for `stream_options.include_usage` (the true output
token count); when the client did not ask for it, the usage-only event is not relayed, so the
client receives exactly the bytes the backend would have sent it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from functools import partial
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request as HTTPRequest
from starlette.routing import Route

from presched.predict.estimate import LEVELS
from presched.serve.asgi import RawASGI, until_disconnect
from presched.serve.backend import Backend
from presched.serve.config import ServeConfig
from presched.serve.gateway import Gateway, GatewayError
from presched.serve.guard import Guard, http_error
from presched.serve.metrics import GatewayMetrics
from presched.serve.predictions import PredictBatcher, Worker
from presched.serve.request_body import Done as _Done
from presched.serve.request_body import check_content_type, error_response, parse_body, read_body
from presched.serve.seq import GatewaySeq
from presched.serve.sse import split_events
from presched.serve.status import health, list_models, prometheus
from presched.serve.tenants import Tenants
from presched.serve.tokens import counter
from presched.serve.upstream import Upstream, UpstreamError, UpstreamResponse, UpstreamTimeout
from presched.workload.request import Request

logger = logging.getLogger(__name__)
_RETRY_STATUS = (502, 503)  # the backend is unavailable: try another one


class GatewayApp:
    """Owns the gateway's parts for one server run (built in `build_app`)."""

    def __init__(self, cfg: ServeConfig, predictor: Any = None, log: Any = None) -> None:
        self.cfg = cfg
        self.gw = Gateway(cfg, predicts=predictor is not None)
        self.tenants = Tenants(cfg.tenants)
        self.count, self.count_how = counter(cfg.tokenizer)
        self.worker = Worker()  # predictions and token counting, off the event loop
        self.predict = PredictBatcher(predictor, self.worker) if predictor is not None else None
        self.log = log
        self.metrics = GatewayMetrics(self.gw)
        self.client: httpx.AsyncClient | None = None  # health checks and model discovery
        self.upstream: Upstream | None = None  # generation requests
        self._health_task: asyncio.Task | None = None
        self.draining = False  # set when drain_timeout_s ran out at shutdown
        self._in_flight: set[asyncio.Task] = set()  # tasks running `_serve`
        self._drain_timer: asyncio.TimerHandle | None = None
        self.models = sorted({b.model for b in self.gw.backends if b.model})

    # --- lifecycle ----------------------------------------------------------------------------
    async def startup(self) -> None:
        total = sum(b.max_in_flight for b in self.gw.backends)
        limits = httpx.Limits(max_connections=max(100, 2 * total), max_keepalive_connections=max(100, 2 * total))
        timeout = httpx.Timeout(None, connect=self.cfg.connect_timeout_s)
        self.client = httpx.AsyncClient(limits=limits, timeout=timeout)
        c = self.cfg
        self.upstream = Upstream(c.connect_timeout_s, max_idle=max(100, 2 * total),
                                 first_byte_timeout_s=c.first_byte_timeout_s, idle_timeout_s=c.idle_timeout_s,
                                 max_chunk_bytes=c.max_chunk_bytes, max_body_bytes=c.max_response_bytes)  # fmt: skip
        await self._discover_models()
        self._health_task = asyncio.create_task(self._health_loop())

    def begin_drain(self) -> None:
        """Shutdown began (the server stopped accepting): requests in flight get
        `drain_timeout_s` to finish; then `_end_in_flight` ends the rest."""
        if self._drain_timer is None:
            loop = asyncio.get_running_loop()
            self._drain_timer = loop.call_later(self.cfg.drain_timeout_s, self._end_in_flight)

    def _end_in_flight(self) -> None:
        self.draining = True
        if self._in_flight:
            logger.warning("shutdown: ending %d request(s) still in flight after drain_timeout_s=%g s",
                           len(self._in_flight), self.cfg.drain_timeout_s)  # fmt: skip
        for t in list(self._in_flight):
            t.cancel()  # `_serve` answers 503 (or an error event) and `_end` logs it

    async def shutdown(self) -> None:
        if self._drain_timer is not None:
            self._drain_timer.cancel()
        if self._in_flight:  # the server stopped waiting for them: end them before the log closes
            self._end_in_flight()
            for _ in range(200):
                if self.gw.ended >= self.gw.accepted:
                    break
                await asyncio.sleep(0.01)
        if self._health_task is not None:
            self._health_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._health_task
        if self.client is not None:
            await self.client.aclose()
        if self.upstream is not None:
            await self.upstream.aclose()
        if self.log is not None:
            self.log.close()
        self.worker.close()

    async def _discover_models(self) -> None:
        for b in self.gw.backends:
            if b.model:
                continue
            try:
                r = await self.client.get(f"{b.url}/v1/models", timeout=self.cfg.connect_timeout_s)
                b.model = r.json()["data"][0]["id"]
            except Exception:  # noqa: BLE001 - a down backend is found by the health loop
                self.gw.set_health(b, False)
        self.models = sorted({b.model for b in self.gw.backends if b.model})

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.cfg.health_interval_s)
            await asyncio.gather(*(self._check(b) for b in self.gw.backends))

    async def _check(self, b: Backend) -> None:
        try:
            r = await self.client.get(f"{b.url}/health", timeout=self.cfg.connect_timeout_s)
            ok = r.status_code == 200
        except httpx.HTTPError:
            ok = False
        if ok and b.model is None:
            await self._discover_models()
            ok = b.model is not None
        if ok and b.held(self.gw.now()):
            ok = False  # it failed requests lately: stays down until its hold ends
        self.gw.set_health(b, ok)

    # --- generation ---------------------------------------------------------------------------
    async def generate(self, scope, receive, send) -> None:
        """ASGI endpoint of /v1/completions and /v1/chat/completions."""
        request = HTTPRequest(scope, receive)
        chat = scope["path"].endswith("/chat/completions")
        try:
            tenant, body, text = await self._parse(request, chat)
            seq = await self._accept(tenant, body, text, chat)
        except _Done as d:
            await d.response(scope, receive, send)
            return
        except Exception as e:  # a bug before admission: its row here, its 500 from the Guard
            self._log_crash(request, chat, e)
            raise
        out = _Outcome()
        try:
            if await until_disconnect(self._serve(seq, body, chat, out, send), receive):
                out.status, out.error = 499, "the client disconnected"
        except GatewayError as e:  # e.g. its policy failed (PolicyError): answered, logged
            out.status, out.error, out.kind = e.status, str(e), e.kind
            if not out.started:
                with contextlib.suppress(Exception):
                    await self._send_error(out, send)
        except Exception as e:  # noqa: BLE001 - a bug must still end the request and its row
            logger.exception("request %s: unhandled error while serving", seq.id)
            self.metrics.unhandled.inc()
            out.status, out.error, out.kind = 500, f"gateway error: {type(e).__name__}: {e}", "server_error"
            if not out.started:
                with contextlib.suppress(Exception):
                    await self._send_error(out, send)
        finally:
            self._end(seq, body, chat, out, text)

    def _log_crash(self, request: HTTPRequest, chat: bool, e: Exception) -> None:
        """The log row of a request that an unexpected exception ended before admission."""
        if self.log is None:
            return
        with contextlib.suppress(Exception):  # the Guard still logs and answers
            self.log.write({"id": f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:20]}",
                            "ts": time.time(), "tenant": self.tenants.identify(request.headers),
                            "endpoint": "chat" if chat else "completions", "status": 500,
                            "error": f"gateway error: {type(e).__name__}: {e}", "retries": 0})  # fmt: skip

    async def _parse(self, request: HTTPRequest, chat: bool) -> tuple[str, dict, str]:
        tenant = self.tenants.identify(request.headers)
        if tenant is None:
            raise _Done(error_response(401, "invalid or missing API key (Authorization: Bearer KEY)",
                                       "authentication_error"))  # fmt: skip
        if self.cfg.check_content_type:
            check_content_type(request.headers)
        raw = await read_body(request, self.cfg.max_body_bytes)
        body, prompt = parse_body(raw, chat, self.models)
        return tenant, body, prompt

    async def _accept(self, tenant: str, body: dict, text, chat: bool) -> GatewaySeq:
        if isinstance(text, list):  # token ids
            n_prompt, text = len(text), None
        else:  # off the event loop: a long prompt must not stall the streams
            n = await self.worker.run(self.count, text)
            n_prompt = max(1, n + (4 * len(body["messages"]) if chat else 0))
        if n_prompt > self.cfg.max_prompt_tokens:
            raise _Done(error_response(413, f"prompt: {n_prompt} tokens exceed the limit of "
                                       f"{self.cfg.max_prompt_tokens}", param="prompt"))  # fmt: skip
        wait = self.tenants.allow(tenant)
        if wait is not None:
            raise _Done(error_response(429, f"tenant {tenant!r} is over its rate limit",
                                       "rate_limit_error", retry_after=wait))  # fmt: skip
        max_tokens = body.get("max_completion_tokens", body.get("max_tokens")) if chat else body.get("max_tokens")
        req = Request(id=f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex[:20]}",
                      prompt_tokens=n_prompt, tenant=tenant, model=body.get("model") or "",
                      prompt=text, max_tokens=max_tokens)  # fmt: skip
        target = max_tokens if body.get("ignore_eos") and max_tokens else None
        estimate = None
        if self.predict is not None:
            try:
                estimate = await self.predict.estimate(req)
            except Exception as e:  # noqa: BLE001
                raise _Done(error_response(500, f"length predictor failed: {type(e).__name__}: {e}",
                                           "server_error")) from None  # fmt: skip
        try:
            return self.gw.accept(req, target, estimate)
        except GatewayError as e:
            raise _Done(error_response(e.status, str(e), e.kind, e.param, e.retry_after)) from None

    def _upstream_body(self, seq: GatewaySeq, body: dict) -> tuple[dict, bool]:
        """The body sent to the backend, and whether the gateway added include_usage."""
        up = dict(body)
        injected = False
        if body.get("stream"):
            opts = dict(body.get("stream_options") or {})
            if not opts.get("include_usage"):
                opts["include_usage"] = True
                injected = True
            up["stream_options"] = opts
        if self.cfg.mode == "passthrough":
            up["priority"] = int(seq.key or 0)
        else:  # the gateway's queue decides the order; the engine's priority is not the client's
            up.pop("priority", None)
        if self.cfg.send_prediction and seq.estimate is not None:
            xargs = dict(body.get("vllm_xargs") or {})
            xargs.update(presched_pred_mean=float(seq.estimate.mean),
                         presched_pred_q90=float(seq.estimate.quantile(0.9)))  # fmt: skip
            up["vllm_xargs"] = xargs
        return up, injected

    async def _serve(self, seq: GatewaySeq, body: dict, chat: bool, out: "_Outcome", send) -> None:
        """Wait for a slot, send upstream (retrying elsewhere on early failure), relay; at
        shutdown, past drain_timeout_s, end the request with 503."""
        task = asyncio.current_task()
        self._in_flight.add(task)
        try:
            await self._place_and_relay(seq, body, chat, out, send)
        except asyncio.CancelledError:
            if not self.draining:
                raise  # the client went away
            out.status, out.kind = 503, "server_error"
            out.error = f"the gateway shut down: still running after drain_timeout_s={self.cfg.drain_timeout_s:g} s"
            with contextlib.suppress(Exception):
                if not out.started:
                    await self._send_error(out, send)
                else:
                    tail = _error_event(503, out.error) if body.get("stream") else b""
                    await send({"type": "http.response.body", "body": tail, "more_body": False})
        finally:
            self._in_flight.discard(task)

    async def _place_and_relay(self, seq: GatewaySeq, body: dict, chat: bool, out: "_Outcome", send) -> None:
        path = "/v1/chat/completions" if chat else "/v1/completions"
        up, injected = self._upstream_body(seq, body)
        payload = json.dumps(up).encode()
        while True:
            try:
                b = await self.gw.wait(seq)
            except asyncio.CancelledError:
                raise
            out.backend = b
            try:
                resp = await self._open(b, path, payload)
            except _Unavailable as e:
                if not self._retry(seq, out, f"backend {b.name}: {e}"):
                    break
                continue
            if resp.status_code in _RETRY_STATUS:
                await resp.aclose()
                if not self._retry(seq, out, f"backend {b.name} answered {resp.status_code}"):
                    break
                continue
            try:
                if body.get("stream") and resp.status_code == 200:
                    await self._relay_stream(seq, resp, injected, out, send)
                else:
                    why = await self._relay_whole(seq, resp, out, send)
                    if why is not None:
                        if not self._retry(seq, out, f"backend {b.name} failed mid-response: {why}"):
                            break
                        continue
            finally:
                await resp.aclose()
            if out.status == 200:
                b.note_success()
            return
        await self._send_error(out, send)

    def _retry(self, seq: GatewaySeq, out: "_Outcome", why: str) -> bool:
        out.retries += 1
        out.backend.note_failure(self.gw.now(), self.cfg.health_interval_s)
        try:
            self.gw.failed(seq)
            return True
        except GatewayError as e:
            out.status, out.error = e.status, f"{why}; {e}"
            out.kind = e.kind
            return False

    async def _open(self, b: Backend, path: str, payload: bytes) -> UpstreamResponse:
        try:
            async with asyncio.timeout(self.cfg.first_byte_timeout_s):
                return await self.upstream.post(b.url, path, payload)
        except TimeoutError:
            raise _Unavailable(f"no response within {self.cfg.first_byte_timeout_s} s") from None
        except UpstreamError as e:
            raise _Unavailable(str(e)) from None

    async def _relay_whole(self, seq: GatewaySeq, resp: UpstreamResponse, out: "_Outcome", send) -> str | None:
        """Read the whole response and send it on; what went wrong if it could not be read
        (nothing was sent then: the request may be retried)."""
        try:
            data = await resp.aread()
        except UpstreamError as e:
            return str(e)
        now = self.gw.now()
        usage = None
        if resp.status_code == 200:
            try:
                parsed = json.loads(data)
            except (json.JSONDecodeError, UnicodeDecodeError):
                parsed = None
            if isinstance(parsed, dict):
                usage, choices = parsed.get("usage"), parsed.get("choices")
                if isinstance(choices, list) and choices and isinstance(choices[0], dict):
                    out.finish_reason = _text_or_none(choices[0].get("finish_reason"))
            seq.first_token = seq.last_token = now
        out.status = resp.status_code
        out.tokens = _usage_tokens(usage)
        if resp.status_code != 200:
            out.error = data[:500].decode("utf-8", "replace")
        headers = self._headers(seq, resp.headers.get("content-type", "application/json"))
        await send({"type": "http.response.start", "status": resp.status_code, "headers": headers})
        out.started = True
        await send({"type": "http.response.body", "body": data})
        return None

    async def _relay_stream(self, seq: GatewaySeq, resp: UpstreamResponse, injected: bool,
                            out: "_Outcome", send) -> None:  # fmt: skip
        headers = self._headers(seq, resp.headers.get("content-type", "text/event-stream"))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        out.started = True
        out.status = 200
        buf = b""
        clock, limit = self.gw.now, self.cfg.max_event_bytes
        try:
            async for chunk in resp.aiter_raw():
                start = max(len(buf) - 3, 0)  # a blank line may begin in the bytes held back
                buf += chunk
                events, buf = split_events(buf, start)
                if len(buf) > limit:
                    raise _EventTooLarge(f"sent an event over max_event_bytes ({limit} bytes)")
                if not events:
                    continue
                relay = []
                before = seq.generated
                for ev in events:
                    if _inspect(ev, seq, out, clock) or not injected:
                        relay.append(ev)
                if seq.generated > before:
                    self.gw.tokens(seq, seq.generated - before)
                if relay:
                    await send({"type": "http.response.body", "body": b"".join(relay), "more_body": True})
        except (UpstreamError, _EventTooLarge) as e:
            b = out.backend
            status = 504 if isinstance(e, UpstreamTimeout) else 502
            what = "stalled: " if status == 504 else "broke the stream: " if isinstance(e, UpstreamError) else ""
            out.status, out.error = status, f"backend {b.name} {what}{e}"
            buf = _error_event(status, out.error)
            b.note_failure(self.gw.now(), self.cfg.health_interval_s)
            self.gw.set_health(b, False)
        await send({"type": "http.response.body", "body": buf, "more_body": False})

    def _headers(self, seq: GatewaySeq, content_type: str) -> list[tuple[bytes, bytes]]:
        wait = (seq.first_scheduled or seq.arrival) - seq.arrival
        return [(b"content-type", content_type.encode()),
                (b"x-request-id", seq.id.encode()),
                (b"x-presched-backend", str(seq.instance).encode()),
                (b"x-presched-queue-wait-ms", f"{wait * 1e3:.3f}".encode())]  # fmt: skip

    async def _send_error(self, out: "_Outcome", send) -> None:
        resp = error_response(out.status, out.error or "no backend could serve the request", out.kind)
        await send({"type": "http.response.start", "status": resp.status_code, "headers": resp.raw_headers})
        out.started = True
        await send({"type": "http.response.body", "body": resp.body})

    def _end(self, seq: GatewaySeq, body: dict, chat: bool, out: "_Outcome", text) -> None:
        """Every accepted request passes here once: slot, tracker, metrics, log row."""
        if out.status == 200:
            self.gw.finish(seq, out.tokens)  # None: no usage came back (the stream count stays)
        else:
            if out.status == 0:  # the client went away before it got anything
                out.status = 499
            self.gw.cancel(seq)
            seq.finish = self.gw.now()
        self.metrics.observe(seq, out.status)
        if self.log is not None:
            self._log_row(seq, body, chat, out, text)
        self.gw.ended += 1

    def _log_row(self, seq: GatewaySeq, body: dict, chat: bool, out: "_Outcome", text) -> None:
        est = seq.estimate
        q = None if est is None else [round(est.quantile(p), 2) for p in LEVELS]
        fs, ft = seq.first_scheduled, seq.first_token
        self.log.write({
            "id": seq.id, "ts": seq.ts, "tenant": seq.tenant, "model": seq.request.model,
            "backend": out.backend.name if out.backend is not None else None,
            "endpoint": "chat" if chat else "completions", "stream": int(bool(body.get("stream"))),
            "status": out.status, "error": out.error, "prompt_tokens": seq.prompt_tokens,
            "max_tokens": seq.request.max_tokens,
            "output_tokens": out.tokens if out.status == 200 else None,  # engine usage only
            "finish_reason": out.finish_reason,
            "pred_mean": float(est.mean) if est is not None else None, "pred_quantiles": q,
            "priority": seq.key, "queue_wait_s": None if fs is None else fs - seq.arrival,
            "ttft_s": None if ft is None else ft - seq.arrival, "e2e_s": seq.finish - seq.arrival,
            "retries": out.retries, "prompt": text if isinstance(text, str) else None,
        })  # fmt: skip


class _Unavailable(Exception):
    pass


class _EventTooLarge(Exception):
    pass


def _error_event(status: int, message: str) -> bytes:
    """An OpenAI-format error as the SSE event that ends a broken stream."""
    err = {"error": {"message": message, "type": "server_error", "param": None, "code": status}}
    return b"data: " + json.dumps(err).encode() + b"\n\n"


class _Outcome:
    """What happened to one accepted request (filled while serving, read by `_end`)."""

    __slots__ = ("status", "error", "kind", "tokens", "backend", "retries", "started", "finish_reason")

    def __init__(self) -> None:
        self.status = 0
        self.error: str | None = None
        self.kind = "server_error"
        self.tokens: int | None = None
        self.backend: Backend | None = None
        self.retries = 0
        self.started = False
        self.finish_reason: str | None = None


def _inspect(ev: bytes, seq: GatewaySeq, out: _Outcome, clock) -> bool:
    """Account one SSE event of the backend's stream; False for the usage-only event (which the
    gateway asked for itself and may hide)."""
    ev = ev.lstrip(b"\r\n")  # a leading empty line (a CRLF split between two reads)
    if not ev.startswith(b"data:"):
        return True
    data = ev[5:].strip()
    if data == b"[DONE]":
        return True
    try:
        obj = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return True
    if not isinstance(obj, dict):
        return True
    choices = obj.get("choices")
    choices = choices if isinstance(choices, list) else None
    usage = obj.get("usage")
    if isinstance(usage, dict) and usage:
        out.tokens = _usage_tokens(usage)
        if not choices:
            return False
    for c in choices or ():
        if not isinstance(c, dict):
            continue
        delta = c.get("delta")
        piece = delta.get("content") if isinstance(delta, dict) else c.get("text")
        if piece:
            seq.on_token(clock())
        if c.get("finish_reason"):
            out.finish_reason = _text_or_none(c["finish_reason"])
    return True


def _usage_tokens(usage: Any) -> int | None:
    """`completion_tokens` of a backend's usage object, if it is a count."""
    tokens = usage.get("completion_tokens") if isinstance(usage, dict) else None
    return tokens if type(tokens) is int and tokens >= 0 else None


def _text_or_none(v: Any) -> str | None:
    return v[:100] if isinstance(v, str) else None


def build_app(cfg: ServeConfig, predictor: Any = None, log: Any = None) -> Starlette:
    """The Starlette app of `presched serve` (run it with uvicorn). `app.state.gateway` is the
    `GatewayApp` (tests and benchmarks read its `gw`)."""
    g = GatewayApp(cfg, predictor, log)

    @contextlib.asynccontextmanager
    async def lifespan(app):
        await g.startup()
        try:
            yield
        finally:
            await g.shutdown()

    routes = [
        Route("/v1/completions", RawASGI(g.generate), methods=["POST"]),
        Route("/v1/chat/completions", RawASGI(g.generate), methods=["POST"]),
        Route("/v1/models", partial(list_models, g)),
        Route("/health", partial(health, g)),
        Route("/metrics", partial(prometheus, g)),
    ]
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers={HTTPException: http_error},
                    middleware=[Middleware(Guard, metrics=g.metrics, allowed_hosts=cfg.allowed_hosts)])  # fmt: skip
    app.state.gateway = g
    return app
