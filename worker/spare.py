"""A warm spare: a worker process set up but for its models, waiting to take a dead worker's place.

The supervisor (supervision/spares.py) starts one per worker device as `python -P -m
ringserve.worker --spare-device D`, with a pipe on its stdin. It pays ahead what a fresh worker
pays before it can load a model: the interpreter start and the imports (numpy, onnxruntime, onnx,
pyzmq, ringserve.worker: 0.3 s on an idle 2-core machine, seconds under load), reading the
settings, and the runtime's one-time set-up on its device (a throwaway session; on CUDA the
device context). Then it waits for one TakeOver line, and from it on runs worker/__main__.py's
path as the worker it names: it reads the repository, connects to the gateways, loads that
worker's eager models and says READY like any worker. Before that it has read no model's config,
imported nothing of a model's (a Python model's code is imported at its load) and connected to
no gateway, so it can serve nothing it has not loaded, and never a config older than its takeover.

Why a spawned spare and not a fork server: a process that has imported the worker's modules
already runs threads (OpenBLAS's, from numpy; one of ONNX Runtime's), and the runtime set-up
(CUDA's above all) cannot be done before a fork at all; forking such a process is what the
design forbids. A spare is an ordinary child: PDEATHSIG, its own session, the unit's cgroup.

Its heartbeat thread sends SpareHeartbeat while it waits (a hung spare is killed and replaced, and
one silent at a takeover is passed over: supervision/spares.py). It stops at the TakeOver: from
there to the worker's own first heartbeat (the repository scan, a Python model's
auto_complete_config) the new worker is judged by --worker-start-timeout-s like a fresh one. A
beat that spoke for it through that scan kept a scan hung on a FIFO or a sleeping
auto_complete_config alive forever. EOF on stdin (the supervisor is gone, or closed the pipe to stop it),
SIGTERM, or a line that is no TakeOver ends it with exit 0.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable

import zmq

from ringserve.common import messages, runtime_settings, supervisor_messages, wire
from ringserve.common.exits import EXIT_OK
from ringserve.common.process import configure_logging, rename_process
from ringserve.common.settings import Settings

from .session import SessionSettings, choose_providers, prime_runtime
from .threads import HEARTBEAT_INTERVAL_S

log = logging.getLogger(__name__)

PROCESS_NAME = "ringserve-spare"  # /proc/<pid>/comm until it takes over (top, ps -o comm, the benches)

SessionSettingsOf = Callable[[Settings, int], SessionSettings]  # (server settings, worker index) -> its options

# What tracing imports when it starts (common/tracing.py: Tracing): a spare of a traced server
# imports it ahead too, so that a takeover does not pay for it.
TRACING_MODULES = (
    "opentelemetry.sdk.trace",
    "opentelemetry.sdk.trace.export",
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
)


class SpareBeat(threading.Thread):
    """The spare's SpareHeartbeat, until it takes over or goes."""

    def __init__(self, endpoint: str, device: int) -> None:
        super().__init__(name="spare-heartbeat", daemon=True)
        self._context = zmq.Context(io_threads=1)
        self._socket = self._context.socket(zmq.PUSH)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.SNDHWM, 4)
        self._socket.connect(endpoint)
        self.device, self.pid = device, os.getpid()
        self.primed = False
        self._wake = threading.Event()
        self._stopped = False

    def run(self) -> None:
        try:
            while not self._stopped:
                beat = supervisor_messages.SpareHeartbeat(device=self.device, pid=self.pid, primed=self.primed)
                try:
                    self._socket.send_multipart(beat.encode(), zmq.NOBLOCK)
                except zmq.Again:
                    pass  # supervisor busy or gone; it judges by what it receives
                self._wake.wait(HEARTBEAT_INTERVAL_S)
                self._wake.clear()
        finally:
            self._socket.close()
            self._context.term()

    def beat_now(self) -> None:
        """Say at once that it is primed."""
        self.primed = True
        self._wake.set()

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()


def prepare(server: Settings, settings: SessionSettings) -> None:
    """Everything a worker of this device does before it reads the repository, but keeping nothing."""
    try:
        prime_runtime(settings, choose_providers(settings, announce=False))
    except Exception as exc:  # noqa: BLE001 - the takeover's own prime and loads will say what is wrong
        log.warning("spare: could not set up the runtime ahead (a takeover pays for it): %s", exc)
    if server.otel_endpoint:
        for name in TRACING_MODULES:
            try:
                importlib.import_module(name)
            except ImportError:
                break  # the worker logs why tracing is off


def wait_for_takeover(
    server: Settings, device: int, session_settings: SessionSettingsOf
) -> supervisor_messages.TakeOver | None:
    """Get ready, then wait for the TakeOver; None when told to go instead (EOF, SIGTERM, a bad line).

    `session_settings` is the worker's own (SessionSettings.from_settings), so that the runtime is set up with
    the options its workers run with. The spare's heartbeats end here either way: the worker's own
    start says it is alive, under the supervisor's start timeout.
    """
    own_name = rename_process(PROCESS_NAME)
    signal.signal(signal.SIGTERM, _exit_now)  # (worker/__main__.py installs its own once this returns)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the supervisor; it decides
    configure_logging("spare", server.log_level, server.log_format, index=device)
    runtime_settings.begin(server, role="spare", index=device)
    beat = SpareBeat(wire.endpoint(server.runtime_dir, "heartbeat"), device)
    beat.start()
    try:
        settings = dataclasses.replace(session_settings(server, 0), cuda_device_id=device)
        prepare(server, settings)
        beat.beat_now()
        line = sys.stdin.buffer.readline()  # blocks until the supervisor needs it
        if not line:
            return None  # EOF: the supervisor is gone, or stops this spare
        try:
            order = messages.decode_line(line)
        except messages.WireError as exc:
            log.error("spare: not a takeover (%s); exiting", exc)
            return None
        if not isinstance(order, supervisor_messages.TakeOver):
            log.error("spare: expected TAKE_OVER, got %s; exiting", order.KIND)
            return None
        rename_process(own_name)
        return order
    finally:
        beat.stop()
        beat.join(timeout=1)


def _exit_now(signum: int, frame: object) -> None:
    raise SystemExit(EXIT_OK)  # a spare holds nothing to finish
