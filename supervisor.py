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

Zero-downtime replacement (SIGHUP, --max-batches-per-worker, --worker-memory-limit):
the successor (same index, next generation) starts while the old worker serves; on the
successor's READY each gateway sends it every new batch, lets the old one finish the
batches it holds, then tells us WORKER_RETIRED; once every gateway that was up when the
replacement began has said so (or died since), the old one gets SIGTERM.
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator

import psutil
import zmq

from ringserve.common import messages, wire
from ringserve.common.exits import (EXIT_BAD_RUNTIME_DIR, EXIT_BOOT_ERROR, EXIT_GATEWAY_CRASH_LOOP,
                                    EXIT_MODEL_ERROR, EXIT_NO_SHARED_MEMORY, EXIT_OK, KILL_REASONS, REASON_HUNG, REASON_MEMORY, REASON_OOM, REASON_RECYCLED, REASON_RELOAD,
                                    REASON_RETIRED, REASON_STOPPING, KillReason, ReplaceReason, StopReason)
from ringserve.common.health import GatewayProbe, ServiceNotifier, probe_address, socket_address
from ringserve.common.listen import listen_socket
from ringserve.common.sdnotify import SdNotify, listen_fds, unset_environment, watchdog_timeout_s
from ringserve.common.settings import SETTINGS_FILE, Settings
from ringserve.shm.errors import SharedMemoryFull
from ringserve.shm.segment import Segment, sweep_stale_segments
from ringserve.supervision.children import (STABLE_AFTER_S, Child, RestartRecord, backoff_s, child_python, exit_reason,
                                            kill, oom_kill_count, stop_resource_tracker)
from ringserve.supervision.startup import (RUNTIME_PREFIX, RuntimeDirError, grpc_port_problem, metrics_port_problem,
                                           port_problem, prepare_runtime_dir, sweep_stale_runtime_dirs,
                                           unservable_models)

log = logging.getLogger(__name__)

GATEWAY_GIVE_UP_CRASHES = 5  # one gateway index dying this often in a row, each before STABLE_AFTER_S: stop the server
QUARANTINE_CRASHES = 3  # a model that kills the worker this often while loading...
QUARANTINE_WINDOW_S = 60.0  # ...within this window is quarantined
WORKER_STOP_GRACE_S = 5.0
SNAPSHOT_INTERVAL_S = 1.0
MEMORY_SAMPLE_INTERVAL_S = 1.0
RECYCLE_MIN_UPTIME_S = 5.0  # never recycle a younger worker: a limit below its baseline would loop
RECYCLE_RETRY_S = 30.0  # after a successor failed, automatic recycling of that index waits this long


