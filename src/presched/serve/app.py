"""The ASGI front of the gateway: OpenAI-compatible HTTP in, the `Gateway`'s decisions, the
backends' bytes out.

    POST /v1/completions, /v1/chat/completions   (stream or not)
    GET  /v1/models, /health, /metrics

For each generation request: authenticate (401) -> read and check the body (400 naming the
field, 413 when too large) -> count prompt tokens (413 over the limit; 400 naming `prompt` when
the predictor reads text and the prompt has none) -> rate limit (429) ->
predict its length -> `Gateway.accept` (429 when the queue is full, 503 when no backend is up)
-> wait for a slot -> send upstream -> relay the backend's bytes unchanged -> `Gateway.finish`,
one log row, metrics. From `accept` on, every request ends with a response or an error and one
log row (status 499 when the client went away; its upstream request is closed, which makes vLLM
abort it, and its slot goes to the next request).

The trip to a backend and back (retries elsewhere, error events in a broken stream, the
include_usage the gateway adds) is `serve.relay`; what happened to a request and its log row is
`serve.outcome`. This module is the app: its lifecycle, its endpoints and their wiring.

Shutdown: `begin_drain` (called by the server on SIGTERM) gives requests in flight
`drain_timeout_s`; those still running then end with 503 (an error event in a stream), each
with its log row.

Every answer is OpenAI-format JSON, counted, and an exception no endpoint handles is logged and
answered 500 (`serve.guard`, wrapped around the app by `build_app`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from functools import partial
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request as HTTPRequest
from starlette.routing import Route

from presched import xargs
from presched.predict.served_models import fallback_note
from presched.serve.asgi import RawASGI, until_disconnect
from presched.serve.backend import Backend
from presched.serve.config import ServeConfig
from presched.serve.errors import GatewayError
from presched.serve.gateway import Gateway
from presched.serve.guard import Guard, http_error
from presched.serve.learn import LearnCollector, OnlineLearner, learn_fields
from presched.serve.metrics import GatewayMetrics
from presched.serve.outcome import Outcome, crash_row, log_row
from presched.serve.predictions import PredictBatcher, Worker
from presched.serve.relay import Relay, error_event, send_error
from presched.serve.request_body import Done as _Done
from presched.serve.request_body import check_content_type, error_response, new_request, parse_body, read_body
from presched.serve.seq import GatewaySeq
from presched.serve.status import health, list_models, prometheus
from presched.serve.tenants import Tenants
from presched.serve.tokens import counter, encoder, prompt_hashes
from presched.serve.upstream import Upstream

logger = logging.getLogger(__name__)


class GatewayApp:
    """Owns the gateway's parts for one server run (built in `build_app`)."""

    def __init__(self, cfg: ServeConfig, predictor: Any = None, log: Any = None) -> None:
        self.cfg = cfg
        self.learner = predictor if isinstance(predictor, OnlineLearner) else None  # --learn
        learner = self.learner  # its drift alarm, for the policies (fallback reads it)
        alarm = None if learner is None else (lambda: learner.alarm.active)
        self.gw = Gateway(cfg, predicts=predictor is not None, drift_alarm=alarm)
        self.tenants = Tenants(cfg.tenants)
        self.count, self.count_how = counter(cfg.tokenizer)
        # prefix-aware routers read each prompt's block hashes (the simulator's chain hash)
        self.encode = encoder(cfg.tokenizer)[0] if self.gw.router.reads_prefix else None
        self.worker = Worker()  # predictions and token counting, off the event loop
        self.predict = PredictBatcher(predictor, self.worker) if predictor is not None else None
        self.log = log
        self.metrics = GatewayMetrics(self.gw, self.predict)
        if self.learner is not None:
            self.metrics.registry.register(LearnCollector(self.learner))
        self.client: httpx.AsyncClient | None = None  # health checks and model discovery
        self.upstream: Upstream | None = None  # generation requests
        self.relay: Relay | None = None  # sends them and relays the answers (over `upstream`)
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
        self.relay = Relay(c, self.gw, self.upstream)
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
        if self.learner is not None:  # waits for a refit under way, saves learn.state_dir
            await asyncio.get_running_loop().run_in_executor(None, self.learner.close)
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
        known = self.predict.known if self.predict is not None else None
        for m in self.models if known is not None else ():
            if known.match(m) is None:
                logger.warning("startup: %s", fallback_note(self.predict.predictor, m))

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
        out = Outcome()
        try:
            if await until_disconnect(self._serve(seq, body, chat, out, send), receive):
                out.status, out.error = 499, "the client disconnected"
        except GatewayError as e:  # e.g. its policy failed (PolicyError): answered, logged
            out.status, out.error, out.kind = e.status, str(e), e.kind
            if not out.started:
                with contextlib.suppress(Exception):
                    await send_error(out, send)
        except Exception as e:  # noqa: BLE001 - a bug must still end the request and its row
            logger.exception("request %s: unhandled error while serving", seq.id)
            self.metrics.unhandled.inc()
            out.status, out.error, out.kind = 500, f"gateway error: {type(e).__name__}: {e}", "server_error"
            if not out.started:
                with contextlib.suppress(Exception):
                    await send_error(out, send)
        finally:
            self._end(seq, body, chat, out, text)

    def _log_crash(self, request: HTTPRequest, chat: bool, e: Exception) -> None:
        """The log row of a request that an unexpected exception ended before admission."""
        if self.log is None:
            return
        with contextlib.suppress(Exception):  # the Guard still logs and answers
            self.log.write(crash_row(self.tenants.identify(request.headers), chat, e))

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

    def _hash(self, text_or_ids) -> tuple[int, ...]:
        ids = text_or_ids if isinstance(text_or_ids, list) else self.encode(text_or_ids)
        return prompt_hashes(ids, self.cfg.prefix_block_tokens)

    async def _accept(self, tenant: str, body: dict, text, chat: bool) -> GatewaySeq:
        hashes: tuple[int, ...] = ()
        if self.encode is not None:  # off the event loop too
            hashes = await self.worker.run(self._hash, text)
        if isinstance(text, list):  # token ids
            n_prompt, text = len(text), None
        else:  # off the event loop: a long prompt must not stall the streams
            n = await self.worker.run(self.count, text)
            n_prompt = max(1, n + (4 * len(body["messages"]) if chat else 0))
        if n_prompt > self.cfg.max_prompt_tokens:
            raise _Done(error_response(413, f"prompt: {n_prompt} tokens exceed the limit of "
                                       f"{self.cfg.max_prompt_tokens}", param="prompt"))  # fmt: skip
        why = self.predict.text_refusal(text) if self.predict is not None else None
        if why is not None:  # a text predictor cannot read it (token ids, no text): 400, not a 500
            raise _Done(error_response(400, why, param="prompt"))
        wait = self.tenants.allow(tenant)
        if wait is not None:
            raise _Done(error_response(429, f"tenant {tenant!r} is over its rate limit",
                                       "rate_limit_error", retry_after=wait))  # fmt: skip
        req, target = new_request(body, chat, n_prompt, tenant, text, block_hashes=hashes,
                                  hash_block_tokens=self.cfg.prefix_block_tokens if hashes else 0)  # fmt: skip
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
        add = {}
        if self.cfg.send_prediction:  # the prediction and the tenant, for the engine plugin's policies
            add = {xargs.TENANT: seq.request.tenant} if seq.request.tenant != "default" else {}
            if seq.estimate is not None:
                add |= xargs.prediction(seq.estimate)
        xargs.set_upstream(up, self.cfg.trust_client_xargs, add)
        return up, injected

    def _payload(self, seq: GatewaySeq, body: dict) -> tuple[bytes, bool]:
        """The upstream request's JSON bytes, and whether the gateway added include_usage."""
        up, injected = self._upstream_body(seq, body)
        return json.dumps(up).encode(), injected

    async def _serve(self, seq: GatewaySeq, body: dict, chat: bool, out: Outcome, send) -> None:
        """Wait for a slot, send upstream (retrying elsewhere on early failure), relay; at
        shutdown, past drain_timeout_s, end the request with 503."""
        task = asyncio.current_task()
        self._in_flight.add(task)
        try:
            payload = partial(self._payload, seq, body)  # built once a slot is free, not while queued
            await self.relay.run(seq, payload, chat, bool(body.get("stream")), out, send)
        except asyncio.CancelledError:
            if not self.draining:
                raise  # the client went away
            out.status, out.kind = 503, "server_error"
            out.error = f"the gateway shut down: still running after drain_timeout_s={self.cfg.drain_timeout_s:g} s"
            with contextlib.suppress(Exception):
                if not out.started:
                    await send_error(out, send)
                else:
                    tail = error_event(503, out.error) if body.get("stream") else b""
                    await send({"type": "http.response.body", "body": tail, "more_body": False})
        finally:
            self._in_flight.discard(task)

    def _end(self, seq: GatewaySeq, body: dict, chat: bool, out: Outcome, text) -> None:
        """Every accepted request passes here once: slot, tracker, metrics, log row."""
        if out.status == 200:
            self.gw.finish(seq, out.tokens)  # None: no usage came back (the stream count stays)
        else:
            if out.status == 0:  # the client went away before it got anything
                out.status = 499
            self.gw.cancel(seq)
            seq.finish = self.gw.now()
        self.metrics.observe(seq, out.status)
        learned = learn_fields(self.learner, seq, out)
        if self.log is not None:
            self.log.write({**log_row(seq, body, chat, out, text), **learned})
        self.gw.ended += 1



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
