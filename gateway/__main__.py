"""`python -m gateway`: one HTTP gateway process (index k of --gateways), spawned by the supervisor."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import gc
import logging
import os
import signal
import socket
import sys
from pathlib import Path

import uvicorn

from ringserve.common import tracing, wire
from ringserve.common.errors import ConfigError
from ringserve.common.exits import EXIT_BOOT_ERROR, EXIT_OK
from ringserve.common.listen import listen_socket
from ringserve.common.process import configure_logging, die_with_parent
from ringserve.common.repository.scan import scan_repository
from ringserve.common.settings import Settings
from ringserve.gateway.core.descriptors import DescriptorBudget, fit_open_files
from ringserve.gateway.core.region_errors import MAX_REGIONS
from ringserve.gateway.grpc.listener import GrpcServer, grpc_listener
from ringserve.gateway.http.app import GatewayApp, GatewaySettings
from ringserve.gateway.http.protocol import UVICORN_OPTIONS, ConnectionLimits, GatewayHttpProtocol

log = logging.getLogger("ringserve.gateway")

# A gateway accepts connections only once a worker has announced itself to it (or after this
# long), but for gateway 0 at the server's start (it answers the health probe while the workers
# load: live, not ready). On the shared socket the gateway that is ready, or the kernel's
# backlog, keeps the clients meanwhile, where this one would answer them 503: at the start
# (gateway 0 ready, gateway 1 not yet told of the worker) and while the workers reconnect to a
# restarted gateway.
RESTART_WAIT_FOR_WORKER_S = 5.0
START_WAIT_FOR_WORKER_S = 300.0  # the workers load their models first (systemd's TimeoutStartSec)
SWITCH_INTERVAL_S = 0.001  # sys.setswitchinterval: see main()


def wait_for_worker_s(index: int, generation: int) -> float:
    if generation > 0:
        return RESTART_WAIT_FOR_WORKER_S
    return START_WAIT_FOR_WORKER_S if index > 0 else 0.0


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The settings file, and what only the supervisor's current run knows (see supervision/gateways.py: spawn)."""
    p = argparse.ArgumentParser(prog="python -m ringserve.gateway")
    p.add_argument("--settings", required=True, help="the settings file the supervisor wrote")
    p.add_argument("--segment", required=True, help="this gateway's ring (shared-memory segment)")
    p.add_argument("--index", type=int, default=0, help="which gateway this is (0..G-1)")
    p.add_argument("--generation", type=int, default=0, help="its incarnation: > 0 after a restart")
    p.add_argument(
        "--fd", type=int, default=None, help="listen on this inherited socket fd (every gateway gets the same one)"
    )
    p.add_argument(
        "--metrics-fd",
        type=int,
        default=None,
        help="serve /metrics only on this inherited socket fd (--metrics-port; shared like --fd)",
    )
    p.add_argument("--parent-pid", type=int, default=0)
    return p.parse_args(argv)


def descriptor_budget(settings: Settings) -> DescriptorBudget:
    """HTTP's and gRPC's connections and the regions, fitted into the open-files limit (raised here)."""
    return fit_open_files(
        DescriptorBudget(
            http_connections=settings.max_connections,
            grpc_connections=settings.grpc_max_connections if settings.grpc_port else 0,
            shm_regions=MAX_REGIONS if settings.allow_client_shm else 0,
        )
    )


def connection_limits(settings: Settings, budget: DescriptorBudget) -> ConnectionLimits:
    """The limits of each HTTP connection, with as many connections as the descriptor budget holds."""
    return ConnectionLimits(
        max_header_bytes=settings.max_header_bytes,
        header_timeout_s=settings.header_timeout_s,
        max_connections=budget.http_connections,
    )


def grpc_server(settings: Settings, app: GatewayApp, budget: DescriptorBudget) -> GrpcServer | None:
    """The gRPC listener of --grpc-port (None: 0, off), over the same endpoints as HTTP."""
    return grpc_listener(settings, app.plane, app.api_key, budget.grpc_connections)


