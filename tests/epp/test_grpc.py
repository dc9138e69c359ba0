"""The picker's gRPC face, spoken to directly (a real gRPC client plays Envoy's side of the
stream, for what a plain Envoy cannot send: the subset hint, either body mode announced or none)
and gRPC health."""

from __future__ import annotations

import json

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from google.protobuf import struct_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc


_MODE = processing_mode_pb2.ProcessingMode
ANNOUNCE = {"full-duplex": (_MODE.FULL_DUPLEX_STREAMED, _MODE.FULL_DUPLEX_STREAMED),
            "buffered": (_MODE.BUFFERED, _MODE.STREAMED), "streamed": (_MODE.STREAMED, _MODE.STREAMED)}  # fmt: skip


def _exchange(port: int, body: dict, subset: list[str] | None = None, fairness: str | None = None,
              announce: str | None = "full-duplex", chunked: bool | None = None):  # fmt: skip
    """One request's request side as Envoy sends it in mode `announce` (protocol_config on the
    first message; None: not announced): the body in two chunks, or whole (`chunked` False;
    default: chunked unless the mode is buffered)."""
    hdrs = [(":method", "POST"), (":path", "/v1/completions"), ("content-type", "application/json")]
    if fairness:
        hdrs.append(("x-gateway-inference-fairness-id", fairness))
    md = base_pb2.Metadata()
    if subset is not None:
        s = struct_pb2.Struct()
        s.update({"x-gateway-destination-endpoint-subset": subset})
        md.filter_metadata["envoy.lb.subset_hint"].CopyFrom(s)
    first = pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=[
            base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in hdrs])),
        metadata_context=md)  # fmt: skip
    if announce is not None:
        req, resp = ANNOUNCE[announce]
        first.protocol_config.CopyFrom(pb.ProtocolConfiguration(request_body_mode=req, response_body_mode=resp))
    raw = json.dumps(body).encode()
    if chunked if chunked is not None else announce != "buffered":
        msgs = [first, pb.ProcessingRequest(request_body=pb.HttpBody(body=raw[:5])),
                pb.ProcessingRequest(request_body=pb.HttpBody(body=raw[5:], end_of_stream=True))]
    else:
        msgs = [first, pb.ProcessingRequest(request_body=pb.HttpBody(body=raw, end_of_stream=True))]
    with grpc.insecure_channel(f"127.0.0.1:{port}") as ch:
        return list(pb_grpc.ExternalProcessorStub(ch).Process(iter(msgs), timeout=20))


def _set_headers(common) -> dict[str, str]:
    return {h.header.key: h.header.raw_value.decode() for h in common.header_mutation.set_headers}


def test_destination_metadata_lists_fallbacks_and_the_subset_hint_restricts(stack):
    addrs = [e.address for e in stack.st.picker.cfg.endpoints]
    port = stack.st.ports["epp"]
    out = _exchange(port, {"model": "tiny", "prompt": "hi", "max_tokens": 2})
    head = out[0]
    dest = {h.header.key: h.header.raw_value.decode() for h in head.request_headers.response.header_mutation.set_headers}
    listed = head.dynamic_metadata.fields["envoy.lb"].struct_value.fields["x-gateway-destination-endpoint"].string_value
    primary = dest["x-gateway-destination-endpoint"]
    assert listed == primary and sorted(listed.split(",")) == sorted(addrs)  # header = metadata, fallbacks: 2
    assert out[1].request_body.response.body_mutation.streamed_response.end_of_stream
    # the chunked body arrived whole and went back rewritten, with the prediction
    sent = json.loads(out[1].request_body.response.body_mutation.streamed_response.body)
    assert sent["prompt"] == "hi" and "presched_pred_mean" in sent["vllm_xargs"]
    only = addrs[2]
    out = _exchange(port, {"model": "tiny", "prompt": "hi", "max_tokens": 2}, subset=[only])
    listed = out[0].dynamic_metadata.fields["envoy.lb"].struct_value.fields["x-gateway-destination-endpoint"].string_value
    assert listed == only
    out = _exchange(port, {"model": "tiny", "prompt": "hi", "max_tokens": 2}, subset=["10.9.9.9:8000"])
    imm = out[0].immediate_response
    assert imm.status.code == 503 and json.loads(imm.body)["error"]["type"] == "server_error"
    stack.idle()  # the two streams closed without a response: their slots are free again


