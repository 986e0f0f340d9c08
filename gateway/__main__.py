"""`python -m gateway`: one gateway process (index k of --gateways), spawned by the supervisor: argv, settings and
sockets here; gateway/process.py puts the process together and runs it."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import signal
import socket
import sys
from pathlib import Path

import uvloop

from ringserve.common import runtime_settings, tracing, wire
from ringserve.common.errors import ConfigError
from ringserve.common.exits import EXIT_BOOT_ERROR, EXIT_OK
from ringserve.common.listen import listen_socket
from ringserve.common.process import configure_logging, die_with_parent
from ringserve.common.repository.scan import scan_repository
from ringserve.common.settings import Settings
from ringserve.gateway.core.region_errors import MAX_REGIONS
from ringserve.gateway.descriptors import DescriptorBudget, fit_open_files
from ringserve.gateway.http.app import GatewayApp
from ringserve.gateway.http.engine import bind_socket, choose_engine, http_server
from ringserve.gateway.http.limits import ConnectionLimits
from ringserve.gateway.process import (
    RESTART_WAIT_FOR_WORKER_S,
    START_WAIT_FOR_WORKER_S,
    GatewayProcess,
    GatewaySettings,
    build_parts,
    grpc_front_end,
    wait_for_worker_s,
)

log = logging.getLogger("ringserve.gateway")

SWITCH_INTERVAL_S = 0.001  # sys.setswitchinterval: see main()


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
    runtime_settings.begin(settings, role="gateway", index=args.index, generation=args.generation)
    budget = descriptor_budget(settings)
    try:
        scan = scan_repository(Path(settings.served_repository()))  # a broken model is reported, not fatal
        gateway_settings = GatewaySettings.from_settings(
            settings, args.segment, args.index, args.parent_pid, budget.shm_regions
        )
        parts = build_parts(scan.defaults(), gateway_settings)
        parts.dispatcher.catalog.add_repository(scan)  # the other versions, and the models that failed
    except Exception as exc:  # noqa: BLE001 - whatever stops the boot is logged; the exit code tells the supervisor
        log.critical("gateway cannot boot: %s", exc)
        return EXIT_BOOT_ERROR
    engine = choose_engine(settings.http_engine, connection_limits(settings, budget))
    app = GatewayApp(
        parts.plane,
        parts.peers,
        parts.api_key,
        max_request_bytes=settings.max_request_bytes,
        body_timeout_s=settings.body_timeout_s,
        api_key_everywhere=settings.api_key_everywhere,
        metrics_port=settings.metrics_port,
        write_response=engine.write_response,
        dispatcher=parts.dispatcher,
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
        listener = bind_socket(settings.host, settings.port)  # a gateway started by hand, or by an older supervisor
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
    gateway = GatewayProcess(
        parts,
        http_server(app, engine, settings.drain_timeout_s),
        grpc_front_end(settings, parts, budget.grpc_connections),
        wait_for_worker_s(args.index, args.generation),
        RESTART_WAIT_FOR_WORKER_S if args.generation > 0 else START_WAIT_FOR_WORKER_S,
        drain_timeout_s=settings.drain_timeout_s,
    )
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(gateway.serve(sockets))
    finally:
        unlink_unix_socket(peer_path, peer_inode)
    if gateway.boot_error:
        return EXIT_BOOT_ERROR
    if gateway.stopped_by is not None:  # a stop by signal ends as one, as uvicorn's own run() ends it
        signal.signal(gateway.stopped_by, signal.SIG_DFL)
        signal.raise_signal(gateway.stopped_by)
    return EXIT_OK


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
