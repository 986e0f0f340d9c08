"""The gateway process's composition root: its parts, built once, and its two front ends run as peers.

`build_parts` makes the segment, the metrics, Triton's statistics, the client regions, the dispatcher,
the peers and the data plane; HTTP (gateway/http/) and gRPC (gateway/grpc/) are each handed the one
DataPlane, and `GatewayProcess.serve` runs them side by side (MLServer's server.py is the model). Neither
front end builds or stops anything but its own listener. The order, here only:

    start   the dispatcher (the link binds), the peers' shared-memory regions adopted, the wait for
            a worker (wait_for_worker_s), HTTP listening; gRPC once a worker serves this gateway
    stop    (SIGTERM or SIGINT; a second one forces) ready goes false at once; HTTP stops accepting
            and gRPC refuses new RPCs together, running ones finish within --drain-timeout-s; then
            the dispatcher closes, the segment, and the last spans go out
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import signal
import socket
from collections.abc import Callable
from dataclasses import dataclass

from ringserve.common import tracing
from ringserve.common.metrics_config import MetricsConfig, parse_metrics_config
from ringserve.common.repository.config import ModelConfig
from ringserve.common.settings import Settings
from ringserve.gateway.cache.metrics import CacheMetrics
from ringserve.gateway.cache.responses import ResponseCache
from ringserve.gateway.calls.front import WorkerCalls
from ringserve.gateway.cluster.peers import Peers
from ringserve.gateway.core.region_registry import RegionRegistry
from ringserve.gateway.core.settings import DispatchSettings
from ringserve.gateway.dispatch.dispatcher import Dispatcher
from ringserve.gateway.grpc.listener import GrpcServer, grpc_listener
from ringserve.gateway.http.engine import HttpServer
from ringserve.gateway.kserve.auth import ApiKey
from ringserve.gateway.kserve.dataplane import FAULT_INJECTION, DataPlane
from ringserve.gateway.kserve.repository import Repository
from ringserve.gateway.observe.access import AccessLog
from ringserve.gateway.observe.metrics import Metrics
from ringserve.gateway.observe.process_metrics import ROLE_GATEWAY, ProcessId
from ringserve.gateway.observe.stats import Statistics
from ringserve.gateway.observe.triton_gauges import register_triton_families
from ringserve.shm.cache import CacheStore
from ringserve.shm.segment import Segment

log = logging.getLogger("ringserve.gateway")

# A gateway accepts connections only once a worker has announced itself to it (or after this
# long), but for gateway 0 at the server's start (it answers the health probe while the workers
# load: live, not ready). On the shared socket the gateway that is ready, or the kernel's
# backlog, keeps the clients meanwhile, where this one would answer them 503: at the start
# (gateway 0 ready, gateway 1 not yet told of the worker) and while the workers reconnect to a
# restarted gateway.
RESTART_WAIT_FOR_WORKER_S = 5.0
START_WAIT_FOR_WORKER_S = 300.0  # the workers load their models first (systemd's TimeoutStartSec)


def wait_for_worker_s(index: int, generation: int) -> float:
    if generation > 0:
        return RESTART_WAIT_FOR_WORKER_S
    return START_WAIT_FOR_WORKER_S if index > 0 else 0.0


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
    api_key_everywhere: bool  # also on the open paths (health, metrics, /openapi.json)
    gateway_index: int  # this gateway, of gateway_count (they merge their numbers: gateway/cluster/peers.py)
    gateway_count: int
    access_log: bool  # one log line per request (gateway/observe/access.py)
    supervisor_pid: int  # its process metrics come from /proc/<pid> (0: started by hand, none)
    metrics_port: int  # a second port that serves /metrics only (0: none)
    allow_client_shm: bool  # clients may register shared-memory regions (gateway/core/regions.py)
    client_shm_key_prefixes: tuple[str, ...]  # ...whose keys start so (none: any key)
    max_tensor_bytes: int  # the largest input tensor a request may carry (0: only the slot bounds it)
    metrics_config: MetricsConfig  # --metrics-config (common/metrics_config.py)
    response_cache_segment: str  # Triton's response cache, the supervisor's store (shm/cache.py); "": none

    @classmethod
    def from_settings(
        cls, settings: Settings, segment_name: str, index: int, supervisor_pid: int, max_shm_regions: int
    ) -> GatewaySettings:
        return cls(
            runtime_dir=settings.runtime_dir or "",  # (the supervisor always sets it)
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
            metrics_config=parse_metrics_config(settings.metrics_config),
            response_cache_segment=settings.response_cache_segment,
        )

    def __post_init__(self) -> None:
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("the API key is empty")

    def __repr__(self) -> str:  # never log the key
        return f"GatewaySettings(runtime_dir={self.runtime_dir!r}, segment_name={self.segment_name!r}, ...)"


@dataclass(frozen=True)
class GatewayParts:
    """What one gateway process is made of, below its front ends."""

    segment: Segment
    metrics: Metrics
    dispatcher: Dispatcher
    peers: Peers
    plane: DataPlane
    api_key: ApiKey | None


def build_parts(configs: dict[str, ModelConfig], settings: GatewaySettings) -> GatewayParts:
    """The gateway's parts, each handed the ones below it; nothing started yet (GatewayProcess.serve)."""
    segment = Segment.attach(settings.segment_name)
    metrics = Metrics()
    regions = RegionRegistry(
        settings.allow_client_shm,
        settings.client_shm_key_prefixes,
        max_read_bytes=segment.data_capacity,
        max_regions=settings.dispatch.max_shm_regions,
    )
    # Triton's: the scheduler stamps them, the data plane records and answers them
    statistics = Statistics(settings.metrics_config)
    dispatcher = Dispatcher(
        segment=segment,
        configs=configs,
        runtime_dir=settings.runtime_dir,
        metrics=metrics,
        settings=settings.dispatch,
        regions=regions,
        statistics=statistics,
    )
    metrics.attach(
        dispatcher.snapshot,
        functools.partial(server_processes, settings.gateway_index, settings.supervisor_pid, dispatcher.worker_pids),
    )
    register_triton_families(metrics.registry, statistics, dispatcher)  # nv_cpu_*, nv_model_load_*, summaries
    # The other gateways, over their Unix sockets: never sent the API key (gateway/cluster/peers.py).
    peers = Peers(settings.runtime_dir, settings.gateway_index, settings.gateway_count)
    cache = None
    if settings.response_cache_segment:  # every gateway's one store (gateway/cache/)
        cache = ResponseCache(CacheStore.open(settings.response_cache_segment), statistics)
        metrics.registry.register(CacheMetrics(cache, dispatcher.catalog))  # nv_cache_*
    plane = DataPlane(
        configs,
        dispatcher,
        metrics,
        statistics,
        repository=Repository(settings.model_repository, configs, dispatcher),
        peers=peers,
        access_log=AccessLog() if settings.access_log else None,
        max_tensor_bytes=settings.max_tensor_bytes,
        cache=cache,
    )
    calls = WorkerCalls(plane, FAULT_INJECTION)  # the lanes' BLS calls (gateway/calls/)
    dispatcher.on_call, dispatcher.on_worker_exited = calls.on_call, calls.streams.caller_exited
    api_key = None if settings.api_key is None else ApiKey(settings.api_key)
    return GatewayParts(segment, metrics, dispatcher, peers, plane, api_key)


