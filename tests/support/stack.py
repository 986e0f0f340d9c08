"""Start and stop the real ringserve stack (supervisor, gateway, workers) for tests."""
from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil

SHM_DIR = Path("/dev/shm")
# Serve flags every Stack adds before its own (a test's own choice wins): .ci/floors runs the protocol
# suites once with the public engines this way, e.g. "--http-engine uvicorn".
SERVE_FLAGS = shlex.split(os.environ.get("RINGSERVE_TEST_SERVE_FLAGS", ""))


def poll_for(predicate: Callable[[], Any], timeout: float, interval: float = 0.02, what: str = "condition") -> Any:
    """Wait until predicate() is truthy; return its value. Never a bare sleep."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def must_share(status: dict) -> bool:
    """/admin/status of a stack serving one model: the requests it holds must share a batch."""
    batches = sum(w["in_flight_batches"] for w in status["workers"])
    requests = sum(w["in_flight_requests"] for w in status["workers"])
    return requests > batches or any(m["queue_depth"] >= 2 for m in status["models"].values())


def held_requests(status: dict) -> int:
    """/admin/status: the requests the gateway holds, queued or in a batch on a worker."""
    return (sum(w["in_flight_requests"] for w in status["workers"])
            + sum(m["queue_depth"] for m in status["models"].values()))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def shm_segments(pid: int | None = None) -> list[str]:
    prefix = "ringserve-" if pid is None else f"ringserve-{pid}-"
    return sorted(p.name for p in SHM_DIR.iterdir() if p.name.startswith(prefix))


# Moves the socket to fd 3, sets LISTEN_FDS/LISTEN_PID for its own pid, then execs the command (same pid).
_SOCKET_ACTIVATION = """import os, sys
fd = int(sys.argv[1])
if fd != 3:
    os.dup2(fd, 3)
    os.close(fd)
