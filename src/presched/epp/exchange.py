"""One ext_proc stream = one HTTP request through the proxy, start to end.

    ex = Exchange(picker)
    for msg in stream: responses = await ex.on(msg)      # `server.py` sends them back
    ex.close()                                           # always (finally): the request ends once

request headers (held in FULL_DUPLEX_STREAMED mode, answered at once in BUFFERED mode) -> request
body (until end of stream) -> admit: predict, tenant, route or queue (a refusal is an
ImmediateResponse) -> released: the destination header / metadata (primary + fallbacks) and the
rewritten body (include_usage, the prediction), on the held headers' answer and as a streamed
body (FULL_DUPLEX_STREAMED) or in the body's answer (BUFFERED) -> response headers
(status, the endpoint that served it) -> response body (usage counted, passed on; a stream with
an event over `max_event_bytes` is cut: an error event, the request ended with 502 at once, the
rest of the endpoint's bytes dropped) -> end: the endpoint's work released, the prediction error
tracked, one log row.

`close` is the one place a request ends: a stream that the proxy closes early (the client left,
the endpoint died, the proxy gave up) ends there with 499 and still frees its slot and writes
its row; an endpoint the proxy could not reach shows as Envoy's 503 on the response headers.
A message out of order (a second `request_headers`) is answered 500 without deciding again: a
request admitted on the stream ends then, with 500, and the stream's later messages are ignored.
The body modes are the ones Envoy names in the stream's first message (`protocol_config`), else
the configured `envoy_body_mode`'s (`protocol.CONFIGURED_MODES`). With response body mode NONE
the request ends at its response headers (no usage: output tokens unknown). A response body
that comes without response headers (response_header_mode SKIP) tells the status itself
(`ResponseTap.headless`).

Requests that are not generations (GET /v1/models, /health, ...) go to the healthy endpoint with
the least outstanding requests, unqueued and unlogged.
"""

from __future__ import annotations

import logging

from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from presched.epp import protocol as P
from presched.epp.core import Admission, Picker, Refusal
from presched.epp.response import ResponseTap

GENERATION = {"/v1/completions": False, "/v1/chat/completions": True}
_log = logging.getLogger("presched.epp")


