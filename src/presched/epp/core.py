"""The picker's decisions: `presched serve`'s `Gateway`, fed from ext_proc streams.

    core = Picker(cfg, predictor, log)
    adm = await core.admit(headers, raw_body, chat, subset)   # Refusal (an HTTP status) or Admission
    dests = await core.release(adm)                            # queue mode: until a slot is free
    core.moved(adm, served)                                    # the proxy served it elsewhere
    core.end(adm, outcome)                                     # once per admitted request

The predictor at arrival, the router, the per-endpoint queues and their policy order, the
tenants' queue shares and VTC weights are the same objects `presched serve` runs (`Gateway`);
`PoolGateway` adds what a pool needs: the subset hint restricts a request's endpoints, and
endpoints come and go (`set_endpoints`: a removed one is retired, never picked again).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from typing import Any

from presched import xargs
from presched.epp.config import EndpointConfig, EppConfig, Objective
from presched.serve.backend import Backend
from presched.serve.config import BackendConfig
from presched.serve.errors import GatewayError
from presched.serve.gateway import Gateway
from presched.serve.outcome import Outcome, log_row
from presched.serve.predictions import PredictBatcher, Worker
from presched.serve.request_body import Done, new_request, parse_body
from presched.serve.seq import GatewaySeq
from presched.serve.tenants import QueueShares
from presched.serve.tokens import counter
from presched.workload.request import Request

MAX_TENANT_CHARS = 128
INLINE_COUNT_CHARS = 8192
"""Prompts up to this many characters are counted on the event loop (tens of microseconds),
longer ones in the worker thread."""
_NO_OBJECTIVE = Objective(name="-")

MIN_SLO_S = 0.001  # what a target already missed while held here is sent as (the engine wants > 0)


class Refusal(Exception):
    """The request is answered by the proxy with `status` (OpenAI-format body)."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error",
                 param: str | None = None, retry_after: float | None = None, body: bytes | None = None) -> None:  # fmt: skip
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind
        self.param, self.retry_after, self.body = param, retry_after, body


@dataclass
class Admission:
    """One admitted request, from `admit` to `end`."""

    seq: GatewaySeq
    body: dict
    chat: bool
    text: Any
    subset: set[str] | None
    out: Outcome = field(default_factory=Outcome)
    ended: bool = False
    served0: int = 0  # its endpoint's `served` count when it was sent there (a 504's verdict)