class Supervisor:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.signals: list[int] = []
        self.children: list[Child] = []
        self.records = [RestartRecord() for _ in range(settings.workers + settings.standby_workers)]
        self.gateway_count = settings.gateway_count()
        self.gateway_records = [RestartRecord() for _ in range(self.gateway_count)]
        self.rings: dict[int, Segment] = {}  # gateway index -> the ring made for its next incarnation
        self.listen_fd: int | None = None
        self._listener: socket.socket | None = None  # the listening socket we bound ourselves
        # --metrics-port's socket, shared by the gateways as the main one is (None: off, or --reuse-port)
        self._metrics_listener: socket.socket | None = None
        self.events: list[zmq.Socket] = []  # one PUSH per gateway index
        self.stopping = False
        self.exit_code = EXIT_OK
        self.quarantined: dict[str, str] = {}  # model -> why (crashed workers while loading: they skip it)
        self.poisoned: dict[str, str] = {}  # model -> why (a gateway isolated poison requests: 503 in every gateway)
        self._load_crashes: dict[str, list[float]] = {}
        self._poison_times: dict[str, list[float]] = {}  # model -> when gateways isolated its poison requests
        self._oom_kills = oom_kill_count()
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
        for index in range(self.gateway_count):
            self.rings[index] = self._new_ring()
        if self.settings.runtime_dir:
            self.runtime_dir = prepare_runtime_dir(self.settings.runtime_dir)
        else:
            self.runtime_dir = tempfile.mkdtemp(prefix=f"{RUNTIME_PREFIX}{os.getpid()}-")  # 0700, ours
        # What every child reads (it may hold the API key: 0600, in the 0700 runtime dir).
        self.settings_path = os.path.join(self.runtime_dir, SETTINGS_FILE)
        # The gateway count resolved once, here: every worker connects to exactly the gateways started.
        dataclasses.replace(self.settings, runtime_dir=self.runtime_dir, gateways=self.gateway_count
                            ).write(self.settings_path)
        for entry in os.listdir(self.runtime_dir):  # a given dir may hold an earlier run's loading markers
            if entry.startswith("loading-w"):
                os.unlink(os.path.join(self.runtime_dir, entry))
        self.context = zmq.Context(io_threads=1)
        self.heartbeats = self._bind(zmq.PULL, "heartbeat")
        self.control = self._bind(zmq.PULL, "control")
        for index in range(self.gateway_count):
            events = self.context.socket(zmq.PUSH)
            events.setsockopt(zmq.LINGER, 0)
            events.connect(wire.gateway_endpoint(self.runtime_dir, "events", index))
            self.events.append(events)
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_w.setblocking(False)
        signal.set_wakeup_fd(self._wake_w.fileno())
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, self._queue_signal)
        self.poller = zmq.Poller()
        for sock in (self.heartbeats, self.control, self._wake_r):
            self.poller.register(sock, zmq.POLLIN)
        self._setup_systemd()

    def _setup_systemd(self) -> None:
        """Take what systemd handed us (listening socket, notify socket, watchdog), hide it from children."""
        fds = listen_fds()
        if len(fds) > 1:
            log.warning("systemd passed %d sockets; serving on the first (fd %d) only", len(fds), fds[0])
        self.listen_fd = fds[0] if fds else None
        if self.listen_fd is None and not self.settings.reuse_port:
            # One socket for every gateway, bound here: connections queue in the kernel while one restarts.
            self._listener = listen_socket(self.settings.host, self.settings.port)
            self.listen_fd = self._listener.fileno()
        elif self.listen_fd is not None and self.settings.reuse_port:
            log.warning("--reuse-port is ignored under socket activation: every gateway accepts on systemd's socket")
        if self.settings.metrics_port and not self.settings.reuse_port:
            self._metrics_listener = listen_socket(self.settings.host, self.settings.metrics_port)
        notify = SdNotify.from_environment()
        watchdog_s = watchdog_timeout_s()
        unset_environment()
        address = socket_address(self.listen_fd) if self.listen_fd is not None else probe_address(
            self.settings.host, self.settings.port)
        probe = GatewayProbe(address, api_key=self.settings.api_key) if notify.enabled else None
        self.service = ServiceNotifier(notify, watchdog_s, probe)
        self.service.start()

    def _bind(self, kind: int, name: str) -> zmq.Socket:
        sock = self.context.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(wire.endpoint(self.runtime_dir, name))
        return sock

    def cleanup(self) -> None:
        for child in self.children:
            kill(child.process)
        self.service.close()
        signal.set_wakeup_fd(-1)
        self.context.destroy(linger=0)
        self._close_listener()
        for child in self.children:
            self._drop_ring(child)
        self._drop_rings()
        if not self.settings.runtime_dir:
            shutil.rmtree(self.runtime_dir, ignore_errors=True)
        else:  # a given dir outlives us; the API key must not
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.settings_path)
        log.info("stopped; removed the rings and the runtime dir")

    def _queue_signal(self, signum: int, frame: object) -> None:
        self.signals.append(signum)  # handled by the loop; never work in a handler

    def _new_ring(self) -> Segment:
        """A gateway's ring: a new name each time, its pages reserved (SharedMemoryFull when they cannot be)."""
        return Segment.create_unique(str(os.getpid()), slot_count=self.settings.slot_count,
                                     slot_bytes=self.settings.slot_mb * 1024 * 1024)

    @staticmethod
    def _drop_ring(child: Child) -> None:
        """Unlink a reaped gateway's ring: workers still running its batches write into a name nobody reads."""
        if child.segment is not None:
            child.segment.close()
            with contextlib.suppress(FileNotFoundError):  # (a stale sweep, or RemoveIPC=, got there first)
                child.segment.unlink()
            child.segment = None

    def _drop_rings(self) -> None:
        for ring in self.rings.values():
            ring.close()
            with contextlib.suppress(FileNotFoundError):
                ring.unlink()
        self.rings.clear()

    # -- spawning ----------------------------------------------------------------------
    def _child_args(self, module: str) -> list[str]:
        """What every child gets: the settings file, and what only this run of the supervisor knows."""
        return [*child_python(module), "--settings", self.settings_path, "--parent-pid", str(os.getpid())]

    def spawn_gateway(self, index: int = 0, generation: int = 0) -> Child:
        """Gateway `index` with its own ring (made fresh for each incarnation: a worker still writing a
        dead incarnation's batch writes into the old ring, never into a slot the new one hands out)."""
        ring = self.rings.pop(index, None) or self._new_ring()
        args = [*self._child_args("ringserve.gateway"), "--index", str(index), "--segment", ring.name]
        if generation:  # a restart: it accepts once a worker has announced itself to it
            args += ["--generation", str(generation)]
        pass_fds: tuple[int, ...] = ()
        if self.listen_fd is not None:  # the one listening socket (systemd's or ours): queued across restarts
            args += ["--fd", str(self.listen_fd)]
            pass_fds += (self.listen_fd,)
        if self._metrics_listener is not None:  # --metrics-port: shared the same way
            args += ["--metrics-fd", str(self._metrics_listener.fileno())]
            pass_fds += (self._metrics_listener.fileno(),)
        try:
            child = self._spawn("gateway", index, generation, args, pass_fds=pass_fds)
        except BaseException:
            ring.close()
            ring.unlink()
            raise
        child.segment = ring
        return child

    def spawn_worker(self, index: int, replacing: Child | None = None, reason: ReplaceReason | None = None) -> Child:
        record = self.records[index]
        record.generation += 1
        record.restart_at = None
        args = [*self._child_args("ringserve.worker"), "--index", str(index), "--generation", str(record.generation)]
        for model in self.quarantined:  # changes while we run: not a setting
            args += ["--skip-model", model]
        child = self._spawn("worker", index, record.generation, args)
        self.service.worker_changed()
        if replacing is not None:
            child.replaces, replacing.successor = replacing.generation, child
            # Each gateway up now must retire the old generation (a gateway that dies meanwhile counts as done).
            replacing.retire_votes = {g.index: g.generation for g in self._role("gateway")}
        self._send_event(messages.WorkerStarted(
            worker=index, pid=child.process.pid, generation=record.generation, restarts=record.restarts,
            replaces=child.replaces, reason=None if replacing is None else reason))
        return child

    def _spawn(self, role: str, index: int, generation: int, args: list[str], pass_fds: tuple[int, ...] = ()) -> Child:
        # A new session: a terminal's Ctrl-C reaches only us, and we decide the order of stopping.
        process = subprocess.Popen(args, start_new_session=True, pass_fds=pass_fds)
        now = time.monotonic()
        child = Child(role, index, generation, process, now, now)
        self.children.append(child)
        log.info("started %s %d generation %d (pid %d)", role, index, generation, process.pid)
        return child

    # -- the loop ----------------------------------------------------------------------
    def run(self) -> int:
        if self.settings.exit_on_error and (unservable := unservable_models(self.settings.model_repository)):
            log.critical("--exit-on-error: not serving, %d model(s) cannot be served: %s", len(unservable),
                         "; ".join(unservable))
            return EXIT_MODEL_ERROR
        try:
            return self._run()
        finally:
            stop_resource_tracker()

    def _run(self) -> int:
        if not listen_fds() and (problem := port_problem(self.settings.host, self.settings.port)):
            log.critical("%s", problem)  # before anything is made: a gateway would find it only after the ring
            return EXIT_BOOT_ERROR
        if problem := metrics_port_problem(self.settings):
            log.critical("%s", problem)
            return EXIT_BOOT_ERROR
        if problem := grpc_port_problem(self.settings, socket_activated=bool(listen_fds())):
            log.critical("%s", problem)  # (the gateways bind it with SO_REUSEPORT: another server's would not fail)
            return EXIT_BOOT_ERROR
        try:
            self.setup()
        except RuntimeDirError as exc:
            log.critical("%s", exc)
            self._drop_rings()
            return EXIT_BAD_RUNTIME_DIR
        except SharedMemoryFull as exc:
            self._drop_rings()
            log.critical("%s. Ask for less with --slot-count (now %d) or --slot-mb (now %d), or fewer --gateways "
                         "(now %d, a ring each), or give %s more room (docker run --shm-size, or the tmpfs mount's "
                         "size=)",
                         exc, self.settings.slot_count, self.settings.slot_mb, self.gateway_count, exc.directory)
            return EXIT_NO_SHARED_MEMORY
        except OSError as exc:  # a listening socket, taken since port_problem looked
            log.critical("cannot listen on %s:%d (or --metrics-port %d): %s", self.settings.host, self.settings.port,
                         self.settings.metrics_port, exc.strerror or exc)
            self._drop_rings()
            return EXIT_BOOT_ERROR
        try:
            for index in range(self.gateway_count):
                self.spawn_gateway(index)
            for index in range(len(self.records)):
                self.spawn_worker(index)
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
        self.murder_hung_workers()
        self.restart_due_workers()
        self.restart_due_gateways()
        now = time.monotonic()
        if now - self._last_memory_sample >= MEMORY_SAMPLE_INTERVAL_S:
            self._last_memory_sample = now
            self._sample_memory()
        self.recycle_due_workers()
        if now - self._last_snapshot >= SNAPSHOT_INTERVAL_S:
            self._last_snapshot = now
            self._send_snapshot()
        # After the reaping above: a worker that died in this iteration is not counted ready.
        self.service.tick(now, reload_pending=any(c.successor for c in self.children),
                          workers_total=len(self.records), restarts=self._restarts_by_reason(),
                          worker_pids={c.process.pid for c in self._role("worker")})

    def handle_signal(self, signum: int) -> None:
        if signum in (signal.SIGTERM, signal.SIGINT):
            self.handle_term(signum)
        elif signum == signal.SIGHUP:
            self.handle_hup()

    def handle_term(self, signum: int) -> None:
        if self.stopping:
            log.warning("second %s: stopping without waiting for the drain", signal.Signals(signum).name)
            for child in self.children:
                kill(child.process)
            return
        log.info("%s: draining the gateway%s, then stopping the workers", signal.Signals(signum).name,
                 "s" if self.gateway_count > 1 else "")
        self.service.stopping()
        for child in self._role("gateway"):
            child.process.send_signal(signal.SIGTERM)
        self._begin_stop(time.monotonic() + self.settings.drain_timeout_s + WORKER_STOP_GRACE_S)

    def _begin_stop(self, deadline: float) -> None:
        """Stop: no restart from now on; the gateways drain until `deadline`, then the workers go."""
        self.stopping = True
        self._stop_deadline = deadline
        self._close_listener()

    def _close_listener(self) -> None:
        """Close our copy of the listening socket (systemd's, or ours): no gateway will be started on it again.

        We kept it to hand to a restarted gateway. Left open while stopping, the kernel kept
        queueing connections on it that nobody would accept: they hung until we exited, then
        were reset. Closed, not shut down: shutdown() would stop systemd's own copy listening
        too (systemd then fails the socket unit: "Got POLLHUP on a listening socket"), and the
        draining gateways' copies of ours.
        """
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        elif self.listen_fd is not None:
            os.close(self.listen_fd)
        self.listen_fd = None
        if self._metrics_listener is not None:
            self._metrics_listener.close()
            self._metrics_listener = None

    def handle_hup(self) -> None:
        """Reload: every serving worker is replaced by a new generation that reads the repository again."""
        if self.stopping:
            return
        log.info("SIGHUP: reloading the model repository %s with a new worker generation",
                 self.settings.model_repository)
        self.service.reloading()
        self._send_event(messages.Reload(model_repository=self.settings.model_repository))
        self.replace_serving_workers()

    def _stopped(self) -> bool:
        """During a stop: the gateways drain first (workers serve their last batches), then workers go."""
        if not self.stopping:
            return False
        if self._role("gateway"):
            if time.monotonic() > self._stop_deadline:
                for child in self._role("gateway"):
                    kill(child.process)
            return False
        for child in self._role("worker"):
            if child.kill_reason is None:
                self._stop_child(child, REASON_STOPPING)
        return not self.children

    def _stop_child(self, child: Child, reason: StopReason) -> None:
        """SIGTERM: a worker finishes the batch it runs, then exits 0 (murder_hung_workers enforces a grace)."""
        child.kill_reason = reason
        child.stop_started_at = time.monotonic()
        child.process.send_signal(signal.SIGTERM)

    def _role(self, role: str) -> list[Child]:
        return [c for c in self.children if c.role == role]

    def _serving_workers(self) -> list[Child]:
        """Workers that serve (or start to serve) their index: not being stopped, not a pending successor."""
        return [c for c in self._role("worker") if c.kill_reason is None and c.replaces is None]

    def _read_heartbeats(self) -> None:
        for message in _received(self.heartbeats):
            match message:
                case messages.Heartbeat():
                    if (child := self._worker(message.worker, message.generation)) is not None:
                        child.last_heartbeat = time.monotonic()
                        child.heard = True
                        child.batches_done = message.batches
                case _:
                    log.warning("ignoring unexpected %s message on the heartbeat socket", message.KIND)

    def _read_control(self) -> None:
        for message in _received(self.control):
            match message:
                case messages.Unquarantine():
                    self.lift_quarantine(message.model)
                case messages.ReloadWorkers():
                    log.info("a repository load of model %s: replacing the workers so that they read it", message.model)
                    self.replace_serving_workers()
                case messages.KillWorker():
                    if (child := self._worker(message.worker, message.generation)) is not None:
                        self._kill_for(child, message.reason)
                case messages.WorkerRetired():
                    if (child := self._worker(message.worker, message.generation)) is not None:
                        self.retired_by(child, message.gateway)
                case messages.QuarantineModel() if message.poison_request:
                    self.count_poison_request(message.model, message.reason, message.request_id)
                case messages.QuarantineModel():
                    self.quarantine_poisoned(message.model, message.reason)
                case messages.RepositoryChanged():
                    self._send_event(message, skip=message.gateway)
                case _:
                    log.warning("ignoring unexpected %s message on the control socket", message.KIND)

    def _worker(self, index: int, generation: int) -> Child | None:
        """The worker process of this index and generation, if it still lives."""
        return next((c for c in self._role("worker") if c.index == index and c.generation == generation), None)

    def count_poison_request(self, model: str, how: str, request_id: str | None = None) -> None:
        """A gateway isolated a request of `model` that crashed the worker on its own: so many within the
        window, through whichever gateways, quarantine it (as they did with one gateway)."""
        now = time.monotonic()
        window = self.settings.quarantine_window_s
        times = [t for t in self._poison_times.get(model, []) if now - t < window] + [now]
        self._poison_times[model] = times
        log.info("model %s: a gateway isolated a poison request (%s; %d within %.0f s)", model, how, len(times),
                 window, extra={"request_id": request_id})
        if len(times) >= self.settings.quarantine_poison_requests:
            which = f", request id {request_id}" if request_id else ""
            self.quarantine_poisoned(model, f"{len(times)} of its requests crashed the worker on their own within "
                                            f"{window:.0f} s (last: {how}{which}); restart the server or load it "
                                            "again to retry it")

    def quarantine_poisoned(self, model: str, why: str) -> None:
        """A gateway isolated enough poison requests of `model`: every gateway answers it 503 from now on.

        The meaning of the gateway's own quarantine, made server-wide: the workers still load
        the model (it crashed them at inference, not at load), a repository load lifts it, and
        a restarted gateway learns it from the next Snapshot.
        """
        if self.stopping or model in self.poisoned or model in self.quarantined:
            return
        self.poisoned[model] = why
        log.error("model %s quarantined in every gateway: %s", model, why)
        self._send_event(messages.ModelQuarantined(model=model, reason=why))

    def lift_quarantine(self, model: str) -> None:
        """A repository load of a quarantined model: forget its crashes and retry it in new workers.

        The serving workers were started with --skip-model for a model that crashed them while
        loading, so each is replaced without downtime (as on SIGHUP) by one that loads it again;
        if it crashes while loading again, three times within the window, it is quarantined
        again. A poison quarantine (crashes at inference) only ends: the workers hold the model.
        """
        if self.stopping:
            return
        poisoned = self.poisoned.pop(model, None) is not None
        self._poison_times.pop(model, None)
        if self.quarantined.pop(model, None) is None:
            if poisoned:
                log.warning("model %s: quarantine lifted by a repository load", model)
                self._send_event(messages.ModelUnquarantined(model=model))
            return
        self._load_crashes.pop(model, None)
        log.warning("model %s: quarantine lifted by a repository load; new workers will load it again", model)
        self._send_event(messages.ModelUnquarantined(model=model))
        self.replace_serving_workers()

    def replace_serving_workers(self) -> None:
        """Each serving worker gets a successor that reads the repository again (restart reason reload)."""
        if self.stopping:
            return
        for child in self._serving_workers():
            if child.successor is None:
                self.recycle_worker(child, REASON_RELOAD)

    def _kill_for(self, child: Child, reason: KillReason) -> None:
        if child.kill_reason is None:
            log.error("killing worker %d (pid %d): %s", child.index, child.process.pid, reason)
            child.kill_reason = reason
            kill(child.process)

    def murder_hung_workers(self) -> None:
        now = time.monotonic()
        s = self.settings
        for child in self._role("worker"):
            if child.process.poll() is not None:
                continue
            if child.kill_reason in (REASON_STOPPING, REASON_RETIRED):
                if now - child.stop_started_at > WORKER_STOP_GRACE_S:
                    log.warning("worker %d (pid %d) ignored SIGTERM for %.0f s; killing it", child.index,
                                child.process.pid, WORKER_STOP_GRACE_S)
                    kill(child.process)
                    child.stop_started_at = float("inf")  # killed once; the reaper takes it from here
            elif now - child.last_heartbeat > (s.hang_timeout_s if child.heard
                                               else max(s.hang_timeout_s, s.worker_start_timeout_s)):
                self._kill_for(child, REASON_HUNG)

    # -- zero-downtime replacement ----------------------------------------------------------
    def recycle_worker(self, child: Child, reason: ReplaceReason) -> None:
        """Start the successor of a serving worker; the old one serves until the gateway retires it."""
        record = self.records[child.index]
        record.restarts[reason] = record.restarts.get(reason, 0) + 1
        log.info("replacing worker %d generation %d (pid %d) without downtime: %s", child.index,
                 child.generation, child.process.pid, reason)
        self.spawn_worker(child.index, replacing=child, reason=reason)

    def retired_by(self, child: Child, gateway: int) -> None:
        """Gateway `gateway` sends `child` nothing more and holds no batch of it.

        An old generation is stopped once every gateway that was up when its replacement began
        has said so, or died since (a new incarnation never sent it anything). A successor that a
        gateway refused (it failed a model the old one serves) is stopped at once: the gateways
        judge it from the same READY. Any other worker is serving: the message is stale, ignored.
        """
        if child.replaces is not None:
            self.retire_worker(child)
        elif child.successor is not None and child.retire_votes is not None:
            child.retire_votes.pop(gateway, None)
            if not child.retire_votes:
                self.retire_worker(child)
            else:
                log.info("worker %d generation %d: gateway %d retired it; waiting for gateway(s) %s", child.index,
                         child.generation, gateway, ", ".join(map(str, sorted(child.retire_votes))))
        else:
            log.warning("gateway %d retired worker %d generation %d, which no replacement involves; ignored",
                        gateway, child.index, child.generation)

    def _gateway_gone(self, index: int, generation: int) -> None:
        """A gateway incarnation died: it counts as having retired every worker it was to retire."""
        for child in self._role("worker"):
            votes = child.retire_votes
            if votes is not None and votes.get(index) == generation:
                del votes[index]
                if not votes and child.successor is not None:
                    self.retire_worker(child)

    def retire_worker(self, child: Child) -> None:
        """The gateways send it nothing more and it holds no batch: stop it."""
        if child.kill_reason is not None:
            return
        child.retire_votes = None
        if child.successor is not None:
            child.successor.replaces = None
            child.successor = None
        if child.replaces is not None:  # a successor the gateway refused: it failed a model the old one serves
            self._drop_successor(child)
            log.error("the replacement of worker %d (generation %d) failed a model that generation %d serves; "
                      "generation %d serves on (the gateway's log says which model)", child.index, child.generation,
                      child.replaces, child.replaces)
        else:
            log.info("worker %d generation %d (pid %d) retired: its successor serves", child.index,
                     child.generation, child.process.pid)
        self._stop_child(child, REASON_RETIRED)

    def recycle_due_workers(self) -> None:
        """Replace workers past --max-batches-per-worker or --worker-memory-limit."""
        s = self.settings
        if self.stopping or not (s.max_batches_per_worker or s.worker_memory_limit_bytes):
            return
        now = time.monotonic()
        for child in self._serving_workers():
            if (child.successor is not None or now - child.started_at < RECYCLE_MIN_UPTIME_S
                    or now < self.records[child.index].recycle_not_before):
                continue
            if s.max_batches_per_worker and child.batches_done >= s.max_batches_per_worker:
                self.recycle_worker(child, REASON_RECYCLED)
            elif s.worker_memory_limit_bytes and child.rss_bytes > s.worker_memory_limit_bytes:
                log.warning("worker %d uses %d MiB, over --worker-memory-limit %d MiB", child.index,
                            child.rss_bytes >> 20, s.worker_memory_limit_bytes >> 20)
                self.recycle_worker(child, REASON_MEMORY)

    def _sample_memory(self, children: list[Child] | None = None) -> None:
        for child in self._role("worker") if children is None else children:
            try:
                child.rss_bytes = psutil.Process(child.process.pid).memory_info().rss
            except psutil.Error:
                pass  # exited since; the reaper handles it

    # -- deaths ----------------------------------------------------------------------------
    def reap_children(self) -> None:
        for child in list(self.children):
            returncode = child.process.poll()
            if returncode is None:
                continue
            self.children.remove(child)
            if child.role == "gateway":
                self._gateway_exited(child, returncode)
            else:
                self._worker_exited(child, returncode)
                self.service.worker_changed()

    def _gateway_name(self, index: int) -> str:
        return "the gateway" if self.gateway_count == 1 else f"gateway {index}"

    def _gateway_exited(self, child: Child, returncode: int) -> None:
        self._drop_ring(child)
        self._gateway_gone(child.index, child.generation)
        name = self._gateway_name(child.index)
        if self.stopping:
            log.info("%s stopped (%s)", name, exit_reason(returncode))
        elif returncode == EXIT_BOOT_ERROR:
            log.critical("%s could not boot; stopping (see its log above)", name)
            self.exit_code = EXIT_BOOT_ERROR
            self._begin_stop(time.monotonic())
        else:
            self._gateway_crashed(child, exit_reason(returncode))

    def _gateway_crashed(self, child: Child, reason: str) -> None:
        """Restart that gateway with the workers' backoff; give up on a crash loop at start-up.

        The workers are left alone: they drop the dead gateway's batches (its clients are gone)
        and serve the other gateways on, and the new incarnation learns them from their READYs.
        A gateway index that dies again and again soon after its start (a broken install, a
        module that fails at import) will not get better by restarting: the supervisor stops
        with a non-zero exit, so systemd sees a failed unit instead of a spinning one. Counted
        per index, and one index in such a loop is enough: the gateways run the same code on
        the same settings, so what kills one at start-up will kill the others at their next
        start, and a server that keeps a fraction of its gateways alive would hide it.
        """
        record = self.gateway_records[child.index]
        now = time.monotonic()
        record.restarts[reason] = record.restarts.get(reason, 0) + 1
        record.last_exit = messages.ExitInfo(reason=reason, at=time.time(), pid=child.process.pid,
                                             generation=child.generation)
        if now - child.started_at > STABLE_AFTER_S:
            record.consecutive_crashes = 0
        record.consecutive_crashes += 1
        name = self._gateway_name(child.index)
        if record.consecutive_crashes >= GATEWAY_GIVE_UP_CRASHES:
            log.critical("%s died %d times in a row, each within %.0f s of its start (last: %s); "
                         "giving up: see its log above", name, record.consecutive_crashes, STABLE_AFTER_S, reason)
            self.exit_code = EXIT_GATEWAY_CRASH_LOOP
            self._begin_stop(now)
            return
        record.restart_at = now + backoff_s(record.consecutive_crashes)
        log.error("%s died (%s); restarting it%s", name, reason,
                  f" in {record.restart_at - now:.1f} s" if record.restart_at > now else "")

    def restart_due_gateways(self) -> None:
        now = time.monotonic()
        for index, record in enumerate(self.gateway_records):
            if self.stopping or record.restart_at is None or now < record.restart_at:
                continue
            record.restart_at = None
            record.generation += 1
            try:
                self.spawn_gateway(index, record.generation)
            except SharedMemoryFull as exc:
                log.critical("cannot make a ring for %s: %s; stopping", self._gateway_name(index), exc)
                self.exit_code = EXIT_NO_SHARED_MEMORY
                self._begin_stop(now)

    def _worker_exited(self, child: Child, returncode: int) -> None:
        if child.kill_reason == REASON_STOPPING:
            return
        if child.kill_reason == REASON_RETIRED:
            log.info("worker %d generation %d (pid %d) stopped after retiring (%s)", child.index,
                     child.generation, child.process.pid, exit_reason(returncode))
            return
        reason = child.kill_reason if child.kill_reason in KILL_REASONS else exit_reason(returncode)
        oom_kills = oom_kill_count()
        if reason == "SIGKILL" and oom_kills > self._oom_kills:
            reason = REASON_OOM
        self._oom_kills = oom_kills
        record = self.records[child.index]
        level = logging.INFO if self.stopping else logging.ERROR
        log.log(level, "worker %d generation %d (pid %d) exited: %s", child.index, child.generation,
                child.process.pid, reason)
        if self.stopping:
            return
        loading_model = self._blame_loading_model(child, reason)
        self._hand_over(child, reason)
        record.restarts[reason] = record.restarts.get(reason, 0) + 1
        now = time.monotonic()
        if now - child.started_at > STABLE_AFTER_S:
            record.consecutive_crashes = 0
        record.consecutive_crashes += 1
        if not any(c.index == child.index and c.kill_reason is None for c in self._role("worker")):
            record.restart_at = now + backoff_s(record.consecutive_crashes)  # nobody else serves this index
        exited = messages.WorkerExited(worker=child.index, pid=child.process.pid, generation=child.generation,
                                       reason=reason, at=time.time(), restarts=record.restarts,
                                       loading_model=loading_model)
        record.last_exit = exited.last_exit
        self._send_event(exited)

    def _hand_over(self, child: Child, reason: str) -> None:
        """A death during a replacement: the survivor of the pair serves; nothing new is started."""
        if child.successor is not None:  # its successor was starting: it simply takes over
            child.successor.replaces = None
            child.successor = None
            child.retire_votes = None
        if child.replaces is not None:  # a successor died before it took over: the old one keeps serving
            self._drop_successor(child)
            log.error("the replacement of worker %d failed (%s); generation %d keeps serving", child.index,
                      reason, child.replaces)

    def _drop_successor(self, child: Child) -> None:
        """A successor that will not take over: its old generation serves on, recycled again only later."""
        for old in self._role("worker"):
            if old.successor is child:
                old.successor = None
                old.retire_votes = None
        self.records[child.index].recycle_not_before = time.monotonic() + RECYCLE_RETRY_S

    def _blame_loading_model(self, child: Child, reason: str) -> str | None:
        """A worker that died while loading a model: count it against that model; returns its key."""
        marker = os.path.join(self.runtime_dir, f"loading-w{child.index}.g{child.generation}")
        try:
            with open(marker) as f:
                model = f.read().strip()
            os.unlink(marker)
        except OSError:
            return None
        now = time.monotonic()
        crashes = [t for t in self._load_crashes.get(model, []) if now - t < QUARANTINE_WINDOW_S] + [now]
        self._load_crashes[model] = crashes
        log.error("worker %d died (%s) while loading model %s", child.index, reason, model)
        if len(crashes) >= QUARANTINE_CRASHES and model not in self.quarantined:
            why = (f"it crashed the worker {len(crashes)} times within {QUARANTINE_WINDOW_S:.0f} s while "
                   f"loading (last: {reason}); restart the server or load it again to retry")
            self.quarantined[model] = why
            log.error("model %s quarantined: %s", model, why)
            self._send_event(messages.ModelQuarantined(model=model, reason=why))
        return model

    def restart_due_workers(self) -> None:
        if self.stopping:
            return
        now = time.monotonic()
        for index, record in enumerate(self.records):
            if record.restart_at is not None and now >= record.restart_at:
                if record.consecutive_crashes > 1:
                    log.warning("worker %d is crash-looping: restart #%d", index, record.consecutive_crashes)
                self.spawn_worker(index)

    # -- telling the gateways ------------------------------------------------------------------
    def _send_snapshot(self) -> None:
        serving = self._serving_workers()
        self._sample_memory([c for c in serving if not c.rss_bytes])  # just took over: not sampled yet
        rss = {c.index: c.rss_bytes for c in serving}
        workers = tuple(messages.WorkerInfo(worker=i, generation=r.generation, restarts=r.restarts,
                                            last_exit=r.last_exit, rss_bytes=rss.get(i, 0))
                        for i, r in enumerate(self.records))
        pids = {c.index: c.process.pid for c in self._role("gateway")}
        # One per index, up or not (pid 0 while it restarts): its restart counters must not vanish meanwhile.
        gateways = tuple(messages.GatewayInfo(gateway=i, pid=pids.get(i, 0), generation=r.generation,
                                              restarts=r.restarts, last_exit=r.last_exit)
                         for i, r in enumerate(self.gateway_records))
        self._send_event(messages.Snapshot(supervisor_pid=os.getpid(), workers=workers,
                                           quarantined={**self.poisoned, **self.quarantined}, gateways=gateways))

    def _restarts_by_reason(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for record in self.records:
            for reason, count in record.restarts.items():
                total[reason] = total.get(reason, 0) + count
        return total

    def _send_event(self, event: messages.Message, skip: int | None = None) -> None:
        """To every gateway (but `skip`): each keeps its own view of the workers, the quarantine and the reloads."""
        frames = messages.encode(event)
        for index, events in enumerate(self.events):
            if index == skip:
                continue
            try:
                events.send_multipart(frames, zmq.NOBLOCK)
            except zmq.Again:
                log.warning("%s is not reading events; dropped %s", self._gateway_name(index), event.KIND)


def _received(sock: zmq.Socket) -> Iterator[messages.Message]:
    """The messages waiting on `sock`; one that does not follow the protocol is logged and dropped."""
    while True:
        try:
            frames = sock.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return
        try:
            message = messages.decode(frames)
        except messages.WireError as exc:
            log.error("dropped a malformed message: %s", exc)
            continue
        yield message