os.environ.update(LISTEN_FDS="1", LISTEN_PID=str(os.getpid()))
os.execv(sys.argv[2], sys.argv[2:])
"""


# Sets its own RLIMIT_NOFILE (soft, hard), then execs the command (same pid): the whole tree inherits it.
_NOFILE = """import os, resource, sys
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[2])))
os.execv(sys.argv[3], sys.argv[3:])
"""


def socket_activated(cmd: list[str], fd: int) -> tuple[list[str], tuple[int, ...]]:
    """cmd run as systemd runs a socket-activated service: the socket at fd 3, LISTEN_FDS=1, LISTEN_PID."""
    return [sys.executable, "-c", _SOCKET_ACTIVATION, str(fd), *cmd], (fd,)


@contextlib.contextmanager
def running_stack(repo: Path, *args: str, env: dict[str, str] | None = None,
                  stack_class: type[Stack] | None = None) -> Iterator[Stack]:
    """A started stack, always stopped afterwards; it must leave no process or segment behind."""
    stack = (stack_class or Stack)(repo, *args, env=env)
    try:
        yield stack.start()
    finally:
        try:
            stack.stop()
        finally:
            stack.kill_everything()
        stack.assert_nothing_left()


class Stack:
    """One `ringserve serve` process tree on a free port."""

    started_pids: list[int] = []  # every supervisor this test session started
    stderr: Any = None  # where the process tree's log lines go (a file: a subclass's; None: the test's stderr)
    nofile: tuple[int, int] | None = None  # RLIMIT_NOFILE (soft, hard) the tree starts with (None: the test's)

    def __init__(self, repo: Path, *args: str, env: dict[str, str] | None = None,
                 listen_socket: socket.socket | None = None) -> None:
        self.repo = repo
        self.listen_socket = listen_socket  # serve on it as systemd socket activation would
        self.port = free_port() if listen_socket is None else listen_socket.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.args = list(args)
        self.env = {**os.environ, **(env or {})}
        self.process: subprocess.Popen | None = None
        self.seen_pids: set[int] = set()

    def start(self, ready_timeout_s: float = 60.0, wait_ready: bool = True) -> Stack:
        # gRPC only where a test asks for it (--grpc-port): every stack would want 8001.
        grpc = [] if "--grpc-port" in self.args else ["--grpc-port", "0"]
        cmd = [sys.executable, "-P", "-m", "ringserve.cli", "serve", "--model-repository", str(self.repo),
               "--port", str(self.port), "--log-level", "WARNING", *grpc, *SERVE_FLAGS, *self.args]
        pass_fds: tuple[int, ...] = ()
        if self.nofile is not None:
            cmd = [sys.executable, "-c", _NOFILE, *map(str, self.nofile), *cmd]
        if self.listen_socket is not None:
            cmd, pass_fds = socket_activated(cmd, self.listen_socket.fileno())
        self.process = subprocess.Popen(cmd, env=self.env, pass_fds=pass_fds, stderr=self.stderr)
        Stack.started_pids.append(self.process.pid)
        if wait_ready:
            poll_for(self.is_ready, ready_timeout_s, 0.05, "the stack to be ready")
        self.remember_children()
        return self

    @property
    def pid(self) -> int:
        return self.process.pid

    def remember_children(self) -> set[int]:
        try:
            pids = {p.pid for p in psutil.Process(self.pid).children(recursive=True)}
        except psutil.NoSuchProcess:
            pids = set()
        self.seen_pids |= pids
        return pids

    def is_ready(self) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(f"ringserve exited with {self.process.returncode} before it was ready")
        try:
            return self.get("/v2/health/ready")[0] == 200
        except OSError:
            return False

    def get(self, path: str) -> tuple[int, Any]:
        return self._call(urllib.request.Request(self.url + path))

    def post(self, path: str, doc: Any) -> tuple[int, Any]:
        body = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
        return self._call(urllib.request.Request(self.url + path, data=body,
                                                 headers={"content-type": "application/json"}))

    def _call(self, request: urllib.request.Request) -> tuple[int, Any]:
        try:
            with urllib.request.urlopen(request, timeout=60) as r:
                raw, status, ctype = r.read(), r.status, r.headers.get("content-type", "")
        except urllib.error.HTTPError as e:
            raw, status, ctype = e.read(), e.code, e.headers.get("content-type", "")
        return status, (json.loads(raw) if "json" in ctype else raw.decode())

    def status(self) -> dict:
        return self.get("/admin/status")[1]

    def worker_pid(self, index: int = 0) -> int:
        return next(w["pid"] for w in self.status()["workers"] if w["index"] == index)

    def serves(self, model: str) -> bool:
        """The server is ready and so is `model`: with lanes, the server stays ready while one model's lane
        is being replaced (its other models serve), so a test that killed that lane waits for this."""
        status = self.status()
        return bool(status["ready"] and status["models"].get(model, {}).get("ready"))

    def lane(self, model: str) -> int:
        """The index of the first worker (lane) that holds `model`: with `--lanes model` (the default) each
        of a repository's models has its own (supervision/lanes.py); with `--lanes shared`, worker 0."""
        worker = poll_for(lambda: next((w for w in self.status()["workers"] if model in w["models"]), None),
                          30, what=f"a worker that holds {model}")
        return int(worker["index"])

    def send_while_stopped(self, send: Callable[[], Any], until: Callable[[dict], bool] | None = None,
                           timeout_s: float = 3.0) -> Any:
        """send() (blocking: it sends concurrent requests and returns their answers), with every
        worker stopped (SIGSTOP) until `until(/admin/status)` holds; by default, until requests
        must share a batch: one in flight holds several, or two wait in a queue.

        Batching is work-conserving: on a starved CPU each request can find a worker idle and go
        alone, so a test that must see requests share batches holds the workers first. The stop
        stays well inside the hang timeout (5 s), so no worker is replaced."""
        pids = [w["pid"] for w in self.status()["workers"] if w["state"] == "ready"]
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
            try:
                sending = pool.submit(send)
                poll_for(lambda: (until or must_share)(self.status()) or sending.done(), timeout_s,
                         what="requests held behind the stopped workers")
            finally:
                for pid in pids:
                    os.kill(pid, signal.SIGCONT)
            answers = sending.result(timeout=120)
        assert [w["pid"] for w in self.status()["workers"] if w["state"] == "ready"] == pids, "a worker was replaced"
        return answers

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of `name` whose labels include `labels` (0 when absent)."""
        text = self.get("/metrics")[1]
        total = 0.0
        for line in text.splitlines():
            if not line.startswith(name + "{") and not line.startswith(name + " "):
                continue
            head, value = line.rsplit(" ", 1)
            if all(f'{k}="{v}"' in head for k, v in labels.items()):
                total += float(value)
        return total

    def stop(self, sig: int = signal.SIGTERM, timeout_s: float = 45.0) -> int | None:
        """Signal the supervisor and wait for it; SIGKILL the tree if it does not go."""
        if self.process is None:
            return None
        self.remember_children()
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.kill_everything()
            raise

    def kill_everything(self) -> None:
        for pid in [self.pid, *self.remember_children()]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if self.process is not None:
            self.process.wait(10)

    def leftovers(self) -> tuple[list[int], list[str]]:
        alive = [p for p in self.seen_pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        return alive, shm_segments(self.pid)

    def assert_nothing_left(self, timeout_s: float = 10.0) -> None:
        poll_for(lambda: self.leftovers() == ([], []), timeout_s, 0.05, "children and segments to go away")
