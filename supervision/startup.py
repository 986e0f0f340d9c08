"""Checks the supervisor makes before it starts anything, and the leftovers of earlier runs it sweeps.

Each check returns (or raises) why the server cannot start; `Supervisor.run` turns that into a
log line and an exit code. They run before the rings and the runtime dir exist, so a refusal
leaves nothing behind.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import tempfile
from collections.abc import Collection
from pathlib import Path

import psutil

from ringserve.common.errors import ConfigError, RingserveError
from ringserve.common.exits import EXIT_BAD_RUNTIME_DIR, EXIT_BOOT_ERROR
from ringserve.common.settings import Settings

RUNTIME_PREFIX = "ringserve-"


class RuntimeDirError(RingserveError):
    def __init__(self, path: str, problem: str) -> None:
        self.path, self.problem = path, problem
        super().__init__(f"--runtime-dir {path}: {problem}")


def unservable_models(repository: str, only: Collection[str] | None = None) -> list[str]:
    """Why each model of the repository (or of `only`: explicit mode's --load-model) cannot be served (layout,
    config.json, an ONNX file that is not ONNX): what --exit-on-error checks before any process starts. A
    readable graph that ONNX Runtime then fails to load (an operator it lacks) is found by the workers; it
    fails that model only."""
    from ringserve.common.repository.scan import scan_repository  # noqa: PLC0415 - reads ONNX graphs: only with the flag

    if only is not None and not only:
        return []
    try:
        failed = scan_repository(Path(repository), unreadable_graph_ok=False).failed
        return [why for key, why in failed.items() if only is None or key.split("/")[0] in only]
    except ConfigError as exc:
        return [str(exc)]


def prepare_runtime_dir(path: str) -> str:
    """The given runtime dir, made if missing; refused unless it is ours and closed to others.

    Its sockets take control messages (kill a worker, retire it), and its peer sockets requests:
    a directory another user owns, or may write to, lets them swap the socket files for their own;
    so does a directory above it that they may write to (they rename the runtime dir away and put
    their own in its place).
    """
    problem = unsafe_parents(path)  # (before anything is made under them)
    if problem is not None:
        raise RuntimeDirError(path, problem)
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        info = os.stat(path)
    except OSError as exc:
        raise RuntimeDirError(
            path,
            f"cannot be created or read ({exc.strerror}); give a directory the server's "
            "user owns, or leave the flag out for a private temporary one",
        ) from None
    if info.st_uid != os.geteuid():
        raise RuntimeDirError(
            path,
            f"is owned by uid {info.st_uid}, not by the server's user (uid {os.geteuid()}); "
            "its owner could swap the socket files",
        )
    if info.st_mode & 0o022:
        raise RuntimeDirError(
            path,
            f"is writable by its group or by everyone (mode {info.st_mode & 0o777:o}); "
            "make it 0700 (systemd: RuntimeDirectoryMode=0700)",
        )
    problem = unsafe_parents(path)  # (directories makedirs made take the umask's mode)
    if problem is not None:
        raise RuntimeDirError(path, problem)
    os.chmod(path, 0o700)
    return path


def unsafe_parents(path: str) -> str | None:
    """Why a directory above `path` lets a user other than the server's (and root) replace it, or None.

    Every directory up to /, on the path as given and as resolved (a symlink's own directory counts
    as well as its target's). A sticky one (/tmp, /dev/shm) is safe: there only an entry's owner
    may rename it. One that does not exist yet is skipped (makedirs makes it, then it is checked).
    """
    seen: set[str] = set()
    for leaf in (os.path.abspath(path), os.path.realpath(path)):
        directory = os.path.dirname(leaf)
        while directory not in seen:
            seen.add(directory)
            problem = _open_to_others(directory)
            if problem is not None:
                return problem
            directory = os.path.dirname(directory)
    return None


def _open_to_others(directory: str) -> str | None:
    try:
        info = os.lstat(directory)
    except OSError:
        return None  # (missing: made by us; unreadable: makedirs says so)
    if stat.S_ISLNK(info.st_mode):
        return None  # (where it points is on the resolved path; the directory holding it is checked next)
    advice = (
        "another local user could move the runtime dir aside and put their own in its place; give a "
        "--runtime-dir whose parent directories only the server's user or root can write (systemd: "
        "RuntimeDirectory=), or leave the flag out for a private temporary one"
    )
    if info.st_uid not in (0, os.geteuid()):
        return (
            f"a directory above it, {directory}, is owned by uid {info.st_uid}, not by the server's user or "
            f"root: {advice}"
        )
    if info.st_mode & 0o022 and not info.st_mode & stat.S_ISVTX:
        return (
            f"a directory above it, {directory}, is writable by its group or by everyone (mode "
            f"{info.st_mode & 0o777:o}) and not sticky: {advice}"
        )
    return None


def grpc_port_problem(settings: Settings, socket_activated: bool = False) -> str | None:
    """Why the gateways could not serve gRPC on --grpc-port, or None. They bind it with SO_REUSEPORT
    (every gateway on one port), which another server's SO_REUSEPORT socket would not refuse: this
    bind without it fails while anyone listens there."""
    port = settings.grpc_port
    if port == 0:
        return None
    if port == settings.port and not socket_activated:
        return f"--grpc-port {port} is the HTTP port (--port); give gRPC a port of its own, or 0 for no gRPC"
    return port_problem(settings.host, port, "--grpc-port")


def port_problem(host: str, port: int, flag: str = "--port") -> str | None:
    """Why the gateway could not listen on host:port, or None (it binds as uvicorn does: SO_REUSEADDR)."""
    if port == 0:
        return None
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror as exc:
        return f"cannot listen on {host}:{port}: {exc.strerror}; check --host"
    try:
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
    except OSError as exc:
        return (
            f"cannot listen on {host}:{port}: {exc.strerror or exc}; stop what uses port {port} "
            f"or choose another with {flag} (or --host)"
        )
    return None


def metrics_port_problem(settings: Settings) -> str | None:
    """Why --metrics-port cannot be served, or None (0: off)."""
    if not settings.metrics_port:
        return None
    if settings.metrics_port == settings.port:
        return f"--metrics-port {settings.metrics_port} is the HTTP port (--port): choose another"
    problem = port_problem(settings.host, settings.metrics_port)
    return None if problem is None else problem.replace("with --port", "with --metrics-port")


def temporary_dir_problem(settings: Settings) -> str | None:
    """Why the runtime dir cannot be made in a temporary directory (a read-only root without a tmpfs on /tmp),
    when no --runtime-dir is given; None when it can. Said before anything is made: tempfile's own error, met
    later, was caught as the listening socket's and blamed the port."""
    if settings.runtime_dir:
        return None
    try:
        tempfile.gettempdir()
    except FileNotFoundError:
        return (
            "no writable temporary directory for the runtime dir (its sockets and settings): /tmp, /var/tmp, "
            "/usr/tmp and the working directory are read-only or missing, and TMPDIR is not set to a writable "
            "one. Mount a tmpfs on /tmp (docker run --read-only --tmpfs /tmp; Kubernetes: an emptyDir at /tmp) "
            "or pass --runtime-dir DIR, a writable directory"
        )
    return None


def boot_problem(settings: Settings, socket_activated: bool) -> tuple[int, str] | None:
    """What stops the server before anything is made, and its exit code: a port taken (a gateway would find it
    only after the ring; gRPC's is bound with SO_REUSEPORT, where another server's would not fail), or no
    writable temporary dir."""
    if not socket_activated and (problem := port_problem(settings.host, settings.port)):
        return EXIT_BOOT_ERROR, problem
    if problem := metrics_port_problem(settings) or grpc_port_problem(settings, socket_activated=socket_activated):
        return EXIT_BOOT_ERROR, problem
    if problem := temporary_dir_problem(settings):
        return EXIT_BAD_RUNTIME_DIR, problem
    return None


def sweep_stale_runtime_dirs() -> list[str]:
    """Remove /tmp/ringserve-<pid>-* whose pid is dead (an earlier run that was SIGKILLed); their names."""
    removed = []
    base = tempfile.gettempdir()
    for entry in os.listdir(base):
        if entry.startswith(RUNTIME_PREFIX):
            pid = entry[len(RUNTIME_PREFIX) :].split("-", 1)[0]
            if pid.isdigit() and not psutil.pid_exists(int(pid)):
                shutil.rmtree(os.path.join(base, entry), ignore_errors=True)
                removed.append(entry)
    return removed