class GatewayServer(uvicorn.Server):
    """uvicorn's server, telling the dispatcher the moment shutdown begins; it starts accepting
    once a worker serves it (see wait_for_worker_s). gRPC (when on) runs on the same loop; it listens
    once a worker serves this gateway, gateway 0 at the start included (no probe needs it earlier,
    and the kernel deals SO_REUSEPORT connections only among the gateways that listen), and stops
    first: its RPCs finish before the dispatcher closes."""

    def __init__(
        self,
        config: uvicorn.Config,
        app: GatewayApp,
        wait_for_worker_s: float = 0.0,
        grpc: GrpcServer | None = None,
        grpc_wait_for_worker_s: float = 0.0,
    ) -> None:
        super().__init__(config)
        self.gateway_app = app
        self.wait_for_worker_s = wait_for_worker_s
        self.grpc = grpc
        self.grpc_wait_for_worker_s = grpc_wait_for_worker_s
        self.grpc_starting: asyncio.Task | None = None
        self.boot_error: str | None = None

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        if self.wait_for_worker_s > 0:  # between the lifespan's start (the link binds) and listening
            lifespan_startup = self.lifespan.startup

            async def startup_then_wait() -> None:
                await lifespan_startup()
                dispatcher = self.gateway_app.dispatcher
                if (
                    not self.lifespan.should_exit
                    and not await dispatcher.wait_for_a_worker(self.wait_for_worker_s)
                    and not dispatcher.draining
                ):  # (SIGTERM meanwhile: uvicorn shuts down once this returns)
                    log.warning("no worker announced itself within %.0f s; accepting anyway", self.wait_for_worker_s)

            self.lifespan.startup = startup_then_wait
        if self.grpc is not None:
            self.gateway_app.plane.grpc_listening = False  # (not ready until gRPC listens too)
        await super().startup(sockets)
        if self.grpc is not None and self.started:
            self.grpc_starting = asyncio.ensure_future(self.start_grpc())

    async def start_grpc(self) -> None:
        dispatcher = self.gateway_app.dispatcher
        if not await dispatcher.wait_for_a_worker(self.grpc_wait_for_worker_s) and dispatcher.draining:
            return
        try:
            await self.grpc.start()
        except OSError as exc:  # the port was taken since the supervisor looked
            self.boot_error = str(exc)
            log.critical("gateway cannot boot: %s", exc)
            self.should_exit = True
            return
        self.gateway_app.plane.grpc_listening = True

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self.grpc_starting is not None and not self.grpc_starting.done():
            self.grpc_starting.cancel()
        if self.grpc is not None:  # new RPCs are refused at once; running ones get the drain timeout
            stopping = asyncio.ensure_future(self.grpc.stop(self.config.timeout_graceful_shutdown))
            lifespan_shutdown = self.lifespan.shutdown

            async def grpc_then_lifespan() -> None:
                await stopping
                await lifespan_shutdown()

            self.lifespan.shutdown = grpc_then_lifespan
        await super().shutdown(sockets)

    def handle_exit(self, sig: int, frame: object) -> None:
        # Ready goes false at once; requests already accepted still finish.
        self.gateway_app.dispatcher.draining = True
        super().handle_exit(sig, frame)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    die_with_parent(args.parent_pid, signal.SIGTERM)
    try:
        settings = Settings.read(args.settings)
    except ConfigError as exc:
        configure_logging("gateway", index=args.index, generation=args.generation)
        log.critical("gateway cannot boot: %s", exc)
        return EXIT_BOOT_ERROR
    configure_logging("gateway", settings.log_level, settings.log_format, index=args.index, generation=args.generation)
    tracing.setup(settings.otel_endpoint, "gateway", args.index, args.generation)  # before the parts read it
    budget = descriptor_budget(settings)
    try:
        scan = scan_repository(Path(settings.served_repository()))  # a broken model is reported, not fatal
        app = GatewayApp(
            scan.defaults(),
            GatewaySettings.from_settings(settings, args.segment, args.index, args.parent_pid, budget.shm_regions),
        )
        app.dispatcher.catalog.add_repository(scan)  # the other versions, and the models that failed
    except Exception as exc:  # noqa: BLE001 - whatever stops the boot is logged; the exit code tells the supervisor
        log.critical("gateway cannot boot: %s", exc)
        return EXIT_BOOT_ERROR
    options = {
        **UVICORN_OPTIONS,
        "http": functools.partial(GatewayHttpProtocol, limits=connection_limits(settings, budget)),
    }
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        **options,
        timeout_graceful_shutdown=int(settings.drain_timeout_s),
        log_config=None,
    )
    # The inherited listener (socket activation) as a socket object, not uvicorn's fd=: with fd=
    # uvicorn serves on a dup and never closes the fd itself, so the socket kept listening through
    # the drain and connections queued on it, unanswered, until this process exited.
    if args.fd is not None:
        listener = socket.socket(fileno=args.fd)
    elif settings.reuse_port:  # a socket of our own; the kernel deals connections among the gateways' sockets
        try:
            listener = listen_socket(settings.host, settings.port, reuse_port=True, listen=False)
        except OSError as exc:
            log.critical(
                "gateway cannot boot: cannot listen on %s:%d: %s", settings.host, settings.port, exc.strerror or exc
            )
            return EXIT_BOOT_ERROR
    else:
        listener = config.bind_socket()  # a gateway started by hand, or by an older supervisor
    # The same app on a Unix socket too, for the other gateways (gateway/cluster/peers.py): uvicorn serves
    # every socket it is given. Bound here, so the TCP one is bound here as well (bind_socket: what
    # uvicorn would do with host and port).
    try:
        metrics = metrics_listener(settings, args.metrics_fd)
    except OSError as exc:
        log.critical(
            "gateway cannot boot: cannot listen on %s:%d (--metrics-port): %s",
            settings.host,
            settings.metrics_port,
            exc.strerror or exc,
        )
        return EXIT_BOOT_ERROR
    peer_path = wire.gateway_http_path(settings.runtime_dir, args.index)
    peer_socket, peer_inode = bind_unix_socket(peer_path)
    # One uvicorn server for every socket: the app tells the metrics port's requests apart
    # (GatewayApp: only /metrics there).
    sockets = [listener, peer_socket] + ([metrics] if metrics is not None else [])
    # The infer path allocates and frees many small containers per request; with CPython's
    # default gen-0 threshold (700) the collector ran dozens of times a second under load and took
    # 3 % of the gateway's CPU, scanning the boot-time objects (imports, configs) each time.
    # Those are frozen out of collection, and gen 0 waits for 10,000 net allocations.
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)
    # The parse thread (routes.Endpoints.parse_aside) shares the GIL with this loop, which takes it back
    # within the switch interval each time it needs it, several times a request: with 1 ms for CPython's
    # 5 ms the slowest health check while 2.5 M strings were parsed went from 0.12-0.22 s to 0.05-0.16 s.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    server = GatewayServer(
        config,
        app,
        wait_for_worker_s(args.index, args.generation),
        grpc_server(settings, app, budget),
        RESTART_WAIT_FOR_WORKER_S if args.generation > 0 else START_WAIT_FOR_WORKER_S,
    )
    try:
        server.run(sockets=sockets)
    finally:
        unlink_unix_socket(peer_path, peer_inode)
        tracing.shutdown()  # (a stop by signal flushed in the app's lifespan: uvicorn re-raises the signal)
    return EXIT_BOOT_ERROR if server.boot_error else EXIT_OK


def metrics_listener(settings: Settings, fd: int | None) -> socket.socket | None:
    """--metrics-port's socket: the supervisor's (inherited, shared by every gateway), else with
    --reuse-port one of our own, else (a gateway started by hand) bound here; None when it is off."""
    if not settings.metrics_port:
        return None
    if fd is not None:
        return socket.socket(fileno=fd)
    return listen_socket(
        settings.host, settings.metrics_port, reuse_port=settings.reuse_port, listen=not settings.reuse_port
    )


def bind_unix_socket(path: str) -> tuple[socket.socket, int]:
    """An AF_UNIX socket bound at `path` (uvicorn listens on it), mode 0600 from the start (umask:
    no moment in which another user could connect), and the file's inode. A stale file of a dead
    predecessor is replaced."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    mask = os.umask(0o177)
    try:
        sock.bind(path)
    finally:
        os.umask(mask)
    return sock, os.stat(path).st_ino


def unlink_unix_socket(path: str, inode: int) -> None:
    """Remove our socket file, unless the file there is no longer ours (a successor bound its own)."""
    with contextlib.suppress(OSError):
        if os.stat(path).st_ino == inode:
            os.unlink(path)


if __name__ == "__main__":
    sys.exit(main())