class PoolGateway(Gateway):
    """`Gateway` over a pool of endpoints named by address, with subset hints."""

    def __init__(self, cfg, predicts: bool = False) -> None:
        super().__init__(cfg, predicts)
        # fairness ids are a header, not authenticated: an unlisted one is ordinary traffic and
        # its pool shares the queue as one more tenant of weight 1 (EppConfig.tenants)
        self.shares = QueueShares(cfg.tenants, cfg.max_queue, unlisted=True)
        self._subsets: dict[str, set[str]] = {}  # request id -> the endpoints it may use
        self.retired: set[int] = set()

    def _candidates(self, seq: GatewaySeq) -> list[Backend]:
        ok = [b for b in super()._candidates(seq) if b.index not in self.retired]
        allowed = self._subsets.get(seq.id)
        return ok if allowed is None else [b for b in ok if b.name in allowed]

    def accept_in(self, request: Request, subset: set[str] | None, target, estimate) -> GatewaySeq:
        if subset is not None:
            self._subsets[request.id] = subset
        try:
            return self.accept(request, target, estimate)
        except BaseException:
            self._subsets.pop(request.id, None)
            raise

    def forget(self, seq: GatewaySeq) -> None:
        self._subsets.pop(seq.id, None)

    def eligible(self, seq: GatewaySeq) -> list[Backend]:
        return self._candidates(seq)

    def move_running(self, seq: GatewaySeq, to: Backend) -> None:
        """`seq` runs on `to`, not where it was released (the proxy fell back): the first
        endpoint failed it and is marked down (its policy hears `on_cancel`); `to` carries it
        from now on, in the router's records too (routed again with `to` the only choice: its
        prefixes, its work) and in its policy's (`on_arrival`, `on_schedule`: mlfq's levels,
        kv-admission's footprint). A hook that raises is counted and logged; the request runs
        there already, so it goes on (as a failing `on_tokens`)."""
        old = self.backends[seq.instance]
        self._leave(old, seq, finished=False)  # (the router's record on `old` goes)
        self.set_health(old, False)
        now = self.now()
        seq.routed = self.router.route(seq, self.backends, now, [to.index])
        seq.instance = to.index
        to.running.append(seq)
        for hook in ("on_arrival", "on_schedule"):
            try:
                getattr(to.policy, hook)(seq, now)
            except Exception as e:  # noqa: BLE001 - the proxy runs it there: it goes on
                self._policy_error(to, seq, hook, e)
                break
        self.dispatch(old)

    def by_address(self, address: str) -> Backend | None:
        for b in self.backends:
            if b.name == address and b.index not in self.retired:
                return b
        return None

    def set_endpoints(self, endpoints: list[EndpointConfig]) -> None:
        """Add the endpoints not known yet; retire those no longer listed (their running
        requests finish; their waiting ones move to the others); apply edits to the others
        (`_edit`). ValueError naming the address, nothing changed, for an address listed twice
        or an endpoint the policy cannot run on (kv-admission without kv_tokens)."""
        want: dict[str, EndpointConfig] = {}
        for e in endpoints:
            if e.address in want:
                raise ValueError(f"endpoints: {e.address} is listed twice")
            want[e.address] = e
        known = {b.name: b for b in self.backends}  # one backend per address, ever
        fresh, edits = [], []  # made before anything changes: a bad endpoint changes nothing
        for addr, e in want.items():
            try:
                if addr not in known:
                    bc = BackendConfig(url=f"http://{addr}", name=addr, model=e.model,
                                       max_in_flight=e.max_in_flight, kv_tokens=e.kv_tokens)  # fmt: skip
                    fresh.append(Backend(len(self.backends) + len(fresh), bc, self._new_policy(), self._drift_alarm))
                elif (e.max_in_flight, e.kv_tokens) != (known[addr].max_in_flight, known[addr].engine.kv_tokens):
                    engine = replace(known[addr].engine, kv_tokens=e.kv_tokens, max_num_seqs=e.max_in_flight)
                    policy = self._new_policy()
                    policy.attach(engine)
                    edits.append((known[addr], e, engine, policy))
            except ValueError as err:
                raise ValueError(f"endpoint {addr}: {err}") from None
        for b in self.backends:
            if b.name not in want and b.index not in self.retired:
                self.retired.add(b.index)
                b.healthy = True  # so that set_health moves its queue
                self.set_health(b, False)
        self.backends.extend(fresh)
        for b, e, engine, policy in edits:
            self._edit(b, e, engine, policy)
        for b in self.backends:
            e = want.get(b.name)
            if e is None:
                continue
            # it left and came back: its own index (and router state); down until a check passes
            self.retired.discard(b.index)
            if e.model != b.cfg.model:
                b.cfg = b.cfg.model_copy(update={"model": e.model})
                b.model = e.model  # None: asked again from /v1/models at its next check
                self.set_health(b, False)  # its waiting requests go where their model is

    def _edit(self, b: Backend, e: EndpointConfig, engine, policy) -> None:
        """`b`'s max_in_flight or kv_tokens changed: a new policy attached to the new engine
        info takes over what `b` runs and holds (the old one hears `on_cancel` for each)."""
        now, old, waiting = self.now(), b.policy, list(b.queue)
        for s in [*b.running, *waiting]:
            try:
                old.on_cancel(s, now)
            except Exception as err:  # noqa: BLE001
                self._policy_error(b, s, "on_cancel", err)
        b.cfg = b.cfg.model_copy(update={"max_in_flight": e.max_in_flight, "kv_tokens": e.kv_tokens})
        b.max_in_flight, b.engine, b.policy, b.queue = e.max_in_flight, engine, policy, policy.new_queue()
        for s in b.running:
            for hook in ("on_arrival", "on_schedule"):
                try:
                    getattr(policy, hook)(s, now)
                except Exception as err:  # noqa: BLE001 - it runs there: it goes on
                    self._policy_error(b, s, hook, err)
                    break
        for s in waiting:
            try:
                policy.on_arrival(s, now)
                b.queue.push(s, now)
                s.key = policy.priority(s, now)
            except Exception as err:  # noqa: BLE001 - it fails as a request whose hook raised
                if s not in b.queue:
                    self.shares.sub(s.tenant)
                self._fault(b, s, "on_arrival", err)
        self.dispatch(b)


