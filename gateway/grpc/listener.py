"""The gateway's gRPC listener: the service's handlers on one of two engines, its channel options, and the
standard health service. `grpc_listener` is the one entry the gateway's process calls.

The engines (--grpc-engine): `core`, the fast path on grpcio's core (gateway/grpc/core.py and its calls,
core_call.py: the only modules that import grpc._cython), and `aio`, grpcio's public grpc.aio
(gateway/grpc/aio.py). `core` is the default; when the fast path finds the installed grpcio outside the
releases it was run on, or its private names changed (core.surface_problem), the gateway logs why and
serves on grpc.aio: a grpcio release can make the gateway slower, never take gRPC down.

Every gateway listens on --grpc-port with SO_REUSEPORT (grpcio's default): the kernel deals
connections among them. The supervisor checks the port is free before it starts anything, so a
second server on the same port is refused rather than sharing it. What a client can hold is
bounded: --grpc-max-connections connections per gateway (grpcio closes one past them at accept; its
share of the open-files budget, gateway/descriptors.py), and on each of them
--grpc-max-calls-per-connection calls and --grpc-max-connection-bytes of requests (gateway/grpc/connections.py).
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Literal, Protocol

import grpc
from tritonclient.grpc import service_pb2_grpc

from ringserve.common.settings import Settings
from ringserve.gateway.grpc.aio import AioServer
from ringserve.gateway.grpc.codec import receive_infer_request
from ringserve.gateway.grpc.connections import ConnectionLedger
from ringserve.gateway.grpc.context import CallContext
from ringserve.gateway.grpc.scheduling import helper_threads
from ringserve.gateway.grpc.server import InferenceService
from ringserve.gateway.kserve.auth import ApiKey
from ringserve.gateway.kserve.dataplane import DataPlane

log = logging.getLogger(__name__)

GRPC_MESSAGE_LIMIT = 2**31 - 1  # grpcio's options are C ints


class _Handlers:
    """Stands in for the server in the generated add_..._to_server, to take its method handlers."""

    handlers: dict | None = None

    def add_generic_rpc_handlers(self, handlers: object) -> None:
        pass

    def add_registered_method_handlers(self, service: str, handlers: dict) -> None:
        self.service, self.handlers = service, handlers


def service_handlers(service: InferenceService) -> dict[str, grpc.RpcMethodHandler]:
    """{"/service/Method": handler}: the generated service's handlers, but ModelInfer's and
    ModelStreamInfer's requests come through receive_infer_request (large raw contents left where they
    arrived), and the health service's Check."""
    taken = _Handlers()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(service, taken)
    if taken.handlers is None:  # code generated before grpcio 1.62 registers generic handlers only
        raise RuntimeError("tritonclient's service_pb2_grpc is too old for this server: install tritonclient>=2.46")
    handlers = dict(taken.handlers)
    receive = functools.partial(receive_infer_request, capacity_bytes=service.dispatcher.segment.data_capacity)
    for name in ("ModelInfer", "ModelStreamInfer"):
        handlers[name] = handlers[name]._replace(request_deserializer=receive)
    methods = {f"/{taken.service}/{name}": handler for name, handler in handlers.items()}
    methods[f"/{HEALTH_SERVICE}/Check"] = health_handler(service)
    return methods


# grpc.health.v1.Health/Check, the standard health service that Triton serves too (Kubernetes' gRPC
# probes, grpc_health_probe): SERVING while /v2/health/ready would say ready. Its two messages are
# one field each, written here rather than pulling in grpcio-health-checking for them.
HEALTH_SERVICE = "grpc.health.v1.Health"
SERVING, NOT_SERVING = b"\x08\x01", b"\x08\x02"  # HealthCheckResponse{status: 1 | 2}


def health_handler(service: InferenceService) -> grpc.RpcMethodHandler:
    async def check(request: bytes, context: CallContext) -> bytes:
        await service._authorize(context, health=True)
        return SERVING if service.plane.server_ready() else NOT_SERVING

    return grpc.unary_unary_rpc_method_handler(check)  # (no (de)serializers: raw bytes both ways)


def grpc_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


GrpcEngine = Literal["core", "aio"]


