"""The supervisor: owns the runtime dir and the ring, starts and watches gateway and workers.

One process, one loop (uvicorn's Multiprocess, gunicorn's arbiter in small): signal
handlers only queue the signal; the loop reaps children, decodes how they died, tells
the gateway at once, restarts them with backoff, and kills workers whose heartbeats stop.
"""
from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import psutil
import zmq

from common import wire
from shm.segment import Segment, segment_name, sweep_stale_segments

log = logging.getLogger("supervisor")

EXIT_OK = 0
EXIT_GATEWAY_BOOT_ERROR = 3  # the gateway could not start (bad repository, port in use)
GATEWAY_BOOT_ERROR = 3  # exit status gateway/__main__ uses for that
REASON_HUNG = "hung"
REASON_BATCH_TIMEOUT = "batch_timeout"
REASON_OOM = "oom"
KILL_REASONS = (REASON_HUNG, REASON_BATCH_TIMEOUT)  # deaths we caused, reported as why we did it
RESTART_IMMEDIATE = 3  # consecutive crashes restarted at once (isolating a poison request takes a few)
RESTART_BACKOFF_FIRST_S = 0.1
RESTART_BACKOFF_MAX_S = 10.0
STABLE_AFTER_S = 10.0  # a worker up this long resets its backoff
QUARANTINE_CRASHES = 3  # a model that kills the worker this often while loading...
QUARANTINE_WINDOW_S = 60.0  # ...within this window is quarantined
CGROUP_MEMORY_EVENTS = "/sys/fs/cgroup/memory.events"
WORKER_STOP_GRACE_S = 5.0
SNAPSHOT_INTERVAL_S = 1.0
RUNTIME_PREFIX = "ringserve-"


@dataclass(frozen=True)
class ServeSettings:
    model_repository: str
    host: str = "127.0.0.1"
    port: int = 8000
    workers: int = 1
    slot_count: int = 8
    slot_mb: int = 16
    hang_timeout_s: float = 5.0
    batch_timeout_s: float = 0.0  # 0 = no per-batch ceiling
    hold_when_unavailable_s: float = 0.0  # 0 = answer 503 at once while no worker is ready
    request_timeout_s: float = 30.0
    max_attempts: int = 2
    drain_timeout_s: float = 30.0
    intra_op_threads: int = 1
    cpu_only: bool = False
    runtime_dir: str | None = None
    log_level: str = "INFO"


@dataclass(eq=False)
class Child:
    role: str  # "gateway" | "worker"
    index: int
    generation: int
    process: subprocess.Popen
    started_at: float
    last_heartbeat: float
    kill_reason: str | None = None  # set when we killed it ourselves (e.g. hung)


@dataclass
class WorkerRecord:
    """What outlives one worker process: its restart counters and backoff."""

    generation: int = 0
    restarts: dict[str, int] = field(default_factory=dict)
    consecutive_crashes: int = 0
    restart_at: float | None = None
    last_exit: dict | None = None


def exit_reason(returncode: int) -> str:
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal_{-returncode}"
    return f"exit_{returncode}"


def backoff_s(consecutive_crashes: int) -> float:
    """The first few restarts at once; then 0.1 s doubling up to 10 s."""
    if consecutive_crashes <= RESTART_IMMEDIATE:
        return 0.0
    return min(RESTART_BACKOFF_MAX_S, RESTART_BACKOFF_FIRST_S * 2 ** (consecutive_crashes - RESTART_IMMEDIATE - 1))


def oom_kill_count() -> int:
    """The kernel's OOM-kill count for our cgroup (v2); 0 where it cannot be read."""
    try:
        with open(CGROUP_MEMORY_EVENTS) as f:
            for line in f:
                key, value = line.split()
                if key == "oom_kill":
                    return int(value)
    except (OSError, ValueError):
        pass
    return 0


