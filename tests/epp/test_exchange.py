"""`Exchange` against messages out of order, over real gRPC (a direct client plays Envoy's side,
as a plain Envoy never sends them) to a picker of its own on the shared stack's engines, with
its own request log: a second `request_headers` on a stream is answered 500 naming it, never
decided again, and the request admitted on the stream ends exactly once (before the fix it was
decided again: a second request admitted, the first never ended, its endpoint slot leaked)."""

from __future__ import annotations

import json
import time

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from epp.conftest import log_rows
from epp.test_grpc import _started
from presched.serve.log import RequestLog

_MODE = processing_mode_pb2.ProcessingMode
BODY = json.dumps({"model": "tiny", "prompt": "hi", "max_tokens": 2}).encode()


MODES = {"buffered": (_MODE.BUFFERED, _MODE.STREAMED), "full-duplex": (_MODE.FULL_DUPLEX_STREAMED, _MODE.FULL_DUPLEX_STREAMED)}


def headers_msg(eos: bool = False, announce: bool = True, mode: str = "buffered") -> pb.ProcessingRequest:
    hdrs = [(":method", "POST"), (":path", "/v1/completions"), ("content-type", "application/json")]
    m = pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=[
        base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in hdrs]), end_of_stream=eos))  # fmt: skip
    if announce:
        req, resp = MODES[mode]
        m.protocol_config.CopyFrom(pb.ProtocolConfiguration(request_body_mode=req, response_body_mode=resp))
    return m


def body_msg(raw: bytes) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=raw, end_of_stream=True))


def process(port: int, msgs, big: bool = False) -> list[pb.ProcessingResponse]:
    """The picker's answers to `msgs`; `big`: the client takes messages of up to 64 MiB each way."""
    opts = [("grpc.max_receive_message_length", 64 << 20), ("grpc.max_send_message_length", 64 << 20)] if big else []
    with grpc.insecure_channel(f"127.0.0.1:{port}", options=opts) as ch:
        return list(pb_grpc.ExternalProcessorStub(ch).Process(iter(msgs), timeout=20))


class Picker:
    """A picker of its own (EppServer on the stack's loop) over the stack's engines, logging to
    its own file."""

    def __init__(self, stack, tmp_path, **cfg) -> None:
        from presched.epp.config import EppConfig
        from presched.epp.local import free_port
        from presched.epp.server import EppServer

        self.st = stack.st
        self.log = RequestLog(tmp_path / "requests.sqlite", batch_s=0.01)
        c = EppConfig(endpoints=self.st.picker.cfg.endpoints, port=free_port(), log={"path": None}, **cfg)
        self.server = self.st.call(_started(EppServer, c, None, self.log))
        self.gw = self.server.picker.gw

    def settled(self, timeout_s: float = 10.0) -> tuple[int, int, int]:
        """(accepted, ended, running) once every admitted request ended (or the timeout)."""
        end = time.monotonic() + timeout_s
        while True:
            got = self.st.call_soon(lambda: (self.gw.accepted, self.gw.ended, sum(len(b.running) for b in self.gw.backends)))
            if (got[0] == got[1] and got[2] == 0) or time.monotonic() > end:
                return got
            time.sleep(0.02)

    def rows(self) -> list[dict]:
        return log_rows(self.log)

    def stop(self) -> None:
        self.st.call(self.server.stop(0))


@pytest.fixture
def picker(stack, tmp_path):
    p = Picker(stack, tmp_path)
    yield p
    p.stop()


def test_a_second_request_headers_after_the_decision_is_refused_and_the_request_ends_once(picker):
    out = process(picker.server.port, [headers_msg(), body_msg(BODY), headers_msg(eos=True)])
    assert picker.settled() == (1, 1, 0)  # decided once; that request ended, its slot free
    rows = picker.rows()
    assert [(r["status"], "second request_headers" in r["error"]) for r in rows] == [(500, True)]
    assert [o.WhichOneof("response") for o in out] == ["request_headers", "request_body", "immediate_response"]
    imm = out[2].immediate_response
    err = json.loads(imm.body)["error"]
    assert imm.status.code == 500 and err["type"] == "server_error" and "second request_headers" in err["message"]


def test_a_second_request_headers_before_the_body_is_refused_and_nothing_is_admitted(picker):
    out = process(picker.server.port, [headers_msg(), headers_msg(announce=False), body_msg(BODY)])
    assert [o.WhichOneof("response") for o in out] == ["request_headers", "immediate_response"]
    assert out[1].immediate_response.status.code == 500
    assert picker.settled() == (0, 0, 0) and picker.rows() == []


def test_with_response_body_mode_none_a_request_ends_at_its_response_headers(picker):
    """A gateway that does not send the response body to the picker (response_body_mode NONE):
    the request only ended at the response body's end of stream, which never comes, so every
    successful request was logged 499 when Envoy closed the stream."""
    first = headers_msg(mode="full-duplex")
    first.protocol_config.response_body_mode = _MODE.NONE
    resp = pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=[
        base_pb2.HeaderValue(key=":status", raw_value=b"200")])))  # fmt: skip
    out = process(picker.server.port, [first, body_msg(BODY), resp])
    assert [o.WhichOneof("response") for o in out] == ["request_headers", "request_body", "response_headers"]
    assert picker.settled() == (1, 1, 0)
    assert [(r["status"], r["error"]) for r in picker.rows()] == [(200, None)]
    assert picker.gw.finished == 1
