"""The gateway's ASGI application: API key check, then the raw infer path in front of Starlette."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.responses import Response

from ringserve.common import tracing
from ringserve.common.repository.config import ModelConfig
from ringserve.common.settings import Settings
from ringserve.gateway.cluster.peers import Peers
from ringserve.gateway.core.errors import GatewayError, MethodNotAllowed, NoRoute, error_body, status_of
from ringserve.gateway.core.region_registry import RegionRegistry
from ringserve.gateway.calls.front import WorkerCalls
from ringserve.gateway.core.settings import DispatchSettings
from ringserve.gateway.dispatch.dispatcher import Dispatcher
from ringserve.gateway.http.routes import Endpoints, match_infer_path
from ringserve.gateway.kserve.auth import ApiKey
from ringserve.gateway.kserve.dataplane import FAULT_INJECTION, DataPlane
from ringserve.gateway.observe.access import REQUEST_ID_HEADER, AccessLog, current_request_id, header_request_id
from ringserve.gateway.observe.metrics import Metrics
from ringserve.gateway.observe.process_metrics import ROLE_GATEWAY, ProcessId
from ringserve.gateway.observe.stats import Statistics
from ringserve.shm.segment import Segment

METRICS_PATH = "/metrics"
# Open without the API key unless --api-key-everywhere: probes and scrapers carry no secrets.
OPEN_PATHS = frozenset({"/v2/health/live", "/v2/health/ready", METRICS_PATH, "/openapi.json"})


@dataclass(frozen=True)
class GatewaySettings:
    """Every field required: each default is written once, in common/settings.py (`from_settings`)."""

    runtime_dir: str
    segment_name: str
    dispatch: DispatchSettings
    max_request_bytes: int
    body_timeout_s: float  # a request body that pauses this long gets 408
    model_repository: str  # for the repository API (index, load)
    api_key: str | None  # None: no key needed
    api_key_everywhere: bool  # also on OPEN_PATHS
    gateway_index: int  # this gateway, of gateway_count (they merge their numbers: gateway/cluster/peers.py)
    gateway_count: int
    access_log: bool  # one log line per request (gateway/observe/access.py)
    supervisor_pid: int  # its process metrics come from /proc/<pid> (0: started by hand, none)
    metrics_port: int  # a second port that serves /metrics only (0: none)
    allow_client_shm: bool  # clients may register shared-memory regions (gateway/core/regions.py)
    client_shm_key_prefixes: tuple[str, ...]  # ...whose keys start so (none: any key)
    max_tensor_bytes: int  # the largest input tensor a request may carry (0: only the slot bounds it)

    @classmethod
    def from_settings(
        cls, settings: Settings, segment_name: str, index: int, supervisor_pid: int, max_shm_regions: int
    ) -> GatewaySettings:
        return cls(
            runtime_dir=settings.runtime_dir,
            segment_name=segment_name,
            dispatch=DispatchSettings.from_settings(settings, index, max_shm_regions),
            max_request_bytes=settings.max_request_bytes,
            body_timeout_s=settings.body_timeout_s,
            model_repository=settings.model_repository,
            api_key=settings.api_key,
            api_key_everywhere=settings.api_key_everywhere,
            gateway_index=index,
            gateway_count=settings.gateway_count(),
            access_log=settings.access_log,
            supervisor_pid=supervisor_pid,
            metrics_port=settings.metrics_port,
            allow_client_shm=settings.allow_client_shm,
            client_shm_key_prefixes=settings.client_shm_key_prefixes,
            max_tensor_bytes=settings.max_tensor_bytes,
        )

    def __post_init__(self) -> None:
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("the API key is empty")

    def __repr__(self) -> str:  # never log the key
        return f"GatewaySettings(runtime_dir={self.runtime_dir!r}, segment_name={self.segment_name!r}, ...)"


class GatewayApp:
    """ASGI entry point. POST .../infer goes straight to Endpoints.infer."""

    def __init__(self, configs: dict[str, ModelConfig], settings: GatewaySettings) -> None:
        self.segment = Segment.attach(settings.segment_name)
        self.metrics = Metrics()
        regions = RegionRegistry(
            settings.allow_client_shm,
            settings.client_shm_key_prefixes,
            max_read_bytes=self.segment.data_capacity,
            max_regions=settings.dispatch.max_shm_regions,
        )
        statistics = Statistics()  # Triton's: the scheduler stamps them, the data plane records and answers them
        self.dispatcher = Dispatcher(
            segment=self.segment,
            configs=configs,
            runtime_dir=settings.runtime_dir,
            metrics=self.metrics,
            settings=settings.dispatch,
            regions=regions,
            statistics=statistics,
        )
        self.metrics.attach(
            self.dispatcher.snapshot,
            functools.partial(
                server_processes, settings.gateway_index, settings.supervisor_pid, self.dispatcher.worker_pids
            ),
        )
        # The other gateways, over their Unix sockets: never sent the API key (gateway/cluster/peers.py).
        self.peers = Peers(settings.runtime_dir, settings.gateway_index, settings.gateway_count)
        self.plane = DataPlane(
            configs,
            self.dispatcher,
            self.metrics,
            statistics,
            model_repository=settings.model_repository,
            peers=self.peers,
            access_log=AccessLog() if settings.access_log else None,
            max_tensor_bytes=settings.max_tensor_bytes,
        )
        self.dispatcher.on_call = WorkerCalls(self.plane, FAULT_INJECTION).on_call  # the lanes' BLS calls
        self.endpoints = Endpoints(self.plane, settings.max_request_bytes, body_timeout_s=settings.body_timeout_s)
        self.starlette = Starlette(
            routes=self.endpoints.routes(),
            lifespan=self._lifespan,
            exception_handlers={404: _not_found, 405: _method_not_allowed},
        )
        self.api_key = None if settings.api_key is None else ApiKey(settings.api_key)
        self._open_paths = frozenset() if settings.api_key_everywhere else OPEN_PATHS
        self.metrics_port = settings.metrics_port

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette):
        self.dispatcher.start(asyncio.get_running_loop())
        await self.plane.shared_memory.adopt_peer_regions()  # (a restarted gateway: its clients' regions)
        try:
            yield
        finally:
            self.dispatcher.draining = True
            self.dispatcher.close()
            self.segment.close()
            # The drain is over: the last requests' spans go out. Here, not after uvicorn's run():
            # uvicorn raises the SIGTERM it caught again once it has served, and that ends the process.
            tracing.shutdown()

    async def __call__(self, scope: dict, receive, send) -> None:
        if scope["type"] == "http":
            if self.metrics_port and scope["path"] != METRICS_PATH and on_port(scope, self.metrics_port):
                await self._serve(
                    scope,
                    send,
                    NoRoute(scope["method"], scope["path"], f" (port {self.metrics_port} serves {METRICS_PATH} only)"),
                )
                return
            # A request on this gateway's own Unix socket is trusted by the runtime dir's 0700, not by the key.
            if (
                self.api_key is not None
                and scope["path"] not in self._open_paths
                and not self.peers.is_peer_call(scope)
            ):
                refusal = self.api_key.refusal(scope["headers"])
                if refusal is not None:
                    await self._serve(scope, send, refusal)
                    return
            if scope["method"] == "POST":
                target = match_infer_path(scope["path"])
                if target is not None:  # the hot path: it makes its request id and access line itself
                    await self.endpoints.infer(scope, receive, send, *target)
                    return
            await self._serve(scope, send, receive=receive)
            return
        await self.starlette(scope, receive, send)  # the lifespan

    async def _serve(self, scope: dict, send, refusal: GatewayError | None = None, receive=None) -> None:
        """Starlette's answer (or the API key's refusal), with the request's id in its header and in an
        error body, and its access line."""
        started_ns = time.perf_counter_ns()
        request_id = header_request_id(scope["headers"])
        current_request_id.set(request_id)  # in this request's task only: error_response reads it
        response = _ResponseWatch(send, request_id)
        if refusal is not None:
            await _send_error(response.send, refusal, request_id)
        else:
            await self.starlette(scope, receive, response.send)
        if self.plane.access_log is not None:
            model = (scope.get("path_params") or {}).get("model")
            self.plane.access_log.write(
                scope["method"], scope["path"], response.status, response.nbytes, started_ns, request_id, model
            )


class _ResponseWatch:
    """Adds X-Request-ID to a response on its way out, and notes its status and size (the access line's)."""

    __slots__ = ("_send", "_header", "status", "nbytes")

    def __init__(self, send, request_id: str) -> None:
        self._send = send
        self._header = (REQUEST_ID_HEADER, request_id.encode())
        self.status = 0
        self.nbytes = 0

    async def send(self, message: dict) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            message["headers"] = [*message.get("headers", ()), self._header]
        elif message["type"] == "http.response.body":
            self.nbytes += len(message.get("body", b""))
        await self._send(message)


def on_port(scope: dict, port: int) -> bool:
    """Whether the request came in on TCP port `port` of this host (ASGI's `server`: the local address)."""
    server = scope.get("server")
    return server is not None and server[1] == port


def server_processes(
    gateway_index: int, supervisor_pid: int, worker_pids: Callable[[], dict[int, int]]
) -> list[ProcessId]:
    """The processes whose numbers this gateway reports: itself, the supervisor, the workers."""
    found = [ProcessId(ROLE_GATEWAY, gateway_index, os.getpid())]
    if supervisor_pid:
        found.append(ProcessId("supervisor", 0, supervisor_pid))
    found += [ProcessId("worker", index, pid) for index, pid in sorted(worker_pids().items())]
    return found


async def _send_error(send, exc: GatewayError, request_id: str) -> None:
    body = error_body(str(exc), request_id)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.encode(), v.encode()) for k, v in exc.headers.items()]
    await send({"type": "http.response.start", "status": status_of(exc), "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _not_found(request, exc) -> Response:
    path = request.url.path
    suffixes = ("/infer", "/ready", "/config", "/stats")
    hint = " (model names cannot contain '/')" if path.startswith("/v2/models/") and path.endswith(suffixes) else ""
    error = NoRoute(request.method, path, hint)
    return Response(error_body(str(error), current_request_id.get()), status_of(error), media_type="application/json")


async def _method_not_allowed(request, exc) -> Response:
    allowed = (getattr(exc, "headers", None) or {}).get("Allow", "another method")
    error = MethodNotAllowed(request.method, request.url.path, allowed)
    return Response(
        error_body(str(error), current_request_id.get()),
        status_of(error),
        headers=error.headers,
        media_type="application/json",
    )