class Exchange:
    def __init__(self, picker: Picker) -> None:
        self.picker = picker
        self.headers: dict[str, str] = {}
        self.subset: set[str] | None = None
        self.body = bytearray()
        self.decided = False
        self.adm: Admission | None = None
        self.tap: ResponseTap | None = None
        self.closed = False
        self.got_headers = False
        self.refused = False  # answered 500 for a message out of order: the rest is ignored
        self.request_mode, self.response_mode = P.CONFIGURED_MODES[picker.cfg.envoy_body_mode]

    @property
    def buffered(self) -> bool:
        """The request body comes whole, in one message, after the headers' answer."""
        return self.request_mode == P.BUFFERED

    async def on(self, msg: pb.ProcessingRequest) -> list[pb.ProcessingResponse]:
        kind = msg.WhichOneof("request")
        if self.refused:  # the stream broke the protocol and was answered: nothing more is read
            return []
        if kind == "request_headers":
            if self.got_headers:
                return self._out_of_order(kind)
            self.got_headers = True
            modes = P.announced_modes(msg)
            if modes is not None:
                self.request_mode, self.response_mode = modes
            self.headers = P.headers_of(msg.request_headers)
            self.subset = P.subset_hint(msg)
            if msg.request_headers.end_of_stream:
                return await self._decide(with_body=False)
            if self.request_mode not in (P.BUFFERED, P.DUPLEX):  # the body would never come whole
                self.decided = True
                return [P.immediate(500, f"the gateway's ext_proc request_body_mode is {self.request_mode}; the endpoint "
                                    "picker needs BUFFERED or FULL_DUPLEX_STREAMED", "server_error")]  # fmt: skip
            return [P.plain_headers("request")] if self.buffered else []
        if kind == "request_body":
            rb = msg.request_body
            if self.decided:  # not expected: the body was complete before the decision
                return [P.body("request", rb.body, rb.end_of_stream) if not self.buffered
                        else P.chunk_answer("request", rb.body, rb.body)]  # fmt: skip
            self.body += rb.body
            if len(self.body) > self.picker.cfg.max_body_bytes:
                self.decided = True
                return [P.immediate(413, f"request body exceeds {self.picker.cfg.max_body_bytes} bytes", param="body")]
            if rb.end_of_stream or self.buffered:
                return await self._decide(with_body=True)
            return []
        if kind == "request_trailers":
            out = [] if self.decided else await self._decide(with_body=True)
            return out + [P.trailers("request")]
        if kind == "response_headers":
            return [self._response_headers(msg)]
        if kind == "response_body":
            rb = msg.response_body
            if self.tap is not None and not self.tap.out.started and rb.body:
                self.tap.headless(rb.body)  # no response headers came: the gateway skips them
            data = self.tap.chunk(rb.body, rb.end_of_stream) if self.tap is not None else rb.body
            if rb.end_of_stream or (self.tap is not None and self.tap.failed):
                self.close()  # a cut stream (an event over max_event_bytes) ends now, with 502
            if self.response_mode == P.DUPLEX:
                return [P.body("response", data, rb.end_of_stream)]
            return [P.chunk_answer("response", data, rb.body)]
        if kind == "response_trailers":
            if self.tap is not None and not self.tap.ended:
                tail = self.tap.chunk(b"", True)
                self.close()
                # a STREAMED body cannot grow after its last chunk: an unfinished event is dropped
                if tail and self.response_mode == P.DUPLEX:
                    return [P.body("response", tail, False), P.trailers("response")]
                return [P.trailers("response")]
            self.close()
            return [P.trailers("response")]
        return []

    def _out_of_order(self, kind: str) -> list[pb.ProcessingResponse]:
        """A message the stream cannot carry now (a second `request_headers`: one stream is one
        request): answered 500 naming it, never decided again; a request already admitted on
        the stream ends here (500, its slot freed, its row written), and the stream's later
        messages are not read."""
        self.refused = self.decided = True
        msg = f"ext_proc protocol error: a second {kind} message on one stream (a stream carries one request)"
        if self.adm is not None:
            msg += f"; request {self.adm.seq.id} ends here"
        _log.warning("%s", msg)
        if self.adm is not None and not self.adm.ended:
            self.adm.out.status, self.adm.out.error, self.adm.out.kind = 500, msg, "server_error"
            self.close()
        return [P.immediate(500, msg, "server_error")]

    # --- the request ------------------------------------------------------------------------
    async def _decide(self, with_body: bool) -> list[pb.ProcessingResponse]:
        self.decided = True
        path = self.headers.get(":path", "").split("?", 1)[0]
        chat = GENERATION.get(path)
        if chat is None or self.headers.get(":method", "POST") != "POST":
            return self._other(with_body)
        try:
            self.adm = await self.picker.admit(self.headers, bytes(self.body), chat, self.subset)
            dests = await self.picker.release(self.adm)
        except Refusal as r:
            if self.adm is not None:
                self.adm.out.status, self.adm.out.error = r.status, r.message
            return [P.immediate(r.status, r.message, r.kind, r.param, r.retry_after, r.body)]
        payload, injected, extra = self.picker.upstream_body(self.adm)
        seq = self.adm.seq
        gw = self.picker.gw
        self.tap = ResponseTap(seq, self.adm.out, bool(self.adm.body.get("stream")), injected, gw.now,
                               self.picker.cfg.max_response_bytes, gw.tokens,
                               max_event_bytes=self.picker.cfg.max_event_bytes)  # fmt: skip
        dest = self.picker.cfg.destination_header
        if self.buffered:
            return [P.route_body(dest, dests, extra, payload) if with_body else P.route_headers(dest, dests, extra)]
        return [P.route_headers(dest, dests, extra), P.body("request", payload, True)]

    def _other(self, with_body: bool) -> list[pb.ProcessingResponse]:
        ok = [b for b in self.picker.gw.backends if b.healthy and b.index not in self.picker.gw.retired]
        if self.subset is not None:
            ok = [b for b in ok if b.name in self.subset]
        if not ok:
            return [P.immediate(503, "no eligible endpoint: no healthy endpoint in the pool", "server_error")]
        ok.sort(key=lambda b: (b.num_outstanding, b.index))
        dests = [b.name for b in ok[: 1 + self.picker.cfg.fallbacks]]
        dest = self.picker.cfg.destination_header
        if self.buffered and with_body:
            return [P.route_body(dest, dests, {}, None)]
        out = [P.route_headers(dest, dests, {})]
        if with_body:
            out.append(P.body("request", bytes(self.body), True))
        return out

    # --- the response -----------------------------------------------------------------------
    def _response_headers(self, msg: pb.ProcessingRequest) -> pb.ProcessingResponse:
        if self.adm is None or self.tap is None:
            return P.plain_headers("response")
        h = P.headers_of(msg.response_headers)
        try:
            status = int(h.get(":status", "0"))
        except ValueError:
            status = 0
        served = P.served_endpoint(msg)
        if served is not None:
            self.picker.moved(self.adm, served)
        self.tap.headers(status)
        seq = self.adm.seq
        wait = (seq.first_scheduled or seq.arrival) - seq.arrival
        b = self.adm.out.backend
        extra = {"x-request-id": seq.id, "x-presched-endpoint": b.name if b is not None else "",
                 "x-presched-queue-wait-ms": f"{wait * 1e3:.3f}"}  # fmt: skip
        if msg.response_headers.end_of_stream or self.response_mode == P.NO_BODY:
            # no body follows (none, or the gateway does not send it here): it ends now, its
            # output tokens unknown when they would have come in the body's usage
            self.tap.chunk(b"", True)
            self.close()
        return P.plain_headers("response", extra)

    def close(self) -> None:
        """End the request (once): what happened goes to the core and the log."""
        if self.closed:
            return
        self.closed = True
        adm = self.adm
        if adm is None:
            return
        if adm.out.status == 0 and self.tap is not None:  # the proxy closed the stream early
            adm.out.status = 499
            adm.out.error = ("the stream ended before the response did (the client or the endpoint left)"
                             if self.tap.status else "the body told no status, and no response headers came "
                             "(the gateway skips them: response_header_mode SKIP)" if self.tap.no_headers
                             else "the stream ended before any response came (the client left, or the "
                             "gateway skips the response headers: response_header_mode SKIP)")  # fmt: skip
        try:
            self.picker.end(adm)
        except Exception:  # noqa: BLE001 - a bug here must not leave the stream hanging
            _log.exception("request %s: ending it failed", adm.seq.id)