def server_processes(
    gateway_index: int, supervisor_pid: int, worker_pids: Callable[[], dict[int, int]]
) -> list[ProcessId]:
    """The processes whose numbers this gateway reports: itself, the supervisor, the workers."""
    found = [ProcessId(ROLE_GATEWAY, gateway_index, os.getpid())]
    if supervisor_pid:
        found.append(ProcessId("supervisor", 0, supervisor_pid))
    found += [ProcessId("worker", index, pid) for index, pid in sorted(worker_pids().items())]
    return found


def grpc_front_end(settings: Settings, parts: GatewayParts, max_connections: int) -> GrpcServer | None:
    """The gRPC listener of --grpc-port (None: 0, off), on --grpc-engine, over the same data plane as HTTP."""
    return grpc_listener(settings, parts.plane, parts.api_key, max_connections)


class GatewayProcess:
    """The gateway's parts and its front ends: HTTP listens once a worker serves this gateway (see
    wait_for_worker_s); gRPC (when on) runs on the same loop and listens once a worker serves it, gateway 0
    at the start included (no probe needs it earlier, and the kernel deals SO_REUSEPORT connections only
    among the gateways that listen). It takes SIGTERM and SIGINT itself (HttpServer leaves them alone)."""

    def __init__(
        self,
        parts: GatewayParts,
        http: HttpServer,
        grpc: GrpcServer | None = None,
        wait_for_worker_s: float = 0.0,
        grpc_wait_for_worker_s: float = 0.0,
        drain_timeout_s: float = 30.0,
    ) -> None:
        self.parts = parts
        self.http = http
        self.grpc = grpc
        self.wait_for_worker_s = wait_for_worker_s
        self.grpc_wait_for_worker_s = grpc_wait_for_worker_s
        self.drain_timeout_s = drain_timeout_s
        self.grpc_starting: asyncio.Future | None = None
        self.grpc_stopping: asyncio.Future | None = None
        self.boot_error: str | None = None
        self.stopped_by: int | None = None  # the signal that stopped it

    async def serve(self, sockets: list[socket.socket]) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.handle_exit, sig)
        dispatcher = self.parts.dispatcher
        dispatcher.start(loop)
        try:
            await self.parts.plane.shared_memory.adopt_peer_regions()  # (a restarted gateway: its clients' regions)
            if self.grpc is not None:
                self.parts.plane.grpc_listening = False  # (not ready until gRPC listens too)
            if self.wait_for_worker_s > 0 and not await dispatcher.wait_for_a_worker(self.wait_for_worker_s):
                if dispatcher.draining:
                    return  # SIGTERM meanwhile
                log.warning("no worker announced itself within %.0f s; accepting anyway", self.wait_for_worker_s)
            if self.grpc is not None:
                self.grpc_starting = asyncio.ensure_future(self.start_grpc(self.grpc))
            await self.http.serve(sockets=sockets)
        finally:
            await self.drain()

    async def start_grpc(self, grpc: GrpcServer) -> None:
        dispatcher = self.parts.dispatcher
        if not await dispatcher.wait_for_a_worker(self.grpc_wait_for_worker_s) and dispatcher.draining:
            return
        try:
            await grpc.start()
        except Exception as exc:  # noqa: BLE001 - the port taken since the supervisor looked, or a grpcio or
            # tritonclient it cannot serve with: said and the gateway stops (at the floors a RuntimeError here
            # went unlogged, and the server never became ready)
            self.boot_error = str(exc)
            log.critical("gateway cannot boot: %s", exc)
            self.stop()
            return
        self.parts.plane.grpc_listening = True

    def handle_exit(self, sig: int) -> None:
        """SIGTERM or SIGINT (from the loop, not a signal frame): the drain begins; a second one forces it."""
        if self.stopped_by is not None:
            self.http.force_exit = True
            return
        self.stopped_by = sig
        self.stop()

    def stop(self) -> None:
        """Ready goes false at once; requests already accepted still finish (HTTP and gRPC together)."""
        self.parts.dispatcher.draining = True
        self.http.should_exit = True
        if self.grpc_starting is not None and not self.grpc_starting.done():
            self.grpc_starting.cancel()
        if self.grpc is not None and self.grpc_stopping is None:  # new RPCs refused; running ones get the drain
            self.grpc_stopping = asyncio.ensure_future(self.grpc.stop(self.drain_timeout_s))

    async def drain(self) -> None:
        """After HTTP has served its last request: gRPC's last RPCs, then the dispatcher and the segment."""
        self.stop()
        if self.grpc_stopping is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await self.grpc_stopping
        dispatcher = self.parts.dispatcher
        dispatcher.close()
        self.parts.segment.close()
        tracing.shutdown()  # the drain is over: the last requests' spans go out