class Picker:
    def __init__(self, cfg: EppConfig, predictor: Any = None, log: Any = None,
                 endpoints: list[EndpointConfig] | None = None) -> None:  # fmt: skip
        self.cfg = cfg
        self.gw = PoolGateway(cfg.gateway_config(endpoints), predicts=predictor is not None)
        self.count, self.count_how = counter(cfg.tokenizer)
        self.worker = Worker()
        self.inline_count_chars = INLINE_COUNT_CHARS
        self.predict = (PredictBatcher(predictor, self.worker, cfg.inline_predict_ms / 1e3)
                        if predictor is not None else None)  # fmt: skip
        self.log = log
        self.rows = 0  # log rows written
        self._objectives = {o.name: o for o in cfg.objectives}

    @property
    def models(self) -> list[str]:
        return sorted({b.model for b in self.gw.backends if b.model and b.index not in self.gw.retired})

    # --- arrival ----------------------------------------------------------------------------
    def tenant_of(self, headers: dict[str, str]) -> str:
        t = headers.get(self.cfg.fairness_header, "").strip()
        if len(t) > MAX_TENANT_CHARS or not t.isprintable():
            raise Refusal(400, f"{self.cfg.fairness_header}: a fairness id of at most {MAX_TENANT_CHARS} "
                          "printable characters", param=self.cfg.fairness_header)  # fmt: skip
        return t or "default"

    def objective_of(self, headers: dict[str, str]) -> Objective:
        name = headers.get(self.cfg.objective_header, "").strip()
        if not name:
            return _NO_OBJECTIVE
        o = self._objectives.get(name)
        if o is None:
            known = ", ".join(self._objectives) or "none configured"
            raise Refusal(400, f"{self.cfg.objective_header}: unknown objective {name[:100]!r} (known: {known})",
                          param=self.cfg.objective_header)  # fmt: skip
        return o

    async def admit(self, headers: dict[str, str], raw: bytes, chat: bool, subset: set[str] | None) -> Admission:
        tenant = self.tenant_of(headers)
        slo = self.objective_of(headers)
        if len(raw) > self.cfg.max_body_bytes:
            raise Refusal(413, f"request body of {len(raw)} bytes exceeds {self.cfg.max_body_bytes}", param="body")
        try:
            body, text = parse_body(raw, chat, self.models)
        except Done as d:
            raise Refusal(d.response.status_code, "", body=bytes(d.response.body)) from None
        if isinstance(text, list):
            n_prompt, text = len(text), None
        else:
            # a short prompt is counted at once: a hand-off to the worker thread and back costs
            # more than counting it (benchmarks/epp.py --latency-only measured it)
            n = self.count(text) if len(text) <= self.inline_count_chars else await self.worker.run(self.count, text)
            n_prompt = max(1, n + (4 * len(body["messages"]) if chat else 0))
        if n_prompt > self.cfg.max_prompt_tokens:
            raise Refusal(413, f"prompt: {n_prompt} tokens exceed the limit of {self.cfg.max_prompt_tokens}",
                          param="prompt")  # fmt: skip
        why = self.predict.text_refusal(text) if self.predict is not None else None
        if why is not None:  # a text predictor cannot read it (token ids, no text): 400, as `presched serve`
            raise Refusal(400, why, param="prompt")
        req, target = new_request(body, chat, n_prompt, tenant, text,
                                  slo_ttft=slo.ttft_s, slo_tpot=slo.tpot_s, slo_e2e=slo.e2e_s)  # fmt: skip
        if subset is not None and not any(b.name in subset for b in self.gw.backends if b.healthy):
            raise Refusal(503, "no eligible endpoint: none of the subset hint's endpoints is a healthy "
                          "member of the pool", kind="server_error")  # fmt: skip
        estimate = None
        if self.predict is not None:
            try:
                estimate = await self.predict.estimate(req)
            except Exception as e:  # noqa: BLE001
                raise Refusal(500, f"length predictor failed: {type(e).__name__}: {e}", kind="server_error") from None
        try:
            seq = self.gw.accept_in(req, subset, target, estimate)
        except GatewayError as e:
            raise Refusal(e.status, str(e), e.kind, e.param, e.retry_after) from None
        return Admission(seq, body, chat, text, subset)

    async def release(self, adm: Admission) -> list[str]:
        """Wait until the policy releases the request; the endpoints to try, primary first."""
        try:
            b = await self.gw.wait(adm.seq)
        except GatewayError as e:  # its policy failed (PolicyError)
            adm.out.status, adm.out.error, adm.out.kind = e.status, str(e), e.kind
            raise Refusal(e.status, str(e), e.kind) from None
        adm.out.backend, adm.served0 = b, b.served
        others = sorted((o for o in self.gw.eligible(adm.seq) if o is not b),
                        key=lambda o: (o.num_outstanding, o.index))  # fmt: skip
        return [b.name] + [o.name for o in others[: self.cfg.fallbacks]]

    def upstream_body(self, adm: Admission) -> tuple[bytes, bool, dict[str, str]]:
        """The body the engine gets, whether include_usage was added, and extra headers."""
        seq, body = adm.seq, adm.body
        up, injected, extra = dict(body), False, {}
        if body.get("stream"):
            opts = dict(body.get("stream_options") or {})
            if not opts.get("include_usage"):
                opts["include_usage"], injected = True, True
            up["stream_options"] = opts
        if self.cfg.mode == "passthrough":
            up["priority"] = int(seq.key or 0)
        else:
            up.pop("priority", None)
        add = {}
        if self.cfg.send_prediction:
            req = seq.request  # the objective's targets and the fairness id, for the engine's policy
            waited = max(0.0, self.gw.now() - seq.arrival)  # the engine's clock starts when it gets it
            add = {key: max(v - waited, MIN_SLO_S) for field, key in xargs.SLOS.items()
                   if (v := getattr(req, field)) is not None}  # fmt: skip
            if req.tenant != "default":
                add[xargs.TENANT] = req.tenant
            if seq.estimate is not None:
                add |= xargs.prediction(seq.estimate)
                extra[self.cfg.prediction_header] = f"{add[xargs.MEAN]:.1f}"
        xargs.set_upstream(up, self.cfg.trust_client_xargs, add)
        extra["x-request-id"] = seq.id
        return json.dumps(up).encode(), injected, extra

    # --- the response -------------------------------------------------------------------------
    def moved(self, adm: Admission, served: str) -> None:
        b = self.gw.by_address(served)
        cur = adm.out.backend
        if b is None or cur is None or b is cur or adm.seq not in cur.running:
            return
        adm.out.retries += 1
        cur.note_failure(self.gw.now(), self.cfg.health_interval_s)
        self.gw.move_running(adm.seq, b)
        adm.out.backend, adm.served0 = b, b.served

    def end(self, adm: Admission) -> None:
        """Every admitted request passes here exactly once: slot, tracker, log row."""
        if adm.ended:
            return
        adm.ended = True
        seq, out = adm.seq, adm.out
        if out.status == 200:
            self.gw.finish(seq, out.tokens)
            if out.backend is not None:
                out.backend.note_success()
        else:
            if out.status == 0:
                out.status, out.error = 499, out.error or "the stream ended before the response did"
            self.gw.cancel(seq)
            b = out.backend
            if b is not None and (out.status in (502, 503) or (out.status == 504 and b.served == adm.served0)):
                # the endpoint (or the proxy, failing to reach it) could not serve: down at
                # once, as `presched serve` marks a backend that refuses; health checks bring
                # it back after its hold. A 504 is a proxy's timeout of this request: a verdict
                # on the endpoint only if it served nothing since this one was sent (stalled);
                # one slow request on an endpoint that serves others is none
                b.note_failure(self.gw.now(), self.cfg.health_interval_s)
                self.gw.set_health(b, False)
            seq.finish = self.gw.now()
        self.gw.forget(seq)
        if self.log is not None:
            self.log.write(log_row(seq, adm.body, adm.chat, out, adm.text))
        self.rows += 1
        self.gw.ended += 1

    def close(self) -> None:
        if self.log is not None:
            self.log.close()
        self.worker.close()
