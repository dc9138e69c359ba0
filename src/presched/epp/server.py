"""The picker's gRPC server: Envoy's ExternalProcessor service and gRPC health.

    server = EppServer(cfg, predictor, log)
    await server.start()          # binds cfg.host:cfg.port (port 0: any free port, see .port)
    await server.stop(grace_s)

Health (grpc.health.v1) answers for "" and "liveness" (the process is up), "readiness" (the
endpoints are loaded and checked once) and "envoy.service.ext_proc.v3.ExternalProcessor";
`stop` sets the last two NOT_SERVING first and, for `drain_s`, still serves new streams.
"""

from __future__ import annotations

import asyncio
import logging

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from presched.epp import protocol as P
from presched.epp.config import EppConfig
from presched.epp.core import Picker
from presched.epp.endpoints import Pool, initial_endpoints
from presched.epp.envoy import GRPC_SLACK_BYTES, answer_limit
from presched.epp.exchange import Exchange

_log = logging.getLogger("presched.epp")
HEALTH_SERVICES = ("", "liveness", "readiness", P.SERVICE_NAME)


class Processor(pb_grpc.ExternalProcessorServicer):
    def __init__(self, picker: Picker) -> None:
        self.picker = picker

    async def Process(self, request_iterator, context):  # noqa: N802 - the gRPC method name
        ex = Exchange(self.picker)
        try:
            async for msg in request_iterator:
                for resp in await ex.on(msg):
                    yield resp
        finally:
            ex.close()  # also when the proxy reset the stream (client or endpoint gone)


class EppServer:
    def __init__(self, cfg: EppConfig, predictor=None, log=None) -> None:
        self.cfg = cfg
        self.picker = Picker(cfg, predictor, log, initial_endpoints(cfg))
        self.pool = Pool(cfg, self.picker)
        self.processor = Processor(self.picker)
        self.health = health.aio.HealthServicer() if hasattr(health, "aio") else health.HealthServicer()
        limit = cfg.max_body_bytes + GRPC_SLACK_BYTES  # a BUFFERED body comes in one message
        sent = answer_limit(cfg.max_body_bytes, cfg.max_event_bytes)  # one chunk's answer: + a held event
        self.server = grpc.aio.server(options=[("grpc.max_receive_message_length", limit),
                                               ("grpc.max_send_message_length", sent)])  # fmt: skip
        pb_grpc.add_ExternalProcessorServicer_to_server(self.processor, self.server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        try:  # grpcio returns 0 or (newer) raises RuntimeError "Failed to bind" for a port in use
            self.port = self.server.add_insecure_port(f"{cfg.host}:{cfg.port}")
        except RuntimeError:
            self.port = 0
        if self.port == 0:
            self.picker.close()
            raise OSError(f"port: cannot listen on {cfg.host}:{cfg.port} (in use, or host not an address here)")

    async def _set(self, service: str, ok: bool) -> None:
        status = health_pb2.HealthCheckResponse.SERVING if ok else health_pb2.HealthCheckResponse.NOT_SERVING
        r = self.health.set(service, status)
        if r is not None:
            await r

    async def start(self) -> None:
        await self.picker.worker.run(self.picker.count, "warm up")  # loads the tokenizer now
        for s in HEALTH_SERVICES:
            await self._set(s, s != "readiness")
        await self.server.start()
        await self.pool.start()
        await self._set("readiness", True)

    async def stop(self, grace_s: float | None = 5.0, drain_s: float = 0.0) -> None:
        """Report readiness and the ExternalProcessor service NOT_SERVING, keep serving new
        streams `drain_s` seconds (the gateway and Kubernetes see it first), then refuse new
        ones and give those in flight `grace_s`."""
        await self._set("readiness", False)
        await self._set(P.SERVICE_NAME, False)
        if drain_s > 0:
            await asyncio.sleep(drain_s)
        await self.server.stop(grace_s)
        await self.pool.stop()
        self.picker.close()

    async def wait(self) -> None:
        await self.server.wait_for_termination()
