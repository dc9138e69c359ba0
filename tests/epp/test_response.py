"""`ResponseTap` bounds an unfinished server-sent event at `max_event_bytes`, over real gRPC (a
direct client plays Envoy, sending response chunks as large as the picker accepts), in both
response body modes: an event that stays under the bound passes whole; a stream that never ends
its event is cut, as `presched serve` cuts it: the client gets an OpenAI-format error event
(502, no `[DONE]`), the request ends at once with 502 (logged as failed, its endpoint held
down), nothing more is held or passed on, and no answer exceeds the gRPC limit. Before the fix
the picker held the whole stream, then sent it as one message over the limit
(RESOURCE_EXHAUSTED) and logged the request 200."""

from __future__ import annotations

import json

import pytest
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from epp.test_exchange import Picker, body_msg, headers_msg, process

BODY = json.dumps({"model": "tiny", "prompt": "hi", "max_tokens": 2, "stream": True}).encode()
MAX_EVENT = 4096


@pytest.fixture
def picker(stack, tmp_path):
    # max_body_bytes at its least: the picker takes gRPC messages of 1 KiB + 1 MiB
    p = Picker(stack, tmp_path, max_event_bytes=MAX_EVENT, max_body_bytes=1024)
    yield p
    p.stop()


def _event(text: str) -> bytes:
    return b"data: " + json.dumps({"choices": [{"index": 0, "text": text}]}).encode() + b"\n\n"


def _response(chunks: list[bytes]) -> list:
    head = pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=pb.HttpHeaders().headers))
    head.response_headers.headers.headers.add(key=":status", raw_value=b"200")
    last = len(chunks) - 1
    return [head] + [pb.ProcessingRequest(response_body=pb.HttpBody(body=c, end_of_stream=i == last))
                     for i, c in enumerate(chunks)]  # fmt: skip


def _passed(o: pb.ProcessingResponse, sent: bytes) -> bytes:
    """What the client gets in place of `sent`, from the picker's answer to that chunk."""
    common = o.response_body.response
    if not common.HasField("body_mutation"):
        return sent
    m = common.body_mutation
    which = m.WhichOneof("mutation")
    return m.body if which == "body" else b"" if which == "clear_body" else m.streamed_response.body


@pytest.mark.parametrize("mode", ["buffered", "full-duplex"])
def test_an_unfinished_event_over_max_event_bytes_cuts_the_stream_with_a_502_error_event(picker, mode):
    first = _event("a" * (MAX_EVENT - 200))  # near the bound, in two pieces: passes whole
    endless = [b"data: " + b"x" * (600 << 10)] + [b"x" * (600 << 10)] * 3 + [b"\n\n"]  # 2.4 MiB, one event
    chunks = [first[:100], first[100:], *endless]
    request = [headers_msg(mode=mode), body_msg(BODY)]
    out = process(picker.server.port, request + _response(chunks), big=True)
    assert [o.WhichOneof("response") for o in out[:3]] == ["request_headers", "request_body", "response_headers"], out[:3]
    answers = out[3:]
    assert len(answers) == len(chunks) and all(o.WhichOneof("response") == "response_body" for o in answers)
    got = [_passed(o, c) for o, c in zip(answers, chunks)]
    assert got[0] + got[1] == first  # held until whole, then passed on
    assert got[2].startswith(b"data: {") and got[2].endswith(b"\n\n")
    err = json.loads(got[2][6:])["error"]
    assert err["code"] == 502 and err["type"] == "server_error" and "max_event_bytes" in err["message"]
    assert got[3:] == [b""] * (len(chunks) - 3)  # the rest of the endless event: dropped
    assert max(o.ByteSize() for o in out) < 64 << 10  # no answer near the gRPC limit
    assert picker.settled() == (1, 1, 0)
    rows = picker.rows()
    assert len(rows) == 1 and rows[0]["status"] == 502 and "max_event_bytes" in rows[0]["error"]
    name = rows[0]["backend"]
    assert not picker.st.call_soon(lambda: picker.gw.by_address(name).healthy)  # held down, as serve does


def test_max_event_bytes_is_checked_and_passed_to_the_decision_core():
    from presched.epp.config import EppConfig

    cfg = EppConfig(endpoints=[{"address": "10.0.0.1:8000"}], max_event_bytes=8192)
    assert cfg.max_event_bytes == 8192 and cfg.gateway_config().max_event_bytes == 8192
    assert EppConfig(endpoints=[{"address": "10.0.0.1:8000"}]).max_event_bytes == 2**20  # serve's default
    with pytest.raises(ValueError, match="max_event_bytes"):
        EppConfig(endpoints=[{"address": "10.0.0.1:8000"}], max_event_bytes=10)