class Supervisor:
    def __init__(self, settings: ServeSettings) -> None:
        self.settings = settings
        self.signals: list[int] = []
        self.children: list[Child] = []
        self.records = [WorkerRecord() for _ in range(settings.workers)]
        self.stopping = False
        self.exit_code = EXIT_OK
        self.quarantined: dict[str, str] = {}  # model -> why
        self._load_crashes: dict[str, list[float]] = {}
        self._oom_kills = oom_kill_count()
        self._last_snapshot = 0.0

    # -- setup and teardown ----------------------------------------------------------
    def setup(self) -> None:
        removed = sweep_stale_segments(psutil.pid_exists)
        removed += _sweep_stale_runtime_dirs()
        if removed:
            log.info("removed stale leftovers of an earlier run: %s", ", ".join(removed))
        self.runtime_dir = self.settings.runtime_dir or tempfile.mkdtemp(prefix=f"{RUNTIME_PREFIX}{os.getpid()}-")
        os.makedirs(self.runtime_dir, mode=0o700, exist_ok=True)
        os.chmod(self.runtime_dir, 0o700)
        self.segment = Segment.create(segment_name(str(os.getpid())), slot_count=self.settings.slot_count,
                                      slot_bytes=self.settings.slot_mb * 1024 * 1024)
        self.context = zmq.Context(io_threads=1)
        self.heartbeats = self._bind(zmq.PULL, "heartbeat")
        self.control = self._bind(zmq.PULL, "control")
        self.events = self.context.socket(zmq.PUSH)
        self.events.setsockopt(zmq.LINGER, 0)
        self.events.connect(wire.endpoint(self.runtime_dir, "events"))
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_w.setblocking(False)
        signal.set_wakeup_fd(self._wake_w.fileno())
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, self._queue_signal)
        self.poller = zmq.Poller()
        for sock in (self.heartbeats, self.control, self._wake_r):
            self.poller.register(sock, zmq.POLLIN)

    def _bind(self, kind: int, name: str) -> zmq.Socket:
        sock = self.context.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(wire.endpoint(self.runtime_dir, name))
        return sock

    def cleanup(self) -> None:
        for child in self.children:
            _kill(child.process)
        signal.set_wakeup_fd(-1)
        self.context.destroy(linger=0)
        self.segment.close()
        self.segment.unlink()
        if not self.settings.runtime_dir:
            shutil.rmtree(self.runtime_dir, ignore_errors=True)
        log.info("stopped; removed the ring and the runtime dir")

    def _queue_signal(self, signum: int, frame: object) -> None:
        self.signals.append(signum)  # handled by the loop; never work in a handler

    # -- spawning ----------------------------------------------------------------------
    def _common_args(self) -> list[str]:
        return ["--runtime-dir", self.runtime_dir, "--segment", self.segment.name,
                "--model-repository", self.settings.model_repository, "--parent-pid", str(os.getpid()),
                "--log-level", self.settings.log_level]

    def spawn_gateway(self) -> None:
        s = self.settings
        args = [sys.executable, "-m", "gateway", *self._common_args(), "--host", s.host, "--port", str(s.port),
                "--request-timeout-s", str(s.request_timeout_s), "--max-attempts", str(s.max_attempts),
                "--drain-timeout-s", str(s.drain_timeout_s), "--batch-timeout-s", str(s.batch_timeout_s),
                "--hold-when-unavailable-s", str(s.hold_when_unavailable_s)]
        self._spawn("gateway", 0, 0, args)

    def spawn_worker(self, index: int) -> None:
        record = self.records[index]
        record.generation += 1
        record.restart_at = None
        args = [sys.executable, "-m", "worker", *self._common_args(), "--index", str(index),
                "--generation", str(record.generation), "--intra-op-threads", str(self.settings.intra_op_threads)]
        if self.settings.cpu_only:
            args.append("--cpu-only")
        for model in self.quarantined:
            args += ["--skip-model", model]
        child = self._spawn("worker", index, record.generation, args)
        self._send_event("WORKER_STARTED", {"worker": index, "pid": child.process.pid,
                                            "generation": record.generation, "restarts": record.restarts})

    def _spawn(self, role: str, index: int, generation: int, args: list[str]) -> Child:
        # A new session: a terminal's Ctrl-C reaches only us, and we decide the order of stopping.
        process = subprocess.Popen(args, start_new_session=True)
        now = time.monotonic()
        child = Child(role, index, generation, process, now, now)
        self.children.append(child)
        log.info("started %s %d generation %d (pid %d)", role, index, generation, process.pid)
        return child

    # -- the loop ----------------------------------------------------------------------
    def run(self) -> int:
        self.setup()
        try:
            self.spawn_gateway()
            for index in range(self.settings.workers):
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
        now = time.monotonic()
        if now - self._last_snapshot >= SNAPSHOT_INTERVAL_S:
            self._last_snapshot = now
            self._send_event("SNAPSHOT", {"supervisor_pid": os.getpid(), "workers": [
                {"worker": i, "generation": r.generation, "restarts": r.restarts, "last_exit": r.last_exit}
                for i, r in enumerate(self.records)], "quarantined": self.quarantined})

    def handle_signal(self, signum: int) -> None:
        if signum in (signal.SIGTERM, signal.SIGINT):
            self.handle_term(signum)
        elif signum == signal.SIGHUP:
            log.info("SIGHUP: reload is not implemented yet; ignoring")

    def handle_term(self, signum: int) -> None:
        if self.stopping:
            log.warning("second %s: stopping without waiting for the drain", signal.Signals(signum).name)
            for child in self.children:
                _kill(child.process)
            return
        log.info("%s: draining the gateway, then stopping the workers", signal.Signals(signum).name)
        self.stopping = True
        self._stop_deadline = time.monotonic() + self.settings.drain_timeout_s + WORKER_STOP_GRACE_S
        for child in self._role("gateway"):
            child.process.send_signal(signal.SIGTERM)

    def _stopped(self) -> bool:
        """During a stop: gateway drains first (workers serve its last batches), then workers go."""
        if not self.stopping:
            return False
        if self._role("gateway"):
            if time.monotonic() > self._stop_deadline:
                for child in self._role("gateway"):
                    _kill(child.process)
            return False
        for child in self._role("worker"):
            if child.kill_reason is None:
                child.kill_reason = "stopping"
                child.process.send_signal(signal.SIGTERM)
                child.started_at = time.monotonic()  # now: the time its stop began
            elif time.monotonic() - child.started_at > WORKER_STOP_GRACE_S:
                _kill(child.process)
        return not self.children

    def _role(self, role: str) -> list[Child]:
        return [c for c in self.children if c.role == role]

    def _read_heartbeats(self) -> None:
        while True:
            try:
                kind, body = wire.decode(self.heartbeats.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return
            for child in self._role("worker"):
                if child.index == body["worker"] and child.generation == body["generation"]:
                    child.last_heartbeat = time.monotonic()

    def _read_control(self) -> None:
        while True:
            try:
                kind, body = wire.decode(self.control.recv_multipart(zmq.NOBLOCK))
            except zmq.Again:
                return
            if kind == "KILL_WORKER":
                for child in self._role("worker"):
                    if child.index == body["worker"] and child.generation == body["generation"]:
                        self._kill_for(child, body["reason"])

    def _kill_for(self, child: Child, reason: str) -> None:
        if child.kill_reason is None:
            log.error("killing worker %d (pid %d): %s", child.index, child.process.pid, reason)
            child.kill_reason = reason
            _kill(child.process)

    def murder_hung_workers(self) -> None:
        now = time.monotonic()
        for child in self._role("worker"):
            if now - child.last_heartbeat > self.settings.hang_timeout_s and child.process.poll() is None:
                self._kill_for(child, REASON_HUNG)

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

    def _gateway_exited(self, child: Child, returncode: int) -> None:
        if self.stopping:
            log.info("gateway stopped (%s)", exit_reason(returncode))
        elif returncode == GATEWAY_BOOT_ERROR:
            log.critical("gateway could not boot; stopping (see its log above)")
            self.exit_code = EXIT_GATEWAY_BOOT_ERROR
            self.stopping = True
            self._stop_deadline = time.monotonic()
        else:
            log.error("gateway died (%s); restarting it and its workers", exit_reason(returncode))
            self.spawn_gateway()
            for worker in self._role("worker"):
                self._kill_for(worker, "gateway restarted")

    def _worker_exited(self, child: Child, returncode: int) -> None:
        if child.kill_reason == "stopping":
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
        self._blame_loading_model(child, reason)
        record.restarts[reason] = record.restarts.get(reason, 0) + 1
        now = time.monotonic()
        if now - child.started_at > STABLE_AFTER_S:
            record.consecutive_crashes = 0
        record.consecutive_crashes += 1
        record.restart_at = now + backoff_s(record.consecutive_crashes)
        record.last_exit = {"reason": reason, "at": time.time(), "pid": child.process.pid,
                            "generation": child.generation}
        self._send_event("WORKER_EXITED", {"worker": child.index, "pid": child.process.pid,
                                           "generation": child.generation, "reason": reason,
                                           "at": record.last_exit["at"], "restarts": record.restarts,
                                           "last_exit": record.last_exit})

    def _blame_loading_model(self, child: Child, reason: str) -> None:
        """A worker that died while loading a model: count it against that model."""
        marker = os.path.join(self.runtime_dir, f"loading-w{child.index}")
        try:
            with open(marker) as f:
                model = f.read().strip()
            os.unlink(marker)
        except OSError:
            return
        now = time.monotonic()
        crashes = [t for t in self._load_crashes.get(model, []) if now - t < QUARANTINE_WINDOW_S] + [now]
        self._load_crashes[model] = crashes
        log.error("worker %d died (%s) while loading model %s", child.index, reason, model)
        if len(crashes) >= QUARANTINE_CRASHES and model not in self.quarantined:
            why = (f"it crashed the worker {len(crashes)} times within {QUARANTINE_WINDOW_S:.0f} s while "
                   f"loading (last: {reason}); restart the server or load it again to retry")
            self.quarantined[model] = why
            log.error("model %s quarantined: %s", model, why)
            self._send_event("MODEL_QUARANTINED", {"model": model, "reason": why})

    def restart_due_workers(self) -> None:
        if self.stopping:
            return
        now = time.monotonic()
        for index, record in enumerate(self.records):
            if record.restart_at is not None and now >= record.restart_at:
                if record.consecutive_crashes > 1:
                    log.warning("worker %d is crash-looping: restart #%d", index, record.consecutive_crashes)
                self.spawn_worker(index)

    def _send_event(self, kind: wire.Kind, body: dict) -> None:
        try:
            self.events.send_multipart(wire.encode(kind, body), zmq.NOBLOCK)
        except zmq.Again:
            log.warning("gateway not reading events; dropped %s", kind)


def _kill(process: subprocess.Popen) -> None:
    if process.poll() is None:
        try:
            process.kill()
        except ProcessLookupError:
            pass


def _sweep_stale_runtime_dirs() -> list[str]:
    removed = []
    base = tempfile.gettempdir()
    for entry in os.listdir(base):
        if entry.startswith(RUNTIME_PREFIX):
            pid = entry[len(RUNTIME_PREFIX):].split("-", 1)[0]
            if pid.isdigit() and not psutil.pid_exists(int(pid)):
                shutil.rmtree(os.path.join(base, entry), ignore_errors=True)
                removed.append(entry)
    return removed
