"""What an endpoint's answer says about the endpoint and the request, over real gRPC to a picker
of its own (`test_exchange.Picker`, a direct client playing Envoy's side), each request pinned to
one endpoint by Envoy's subset hint:

- a 504 is a proxy's timeout of one request (Envoy's route or per-try timeout, a gateway's
  backend timeout): it marks its endpoint down only if the endpoint served nothing since that
  request was sent (stalled). Before, any 504 marked it down: one slow non-streaming request
  took a healthy, busy endpoint out of the pool for its hold, longer at each repeat;
- a gateway that skips the response headers (response_header_mode SKIP) but sends the body: the
  status is read off the body (a completion 200, events 200, an OpenAI error its code); every
  such request was logged 499 "the stream ended before any response came".
"""

from __future__ import annotations

import json
import queue
import threading
import time

import grpc
import pytest
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from google.protobuf import struct_pb2

from epp.test_exchange import BODY, Picker, body_msg, headers_msg

USAGE = b'{"choices": [{"text": "ok", "finish_reason": "length"}], "usage": {"completion_tokens": 2}}'


@pytest.fixture
def picker(stack, tmp_path):
    p = Picker(stack, tmp_path)
    yield p
    p.stop()


def pinned(address: str) -> pb.ProcessingRequest:
    """Request headers whose subset hint allows only `address`."""
    m = headers_msg()
    s = struct_pb2.Struct()
    s.update({"x-gateway-destination-endpoint-subset": [address]})
    m.metadata_context.filter_metadata["envoy.lb.subset_hint"].CopyFrom(s)
    return m


def status_msg(code: int, eos: bool = False) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=[
        base_pb2.HeaderValue(key=":status", raw_value=str(code).encode())]), end_of_stream=eos))  # fmt: skip


def response_body(raw: bytes) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(response_body=pb.HttpBody(body=raw, end_of_stream=True))


class Stream:
    """One ext_proc stream whose later messages the test sends when it chooses (`send`)."""

    def __init__(self, port: int, first: list[pb.ProcessingRequest]) -> None:
        self.q: queue.Queue = queue.Queue()
        self.out: list = []
        self.ch = grpc.insecure_channel(f"127.0.0.1:{port}")

        def msgs():
            yield from first
            while (m := self.q.get(timeout=20)) is not None:
                yield m

        def run():
            self.out.extend(pb_grpc.ExternalProcessorStub(self.ch).Process(msgs(), timeout=30))

        self.t = threading.Thread(target=run, daemon=True)
        self.t.start()

    def send(self, *msgs) -> None:
        for m in msgs:
            self.q.put(m)

    def end(self) -> None:
        self.q.put(None)
        self.t.join(20)
        self.ch.close()


def _running(p: Picker, address: str) -> int:
    return p.st.call_soon(lambda: len(p.gw.by_address(address).running))


def _until(cond, timeout_s: float = 10.0) -> None:
    end = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < end
        time.sleep(0.02)


def test_a_504_on_an_endpoint_that_served_others_since_is_no_verdict_on_it(picker):
    x = picker.gw.backends[0].name
    slow = Stream(picker.server.port, [pinned(x), body_msg(BODY)])
    _until(lambda: _running(picker, x) == 1)  # sent to x
    fast = Stream(picker.server.port, [pinned(x), body_msg(BODY)])
    _until(lambda: _running(picker, x) == 2)
    fast.send(status_msg(200), response_body(USAGE))
    fast.end()
    _until(lambda: _running(picker, x) == 1)  # x served it
    slow.send(status_msg(504), response_body(b"upstream request timeout"))
    slow.end()
    assert picker.settled() == (2, 2, 0)
    assert sorted(r["status"] for r in picker.rows()) == [200, 504]
    assert picker.st.call_soon(lambda: picker.gw.by_address(x).healthy)  # one slow request: x stays up


def test_a_504_from_an_endpoint_that_served_nothing_since_marks_it_down(picker):
    x = picker.gw.backends[1].name
    slow = Stream(picker.server.port, [pinned(x), body_msg(BODY)])
    _until(lambda: _running(picker, x) == 1)
    slow.send(status_msg(504), response_body(b"upstream request timeout"))
    slow.end()
    assert picker.settled() == (1, 1, 0)
    assert [r["status"] for r in picker.rows()] == [504]
    assert not picker.st.call_soon(lambda: picker.gw.by_address(x).healthy)  # stalled: down


@pytest.mark.parametrize("code", [502, 503])
def test_a_502_or_503_marks_its_endpoint_down_whatever_it_served(picker, code):
    x = picker.gw.backends[2].name
    failing = Stream(picker.server.port, [pinned(x), body_msg(BODY)])
    _until(lambda: _running(picker, x) == 1)
    ok = Stream(picker.server.port, [pinned(x), body_msg(BODY)])
    _until(lambda: _running(picker, x) == 2)
    ok.send(status_msg(200), response_body(USAGE))
    ok.end()
    _until(lambda: _running(picker, x) == 1)
    failing.send(status_msg(code), response_body(json.dumps({"error": {"code": code}}).encode()))
    failing.end()
    assert picker.settled() == (2, 2, 0)
    assert not picker.st.call_soon(lambda: picker.gw.by_address(x).healthy)


STREAM_BODY = json.dumps({"model": "tiny", "prompt": "hi", "max_tokens": 2, "stream": True}).encode()
EVENTS = (b'data: {"choices": [{"text": "a"}]}\n\ndata: {"choices": [{"text": "b", "finish_reason": "length"}]}\n\n'
          b'data: {"choices": [], "usage": {"completion_tokens": 2}}\n\ndata: [DONE]\n\n')  # fmt: skip


@pytest.mark.parametrize("body, answer, want", [
    (BODY, USAGE, (200, None, 2)),
    (STREAM_BODY, EVENTS, (200, None, 2)),
    (BODY, json.dumps({"error": {"message": "bad", "type": "BadRequestError", "code": 400}}).encode(), (400, "bad", None)),
])  # fmt: skip
def test_without_response_headers_the_status_is_read_off_the_body(picker, body, answer, want):
    """A gateway that skips the response headers (response_header_mode SKIP) but sends the
    body: the response came whole, and was logged 499 'the stream ended before any response
    came' (the policy heard on_cancel, the usage was lost)."""
    out = Stream(picker.server.port, [headers_msg(), body_msg(body)])
    _until(lambda: picker.st.call_soon(lambda: sum(len(b.running) for b in picker.gw.backends)) == 1)
    out.send(response_body(answer))
    out.end()
    assert picker.settled() == (1, 1, 0)
    row = picker.rows()[0]
    status, error, tokens = want
    assert (row["status"], row["output_tokens"]) == (status, tokens)
    assert error is None and row["error"] is None or error in row["error"]
    assert picker.gw.finished == (status == 200)


def test_without_response_headers_or_body_the_status_is_unknown_and_said_so(picker):
    """Response headers skipped and body NONE: nothing tells the status; 499 as before, but the
    error says why (it said the stream ended before any response came)."""
    out = Stream(picker.server.port, [headers_msg(), body_msg(BODY)])
    _until(lambda: picker.st.call_soon(lambda: sum(len(b.running) for b in picker.gw.backends)) == 1)
    out.end()
    assert picker.settled() == (1, 1, 0)
    row = picker.rows()[0]
    assert row["status"] == 499 and "client left" in row["error"] and "response_header_mode SKIP" in row["error"]
