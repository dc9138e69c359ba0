"""The Gateway API Inference Extension's endpoint-picker protocol over Envoy ext_proc v3: the
names it fixes and the `ProcessingResponse`s the picker sends.

Per HTTP request the proxy opens one bidirectional `ExternalProcessor.Process` stream, in one of
two body modes (Envoy names them in the first message's `protocol_config`, `announced_modes`):

    BUFFERED request, STREAMED response (presched's Envoy by default):
        request_headers (answered at once) -> request_body, whole (answered with the pick)
        -> response_headers -> response_body chunks, each answered [-> response_trailers]
    FULL_DUPLEX_STREAMED both ways (GIE's standard):
        request_headers -> request_body chunks -> request_trailers (the pick answers the headers)
        -> response_headers -> response_body chunks [-> response_trailers]

The picker decides once the whole body is in (as GIE's picker does) and sets
`x-gateway-destination-endpoint` to the picked endpoint followed by its ordered fallbacks
(`ip:port,ip:port,...`), with the same value in the `envoy.lb` dynamic metadata under the same
key: in FULL_DUPLEX_STREAMED mode on the held request headers (`route_headers`, the body going
back as a streamed body mutation), in BUFFERED mode on the body's answer (`route_body`: header
mutation, content-length of the rewritten body, body mutation in one CommonResponse). Refusals
are `ImmediateResponse`s (503 when no endpoint is eligible, 429 when the request is shed) with
an OpenAI-format JSON body.

Inputs: the subset hint in `metadata_context.filter_metadata["envoy.lb.subset_hint"]
["x-gateway-destination-endpoint-subset"]` (a list of ip:port); the served endpoint in
`envoy.lb / x-gateway-destination-endpoint-served` or, from Envoy, the `upstream.address`
attribute of the response headers (`response_attributes` in the filter config).
"""

from __future__ import annotations

import json
import math

from envoy.config.core.v3 import base_pb2
from envoy.extensions.filters.http.ext_proc.v3 import processing_mode_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

LB_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
SUBSET_KEY = "x-gateway-destination-endpoint-subset"
SERVED_KEY = "x-gateway-destination-endpoint-served"
EXT_PROC_ATTRS = "envoy.filters.http.ext_proc"
UPSTREAM_ADDRESS = "upstream.address"
SERVICE_NAME = "envoy.service.ext_proc.v3.ExternalProcessor"
_BODY_MODE = processing_mode_pb2.ProcessingMode.BodySendMode
BUFFERED, DUPLEX, NO_BODY = "BUFFERED", "FULL_DUPLEX_STREAMED", "NONE"
# EppConfig.envoy_body_mode -> (request, response) body modes, assumed when Envoy names none
CONFIGURED_MODES = {"buffered": (BUFFERED, "STREAMED"), "full-duplex": (DUPLEX, DUPLEX)}


def announced_modes(req: pb.ProcessingRequest) -> tuple[str, str] | None:
    """The (request, response) body modes Envoy names in `protocol_config` (Envoy 1.40 sends it
    in the first message of each stream), as BodySendMode names; None when it names none."""
    if not req.HasField("protocol_config"):
        return None
    pc = req.protocol_config
    return _BODY_MODE.Name(pc.request_body_mode), _BODY_MODE.Name(pc.response_body_mode)


def headers_of(msg: pb.HttpHeaders) -> dict[str, str]:
    """The headers of a request/response headers message, names lower case (Envoy sends the
    value in `raw_value`; the last of repeated names wins)."""
    out = {}
    for h in msg.headers.headers:
        out[h.key.lower()] = h.raw_value.decode("utf-8", "replace") if h.raw_value else h.value
    return out


def subset_hint(req: pb.ProcessingRequest) -> set[str] | None:
    """The endpoints the proxy allows for this request, or None (no hint: any)."""
    fm = req.metadata_context.filter_metadata
    if SUBSET_NAMESPACE not in fm or SUBSET_KEY not in fm[SUBSET_NAMESPACE].fields:
        return None
    v = fm[SUBSET_NAMESPACE].fields[SUBSET_KEY]
    if v.HasField("list_value"):
        return {x.string_value for x in v.list_value.values}
    return {s.strip() for s in v.string_value.split(",") if s.strip()}


def served_endpoint(req: pb.ProcessingRequest) -> str | None:
    """The endpoint that actually served the request, as the proxy reports it."""
    fm = req.metadata_context.filter_metadata
    if LB_NAMESPACE in fm and SERVED_KEY in fm[LB_NAMESPACE].fields:
        return fm[LB_NAMESPACE].fields[SERVED_KEY].string_value or None
    attrs = req.attributes.get(EXT_PROC_ATTRS)
    if attrs is not None and UPSTREAM_ADDRESS in attrs.fields:
        return attrs.fields[UPSTREAM_ADDRESS].string_value or None
    return None


