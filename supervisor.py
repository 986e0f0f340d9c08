"""The supervisor: owns the runtime dir, the gateways' rings and the listening socket; starts and
watches the gateways and the workers.

One process, one loop (uvicorn's Multiprocess, gunicorn's arbiter in small): signal
handlers only queue the signal; the loop reaps children, decodes how they died, tells
every gateway at once, restarts them with backoff, and kills workers whose heartbeats stop.

G gateways (--gateways): gateway k gets `--index k` and a ring of its own, made fresh for
each incarnation and unlinked once that incarnation is reaped. They accept on one listening
socket (systemd's, or the one bound here), or each on its own SO_REUSEPORT socket
(--reuse-port). A gateway's death restarts that gateway only: the workers serve the others
on, drop the dead one's batches, and announce themselves to its successor.

Zero-downtime replacement (SIGHUP, --max-batches-per-worker, --worker-memory-limit): see
supervision/workers.py. This module is the loop, the signals, the messages and the stop; the
parts it puts together live in supervision/ (the package's docstring names them).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import socket
import tempfile
import time

import psutil
import zmq

from ringserve.common import supervisor_messages, wire
from ringserve.common.exits import (
    EXIT_BAD_RUNTIME_DIR,
    EXIT_BOOT_ERROR,
    EXIT_MODEL_ERROR,
    EXIT_NO_SHARED_MEMORY,
    EXIT_OK,
)
from ringserve.common.repository.control import ServedRepository
from ringserve.common.settings import SETTINGS_FILE, Settings
from ringserve.shm.cache import create_cache, unlink_cache
from ringserve.shm.errors import SharedMemoryFull
from ringserve.shm.segment import segment_name, sweep_stale_segments
from ringserve.shm.states import unlink_stores
from ringserve.supervision.children import Children, kill, stop_resource_tracker
from ringserve.supervision.events import GatewayEvents, received
from ringserve.supervision.gateways import Gateways
from ringserve.supervision.hang_watch import WORKER_STOP_GRACE_S
from ringserve.supervision.health import GatewayProbe, ServiceNotifier, probe_address, socket_address
from ringserve.supervision.lanes import plan_lanes
from ringserve.supervision.listeners import Listeners
from ringserve.supervision.quarantine import Quarantine
from ringserve.supervision.repository_poll import RepositoryPoll
from ringserve.supervision.ring_fit import RingsDoNotFit
from ringserve.supervision.runtime_settings import ChangeRuntimeSettings, RuntimeSettingsKeeper
from ringserve.supervision.sdnotify import SdNotify, listen_fds, unset_environment, watchdog_timeout_s
from ringserve.supervision.spares import Spares
from ringserve.supervision.startup import (
    RUNTIME_PREFIX,
    RuntimeDirError,
    boot_problem,
    prepare_runtime_dir,
    sweep_stale_runtime_dirs,
    unservable_models,
)
from ringserve.supervision.workers import Workers

log = logging.getLogger(__name__)

SNAPSHOT_INTERVAL_S = 1.0
MEMORY_SAMPLE_INTERVAL_S = 1.0


class Supervisor:
    """The parts (children, listeners, events, quarantine, workers, gateways) and the loop that drives them."""

    def __init__(self, settings: Settings) -> None:
        # Lanes (supervision/lanes.py): each serving worker index serves its lane's models; their count is the
        # workers' from here on, for every part and child (the settings file carries it).
        self.lanes = plan_lanes(settings)
        settings = dataclasses.replace(settings, workers=len(self.lanes))
        self.settings = settings
        self.signals: list[int] = []
        self.children = Children()
        self.listeners = Listeners()
        self.gateway_count = settings.gateway_count()
        self.events = GatewayEvents(self.gateway_count)
        self.quarantine = Quarantine(settings, self.events)
        self.gateways = Gateways(self.gateway_count, settings, self.children, self.listeners)
        self.spares = Spares(settings, self.children)
        self.workers = Workers(
            settings,
            self.children,
            self.events,
            self.quarantine,
            changed=lambda: self.service.worker_changed(),
            spares=self.spares,
            lanes=self.lanes,
        )
        self.stopping = False
        self.exit_code = EXIT_OK
        self.state_store_prefix = ""  # set in setup
        self.response_cache_segment = ""  # Triton's response cache (shm/cache.py): made in setup when asked for
        self.served_repository = settings.model_repository  # what the workers scan (explicit mode: set in setup)
        self.poll: RepositoryPoll | None = None  # poll mode's look at the repository (set in setup)
        self._last_snapshot = 0.0
        self._last_memory_sample = 0.0
        self.service = ServiceNotifier(SdNotify(None), None, None)  # silent until setup reads systemd's variables

    # -- setup and teardown ----------------------------------------------------------
    def setup(self) -> None:
        removed = sweep_stale_segments(psutil.pid_exists)
        removed += sweep_stale_runtime_dirs()
        if removed:
            log.info("removed stale leftovers of an earlier run: %s", ", ".join(removed))
        # The rings first (one per gateway): when /dev/shm cannot hold them, nothing else has been made to undo.
        self.gateways.rings.make_ahead(self.gateway_count)
        if self.settings.runtime_dir:
            runtime_dir = prepare_runtime_dir(self.settings.runtime_dir)
        else:
            runtime_dir = tempfile.mkdtemp(prefix=f"{RUNTIME_PREFIX}{os.getpid()}-")  # 0700, ours
        self.children.runtime_dir = runtime_dir
        # What every child reads (it may hold the API key: 0600, in the 0700 runtime dir).
        self.children.settings_path = os.path.join(runtime_dir, SETTINGS_FILE)
        # The gateway count resolved once, here: every worker connects to exactly the gateways started.
        # Sequences' state stores (shm/states.py): the gateways make them under this prefix, we unlink them.
        self.state_store_prefix = segment_name(str(os.getpid()), "state-")
        if self.settings.response_cache_bytes:  # one store, every gateway's (shm/cache.py)
            self.response_cache_segment = create_cache(str(os.getpid()), self.settings.response_cache_bytes)
        written = dataclasses.replace(
            self.settings,
            runtime_dir=runtime_dir,
            gateways=self.gateway_count,
            state_store_prefix=self.state_store_prefix,
            response_cache_segment=self.response_cache_segment,
        )
        written.write(self.children.settings_path)
        self.served_repository = written.served_repository()
        self._start_model_control()
        for entry in os.listdir(runtime_dir):  # a given dir may hold an earlier run's loading markers
            if entry.startswith("loading-w"):
                os.unlink(os.path.join(runtime_dir, entry))
        self.context = zmq.Context(io_threads=1)
        self.heartbeats = self._bind(zmq.PULL, "heartbeat")
        self.control = self._bind(zmq.PULL, "control")
        self.events.connect(self.context, runtime_dir)
        self.runtime_settings = RuntimeSettingsKeeper(runtime_dir, self.events)  # (Triton's /v2/logging, trace)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_w.setblocking(False)
        signal.set_wakeup_fd(self._wake_w.fileno())
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, self._queue_signal)
        self.poller = zmq.Poller()
        for sock in (self.heartbeats, self.control, self._wake_r):
            self.poller.register(sock, zmq.POLLIN)
        self._setup_systemd()

    def _models_at_start(self) -> list[str] | None:
        """The models served from the start: explicit mode's --load-model ('*': all), else every one (None)."""
        s = self.settings
        return None if s.model_control_mode != "explicit" or "*" in s.load_models else list(s.load_models)

    def _start_model_control(self) -> None:
        """Explicit mode: the served repository holds what --load-model names; poll mode: the first look."""
        if self.settings.model_control_mode == "explicit":
            served = ServedRepository(self.served_repository, self.settings.model_repository)
            for name in served.create(self.settings.load_models):
                log.error(
                    "--load-model %s: failed to load '%s': it is not in %s", name, name, self.settings.model_repository
                )
            log.info("explicit model control: serving %s", ", ".join(served.names()) or "no model yet")
        elif self.settings.model_control_mode == "poll":
            self.poll = RepositoryPoll(
                self.settings.model_repository, self.settings.repository_poll_s, time.monotonic()
            )

    def _setup_systemd(self) -> None:
        """Take what systemd handed us (listening socket, notify socket, watchdog), hide it from children."""
        self.listeners.open(self.settings)
        notify = SdNotify.from_environment()
        watchdog_s = watchdog_timeout_s()
        unset_environment()
        listen_fd = self.listeners.listen_fd
        address = (
            socket_address(listen_fd)
            if listen_fd is not None
            else probe_address(self.settings.host, self.settings.port)
        )
        probe = GatewayProbe(address, api_key=self.settings.api_key) if notify.enabled else None
        self.service = ServiceNotifier(notify, watchdog_s, probe)
        self.service.start()

    def _bind(self, kind: int, name: str) -> zmq.Socket:
        sock = self.context.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(wire.endpoint(self.children.runtime_dir, name))
        return sock

    def _drop_unused(self) -> None:
        """What setup made, when it failed: the rings no gateway took, the response cache."""
        self.gateways.rings.drop_unused()
        unlink_cache(self.response_cache_segment)

    def cleanup(self) -> None:
        self.children.kill_all()
        self.service.close()
        signal.set_wakeup_fd(-1)
        self.context.destroy(linger=0)
        self.listeners.close()
        for child in self.children.all:
            self.gateways.rings.drop(child)
        self.gateways.rings.drop_unused()
        unlink_stores(self.state_store_prefix)
        unlink_cache(self.response_cache_segment)
        if not self.settings.runtime_dir:
            shutil.rmtree(self.children.runtime_dir, ignore_errors=True)
        else:  # a given dir outlives us; the API key must not
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.children.settings_path)
        log.info("stopped; removed the rings and the runtime dir")

    def _queue_signal(self, signum: int, frame: object) -> None:
        self.signals.append(signum)  # handled by the loop; never work in a handler

    # -- the loop ----------------------------------------------------------------------
    def run(self) -> int:
        if self.settings.exit_on_error and (
            unservable := unservable_models(self.settings.model_repository, self._models_at_start())
        ):
            log.critical(
                "--exit-on-error: not serving, %d model(s) cannot be served: %s", len(unservable), "; ".join(unservable)
            )
            return EXIT_MODEL_ERROR
        try:
            return self._run()
        finally:
            stop_resource_tracker()

    def _run(self) -> int:
        if found := boot_problem(self.settings, socket_activated=bool(listen_fds())):
            log.critical("%s", found[1])
            return found[0]
        try:
            self.setup()
        except RuntimeDirError as exc:
            log.critical("%s", exc)
            self._drop_unused()
            return EXIT_BAD_RUNTIME_DIR
        except RingsDoNotFit as exc:
            log.critical("%s", exc)
            return EXIT_NO_SHARED_MEMORY
        except SharedMemoryFull as exc:  # (the free space, taken by someone else since it was measured)
            self._drop_unused()
            log.critical(
                "%s. Ask for less with --slot-count (now %d) or --slot-mb (now %d), or fewer --gateways "
                "(now %d, a ring each), or give %s more room (docker run --shm-size, or the tmpfs mount's "
                "size=)",
                exc,
                self.settings.slot_count,
                self.settings.slot_mb,
                self.gateway_count,
                exc.directory,
            )
            return EXIT_NO_SHARED_MEMORY
        except OSError as exc:  # a listening socket, taken since port_problem looked
            log.critical(
                "cannot listen on %s:%d (or --metrics-port %d): %s",
                self.settings.host,
                self.settings.port,
                self.settings.metrics_port,
                exc.strerror or exc,
            )
            self._drop_unused()
            return EXIT_BOOT_ERROR
        try:
            for index in range(self.gateway_count):
                self.gateways.spawn(index)
            for index in range(len(self.workers.records)):
                self.workers.spawn(index)
            while not self._stopped():
                self.tick()
        finally:
            self.cleanup()
        return self.exit_code

    def tick(self) -> None:
        ready = dict(self.poller.poll(100))
        if self._wake_r in ready:
            self._wake_r.recv(4096)
        while self.signals:
            self.handle_signal(self.signals.pop(0))
        if self.heartbeats in ready:
            self._read_heartbeats()
        if self.control in ready:
            self._read_control()
        self.reap_children()
        self.workers.murder_hung()
        self.spares.murder_hung()
        if not self.stopping:
            self.workers.restart_due()
            self.spares.start_due(self.workers.starting_devices())  # after the restarts: they take spares first
            if (code := self.gateways.restart_due()) is not None:
                self._stop_now(code)
        now = time.monotonic()
        if now - self._last_memory_sample >= MEMORY_SAMPLE_INTERVAL_S:
            self._last_memory_sample = now
            self.workers.sample_memory()
            self.spares.sample_memory()
        if not self.stopping:
            self.workers.recycle_due()
            if self.poll is not None and self.poll.changed(now):
                self.handle_hup("poll")
        if now - self._last_snapshot >= SNAPSHOT_INTERVAL_S:
            self._last_snapshot = now
            self._send_snapshot()
        # After the reaping above: a worker that died in this iteration is not counted ready.
        self.service.tick(
            now,
            reload_pending=self.workers.reload_pending(),
            workers_total=len(self.workers.records),
            restarts=self.workers.restarts_by_reason(),
            worker_pids={c.process.pid for c in self.workers.all()},
        )

    def reap_children(self) -> None:
        for child, returncode in self.children.reaped():
            if child.role == "gateway":
                self.gateways.rings.drop(child)
                self.workers.gateway_gone(child.index, child.generation)
                if (code := self.gateways.exited(child, returncode, stopping=self.stopping)) is not None:
                    self._stop_now(code)
            elif child.role == "spare":
                self.spares.exited(child, returncode, stopping=self.stopping)
            else:
                self.workers.exited(child, returncode, stopping=self.stopping)
                self.service.worker_changed()

    # -- signals and the stop ----------------------------------------------------------
    def handle_signal(self, signum: int) -> None:
        if signum in (signal.SIGTERM, signal.SIGINT):
            self.handle_term(signum)
        elif signum == signal.SIGHUP:
            self.handle_hup()

    def handle_term(self, signum: int) -> None:
        if self.stopping:
            log.warning("second %s: stopping without waiting for the drain", signal.Signals(signum).name)
            self.children.kill_all()
            return
        log.info(
            "%s: draining the gateway%s, then stopping the workers",
            signal.Signals(signum).name,
            "s" if self.gateway_count > 1 else "",
        )
        self.service.stopping()
        for child in self.children.role("gateway"):
            child.process.send_signal(signal.SIGTERM)
        self._begin_stop(time.monotonic() + self.settings.drain_timeout_s + WORKER_STOP_GRACE_S)

    def handle_hup(self, why: str = "SIGHUP") -> None:
        """Reload: every serving worker is replaced by a new generation that reads the repository again."""
        if self.stopping:
            return
        log.info("%s: reloading the model repository %s with a new worker generation", why, self.served_repository)
        self.service.reloading()
        self.events.send(supervisor_messages.Reload(model_repository=self.served_repository))
        self.workers.replace_serving()

    def _stop_now(self, exit_code: int) -> None:
        """A part cannot go on (a gateway's boot error or crash loop, no room for a ring): stop with `exit_code`."""
        self.exit_code = exit_code
        self._begin_stop(time.monotonic())

    def _begin_stop(self, deadline: float) -> None:
        """Stop: no restart from now on; the gateways drain until `deadline`, then the workers go."""
        self.stopping = True
        self._stop_deadline = deadline
        self.listeners.close()
        self.spares.stop_all()  # nothing is restarted from now on

    def _stopped(self) -> bool:
        """During a stop: the gateways drain first (workers serve their last batches), then workers go."""
        if not self.stopping:
            return False
        if gateways := self.children.role("gateway"):
            if time.monotonic() > self._stop_deadline:
                for child in gateways:
                    kill(child.process)
            return False
        self.workers.stop_all()
        return not self.children.all

    # -- messages ----------------------------------------------------------------------
    def _read_heartbeats(self) -> None:
        for message in received(self.heartbeats):
            match message:
                case supervisor_messages.Heartbeat():
                    self.workers.heard(message)
                case supervisor_messages.SpareHeartbeat():
                    self.spares.heard(message)
                case _:
                    log.warning("ignoring unexpected %s message on the heartbeat socket", message.KIND)

    def _read_control(self) -> None:
        for message in received(self.control):
            match message:
                case supervisor_messages.Unquarantine():
                    if not self.stopping and self.quarantine.lift(message.model):
                        self.workers.replace_serving()
                case supervisor_messages.ReloadWorkers():
                    log.info("a repository load of model %s: replacing the workers so that they read it", message.model)
                    if not self.stopping:
                        self.workers.replace_serving()
                case supervisor_messages.ReloadRepository():
                    self.handle_hup(
                        f"a repository load or unload of model {message.model} (gateway {message.gateway_index})"
                    )
                case supervisor_messages.KillWorker():
                    if (child := self.workers.find(message.worker_index, message.generation)) is not None:
                        self.workers.kill_for(child, message.reason)
                case supervisor_messages.WorkerRetired():
                    if (child := self.workers.find(message.worker_index, message.generation)) is not None:
                        self.workers.retired_by(child, message.gateway_index)
                case supervisor_messages.QuarantineModel() if message.poison_request:
                    self.quarantine.count_poison_request(
                        message.model, message.reason, message.request_id, stopping=self.stopping
                    )
                case supervisor_messages.QuarantineModel():
                    self.quarantine.quarantine_poisoned(message.model, message.reason, stopping=self.stopping)
                case supervisor_messages.RepositoryChanged():
                    self.events.send(message, skip=message.gateway_index)
                case ChangeRuntimeSettings():
                    self.runtime_settings.change(message)
                case _:
                    log.warning("ignoring unexpected %s message on the control socket", message.KIND)

    def _send_snapshot(self) -> None:
        self.events.send(
            supervisor_messages.Snapshot(
                supervisor_pid=os.getpid(),
                workers=self.workers.infos(),
                quarantined=self.quarantine.everything(),
                gateways=self.gateways.infos(),
                spares=self.spares.infos(),
            )
        )