class Engine(Protocol):
    def add_port(self, address: str) -> int: ...
    async def stop(self, grace_s: float) -> None: ...


def grpc_listener(
    settings: Settings, plane: DataPlane, api_key: ApiKey | None, max_connections: int
) -> GrpcServer | None:
    """The gRPC listener of --grpc-port (None: 0, off), on --grpc-engine, over the gateway's data plane."""
    if settings.grpc_port == 0:
        return None
    service = InferenceService(
        plane,
        api_key,
        key_on_health=settings.api_key_everywhere,
        stream_max_in_flight=settings.grpc_stream_max_in_flight,
        connections=ConnectionLedger(settings.grpc_max_calls_per_connection, settings.grpc_max_connection_bytes),
    )
    return GrpcServer(
        service,
        settings.host,
        settings.grpc_port,
        settings.max_request_bytes,
        max_connections=max_connections,
        engine=settings.grpc_engine,
    )


def chosen_engine(engine: GrpcEngine) -> GrpcEngine:
    """`engine`, but the fast path only where its surface check passes (else logged, and grpc.aio)."""
    if engine == "aio":
        return "aio"
    try:
        # (imported here: a grpcio whose private names moved may fail the import itself)
        from ringserve.gateway.grpc import core  # noqa: PLC0415

        problem = core.surface_problem()
    except Exception as exc:  # noqa: BLE001 - whatever breaks the fast path, grpc.aio serves
        problem = f"its module cannot be imported ({exc!r})"
    if problem is None:
        return "core"
    log.warning("gRPC's fast path is off: %s; serving gRPC on grpc.aio (slower, public API)", problem)
    return "aio"


class GrpcServer:
    """The gateway's gRPC listener: started on the gateway's loop once it accepts HTTP, stopped
    (in-flight RPCs finishing, up to the drain timeout) before the dispatcher closes."""

    def __init__(
        self,
        service: InferenceService,
        host: str,
        port: int,
        max_receive_bytes: int,
        max_connections: int,
        engine: GrpcEngine = "core",
    ) -> None:
        self.service = service
        self.engine = engine
        self.address = grpc_address(host, port)
        self.options = [
            ("grpc.so_reuseport", 1),  # every gateway on one port (the supervisor checked it was free)
            ("grpc.max_receive_message_length", min(max_receive_bytes, GRPC_MESSAGE_LIMIT)),  # --max-request-bytes
            ("grpc.max_send_message_length", -1),
            # --grpc-max-connections (or fewer: gateway/descriptors.py); one past them is closed at accept,
            # which the client's call reports as UNAVAILABLE, rather than taking a descriptor HTTP needs.
            ("grpc.max_allowed_incoming_connections", max_connections),
            # --grpc-max-calls-per-connection, announced in SETTINGS (a client queues calls past it). With the
            # core's overload protection a stream counts until the server let go of it, so a rapid-reset
            # flood (HEADERS then RST_STREAM, again and again) has its streams refused past it too.
            ("grpc.max_concurrent_streams", service.connections.max_calls),
            ("grpc.http.overload_protection", 1),
        ]
        self.server: Engine | None = None

    async def start(self) -> None:
        """Listen; OSError when the port cannot be bound."""
        engine = chosen_engine(self.engine)
        with helper_threads():  # grpcio's threads, and the poller, give way to the loop's (gateway/grpc/scheduling.py)
            server: Any
            if engine == "core":
                from ringserve.gateway.grpc.core import CoreServer  # noqa: PLC0415 - (see chosen_engine)

                server = CoreServer(self.options, service_handlers(self.service))
            else:
                server = AioServer(self.options, service_handlers(self.service))
            try:
                bound = server.add_port(self.address)
            except RuntimeError as exc:  # grpcio >= 1.60 raises; older ones return 0
                raise OSError(f"cannot listen for gRPC on {self.address}: {exc}") from None
            if not bound:
                raise OSError(f"cannot listen for gRPC on {self.address}")
            if engine == "core":
                server.start()
            else:
                await server.start()
        self.server = server  # (stop() stops it, should the start be cancelled)
        log.info("gRPC listening on %s (engine %s)", self.address, engine)

    async def stop(self, grace_s: float) -> None:
        if self.server is not None:
            await self.server.stop(grace_s)
            self.server = None