def _set(headers: dict[str, str]) -> pb.HeaderMutation:
    return pb.HeaderMutation(set_headers=[
        base_pb2.HeaderValueOption(header=base_pb2.HeaderValue(key=k, raw_value=v.encode()),
                                   append_action=base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD)
        for k, v in headers.items()])  # fmt: skip


def _route(dest_header: str, destinations: list[str], extra: dict[str, str],
           length: int | None) -> tuple[pb.HeaderMutation, struct_pb2.Struct]:  # fmt: skip
    dests = ",".join(destinations)
    md = struct_pb2.Struct()
    md.update({LB_NAMESPACE: {dest_header: dests}})
    hdrs = {dest_header: dests, **extra}
    if length is not None:
        hdrs["content-length"] = str(length)
    return _set(hdrs), md


def route_headers(dest_header: str, destinations: list[str], extra: dict[str, str]) -> pb.ProcessingResponse:
    """The pick as the answer to the request headers: the primary and its ordered fallbacks,
    `ip:port,ip:port,...`, in the destination header and in the `envoy.lb` dynamic metadata
    under the same key (GIE's protocol; Envoy's `override_host` policy reads either and tries
    the next address on each retry)."""
    mut, md = _route(dest_header, destinations, extra, None)
    # a FULL_DUPLEX_STREAMED body is rewritten as a stream: its length is no longer the client's
    mut.remove_headers.append("content-length")
    return pb.ProcessingResponse(
        request_headers=pb.HeadersResponse(response=pb.CommonResponse(header_mutation=mut)),
        dynamic_metadata=md)  # fmt: skip


def route_body(dest_header: str, destinations: list[str], extra: dict[str, str],
               payload: bytes | None) -> pb.ProcessingResponse:  # fmt: skip
    """The pick as the answer to a BUFFERED request body: the same header mutation and
    metadata as `route_headers` (Envoy still holds the headers), and the body replaced by
    `payload` with its content-length (None: the body passes unchanged). No clear_route_cache:
    the route does not depend on these headers (`override_host` reads them after routing)."""
    mut, md = _route(dest_header, destinations, extra, None if payload is None else len(payload))
    common = pb.CommonResponse(header_mutation=mut)
    if payload is not None:
        common.body_mutation.body = payload
    return pb.ProcessingResponse(request_body=pb.BodyResponse(response=common), dynamic_metadata=md)


def plain_headers(phase: str, extra: dict[str, str] | None = None) -> pb.ProcessingResponse:
    """Continue after a headers message of `phase` ('request' or 'response'), setting `extra`."""
    common = pb.CommonResponse(header_mutation=_set(extra)) if extra else pb.CommonResponse()
    return pb.ProcessingResponse(**{f"{phase}_headers": pb.HeadersResponse(response=common)})


def body(phase: str, data: bytes, end: bool) -> pb.ProcessingResponse:
    """A streamed body mutation (FULL_DUPLEX_STREAMED) of `phase` carrying `data`."""
    mut = pb.BodyMutation(streamed_response=pb.StreamedBodyResponse(body=data, end_of_stream=end))
    return pb.ProcessingResponse(**{f"{phase}_body": pb.BodyResponse(response=pb.CommonResponse(body_mutation=mut))})


def chunk_answer(phase: str, data: bytes, original: bytes) -> pb.ProcessingResponse:
    """The answer to one STREAMED (or BUFFERED) body message of `phase`: `data` in place of
    `original` (no mutation when they are the same bytes, the body cleared when `data` is empty)."""
    common = pb.CommonResponse()
    if data != original:
        if data:
            common.body_mutation.body = data
        else:
            common.body_mutation.clear_body = True
    return pb.ProcessingResponse(**{f"{phase}_body": pb.BodyResponse(response=common)})


def trailers(phase: str) -> pb.ProcessingResponse:
    return pb.ProcessingResponse(**{f"{phase}_trailers": pb.TrailersResponse()})


def error_body(status: int, message: str, kind: str, param: str | None) -> bytes:
    """The OpenAI error format, as `presched serve` answers it."""
    return json.dumps({"error": {"message": message, "type": kind, "param": param, "code": status}}).encode()


def immediate(status: int, message: str, kind: str = "invalid_request_error", param: str | None = None,
              retry_after: float | None = None, body_bytes: bytes | None = None) -> pb.ProcessingResponse:  # fmt: skip
    """End the request at the proxy with `status` and an OpenAI-format error body."""
    hdrs = {"content-type": "application/json"}
    if retry_after is not None:
        hdrs["retry-after"] = str(max(1, math.ceil(retry_after)))
    data = body_bytes if body_bytes is not None else error_body(status, message, kind, param)
    return pb.ProcessingResponse(immediate_response=pb.ImmediateResponse(
        status=http_status_pb2.HttpStatus(code=status), headers=_set(hdrs), body=data,
        details=f"presched_{status}"))  # fmt: skip