def test_a_buffered_body_is_answered_with_the_pick_and_the_rewritten_body(stack):
    """BUFFERED (announced, or not announced to a picker configured so): the headers are
    answered at once and unchanged; the body's answer carries the pick (header + metadata),
    the rewritten body as a whole-body mutation and its content-length."""
    addrs = [e.address for e in stack.st.picker.cfg.endpoints]
    assert stack.st.picker.cfg.envoy_body_mode == "buffered"
    for announce in ("buffered", None):
        out = _exchange(stack.st.ports["epp"], {"model": "tiny", "prompt": "hi", "max_tokens": 2}, announce=announce,
                        chunked=False)  # fmt: skip
        assert [o.WhichOneof("response") for o in out] == ["request_headers", "request_body"]
        assert not out[0].request_headers.response.HasField("header_mutation")
        common = out[1].request_body.response
        set_ = _set_headers(common)
        listed = out[1].dynamic_metadata.fields["envoy.lb"].struct_value.fields["x-gateway-destination-endpoint"].string_value
        assert set_["x-gateway-destination-endpoint"] == listed and sorted(listed.split(",")) == sorted(addrs)
        sent = common.body_mutation.body
        assert int(set_["content-length"]) == len(sent)
        assert json.loads(sent)["prompt"] == "hi" and "presched_pred_mean" in json.loads(sent)["vllm_xargs"]
    stack.idle()


def test_a_request_body_mode_the_picker_cannot_use_is_refused_at_once(stack):
    """STREAMED request bodies (each chunk answered before the next) would never let the
    picker hold the headers until the body is whole: a clear 500, not a hang."""
    out = _exchange(stack.st.ports["epp"], {"model": "tiny", "prompt": "hi"}, announce="streamed")
    imm = out[0].immediate_response
    assert imm.status.code == 500 and "STREAMED" in json.loads(imm.body)["error"]["message"]
    stack.idle()


def test_the_announced_mode_wins_over_the_configured_one(stack):
    """A picker configured full-duplex answers a stream that announces BUFFERED in BUFFERED
    form, and one that announces nothing in full-duplex form (its configured mode)."""
    from presched.epp.config import EppConfig
    from presched.epp.local import free_port
    from presched.epp.server import EppServer

    st = stack.st
    cfg = EppConfig(endpoints=st.picker.cfg.endpoints, envoy_body_mode="full-duplex", port=free_port(),
                    log={"path": None})  # fmt: skip
    server = st.call(_started(EppServer, cfg))
    try:
        req = {"model": "tiny", "prompt": "hi", "max_tokens": 2}
        buffered = _exchange(server.port, req, announce="buffered")
        assert [o.WhichOneof("response") for o in buffered] == ["request_headers", "request_body"]
        assert "x-gateway-destination-endpoint" in _set_headers(buffered[1].request_body.response)
        duplex = _exchange(server.port, req, announce=None)
        assert [o.WhichOneof("response") for o in duplex] == ["request_headers", "request_body"]
        assert "x-gateway-destination-endpoint" in _set_headers(duplex[0].request_headers.response)
        assert duplex[1].request_body.response.body_mutation.streamed_response.end_of_stream
    finally:
        st.call(server.stop(0))


def test_grpc_health_liveness_readiness_and_the_service(stack):
    with grpc.insecure_channel(f"127.0.0.1:{stack.st.ports['epp']}") as ch:
        stub = health_pb2_grpc.HealthStub(ch)
        for svc in ("liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor"):
            r = stub.Check(health_pb2.HealthCheckRequest(service=svc), timeout=5)
            assert r.status == health_pb2.HealthCheckResponse.SERVING, svc


def test_the_served_endpoint_report_moves_the_requests_work(stack):
    """The proxy reports that another endpoint served the request (a fallback): the picker's
    books follow it, the picked one counts as failed (down until its hold ends)."""
    import time

    st, gw = stack.st, stack.st.picker.gw
    addrs = [e.address for e in st.picker.cfg.endpoints]
    hdrs = [(":method", "POST"), (":path", "/v1/completions"), ("content-type", "application/json")]
    raw = json.dumps({"model": "tiny", "prompt": "hi", "max_tokens": 2}).encode()
    with grpc.insecure_channel(f"127.0.0.1:{st.ports['epp']}") as ch:
        call = pb_grpc.ExternalProcessorStub(ch).Process
        import queue

        q: queue.Queue = queue.Queue()

        def requests():
            yield pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=[
                base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in hdrs])))  # fmt: skip
            yield pb.ProcessingRequest(request_body=pb.HttpBody(body=raw, end_of_stream=True))
            yield q.get(timeout=10)
            yield q.get(timeout=10)

        it = call(requests(), timeout=20)  # BUFFERED, the configured mode (nothing announced)
        next(it)  # the headers, answered at once
        picked = _set_headers(next(it).request_body.response)["x-gateway-destination-endpoint"].split(",")[0]
        other = next(a for a in addrs if a != picked)
        md = base_pb2.Metadata()
        s = struct_pb2.Struct()
        s.update({"x-gateway-destination-endpoint-served": other})
        md.filter_metadata["envoy.lb"].CopyFrom(s)
        q.put(pb.ProcessingRequest(response_headers=pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=[
            base_pb2.HeaderValue(key=":status", raw_value=b"200")])), metadata_context=md))  # fmt: skip
        resp = next(it)
        got = {h.header.key: h.header.raw_value.decode() for h in resp.response_headers.response.header_mutation.set_headers}
        assert got["x-presched-endpoint"] == other
        assert st.call_soon(lambda: [len(gw.by_address(a).running) for a in (picked, other)]) == [0, 1]
        assert not st.call_soon(lambda: gw.by_address(picked).healthy)
        q.put(pb.ProcessingRequest(response_body=pb.HttpBody(body=b'{"usage": {"completion_tokens": 2}}', end_of_stream=True)))
        last = list(it)
        # STREAMED: the chunk answered, unchanged (no mutation)
        assert [o.WhichOneof("response") for o in last] == ["response_body"]
        assert not last[0].response_body.response.HasField("body_mutation")
    stack.idle()
    row = stack.rows()[-1]
    assert (row["backend"], row["status"], row["output_tokens"], row["retries"]) == (other, 200, 2, 1)
    end = time.monotonic() + 15
    while not st.call_soon(lambda: gw.by_address(picked).healthy):  # health checks bring it back
        assert time.monotonic() < end
        time.sleep(0.05)


def test_passthrough_mode_sends_at_once_with_the_prediction_as_vllm_priority(stack):
    """A second picker on the same engines, in passthrough mode (no holding): the body carries
    the predicted length as vLLM's `priority` (lower runs first), a long prompt a larger one."""
    from epp.conftest import fitted_predictor
    from presched.epp.config import EppConfig
    from presched.epp.local import free_port
    from presched.epp.server import EppServer

    st = stack.st
    cfg = EppConfig(endpoints=st.picker.cfg.endpoints, mode="passthrough", port=free_port(), log={"path": None})
    server = st.call(_started(EppServer, cfg, fitted_predictor()))
    try:
        short = _exchange(server.port, {"model": "tiny", "prompt": "hi", "max_tokens": 2, "priority": -5})
        long = _exchange(server.port, {"model": "tiny", "prompt": "word " * 300, "max_tokens": 2})
        ps = [json.loads(o[1].request_body.response.body_mutation.streamed_response.body)["priority"] for o in (short, long)]
        assert 0 <= ps[0] < ps[1]  # the client's own priority is replaced by the prediction
    finally:
        st.call(server.stop(0))


async def _started(cls, *args):
    server = cls(*args)  # on the stack's loop: grpc.aio binds the loop it is created on
    await server.start()
    return server


def test_stop_reports_not_serving_and_drains_before_refusing_new_streams(stack):
    """Shutdown set readiness NOT_SERVING and refused new streams at once (server.stop(grace)
    straight after), so the readiness flip never helped; the ExternalProcessor service stayed
    SERVING. Now both read NOT_SERVING and new streams are still served for drain_s."""
    import asyncio
    import time

    from presched.epp.config import EppConfig
    from presched.epp.local import free_port
    from presched.epp.server import EppServer

    st = stack.st
    cfg = EppConfig(endpoints=st.picker.cfg.endpoints, port=free_port(), log={"path": None}, drain_s=0.8)
    server = st.call(_started(EppServer, cfg))
    fut = asyncio.run_coroutine_threadsafe(server.stop(0, drain_s=cfg.drain_s), st.loop)
    try:
        time.sleep(0.2)
        with grpc.insecure_channel(f"127.0.0.1:{server.port}") as ch:
            stub = health_pb2_grpc.HealthStub(ch)
            got = {svc: stub.Check(health_pb2.HealthCheckRequest(service=svc), timeout=5).status
                   for svc in ("liveness", "readiness", "envoy.service.ext_proc.v3.ExternalProcessor")}  # fmt: skip
        S = health_pb2.HealthCheckResponse
        assert got == {"liveness": S.SERVING, "readiness": S.NOT_SERVING,
                       "envoy.service.ext_proc.v3.ExternalProcessor": S.NOT_SERVING}  # fmt: skip
        out = _exchange(server.port, {"model": "tiny", "prompt": "hi", "max_tokens": 2}, announce="buffered")
        assert [o.WhichOneof("response") for o in out] == ["request_headers", "request_body"]  # still served
    finally:
        fut.result(10)
