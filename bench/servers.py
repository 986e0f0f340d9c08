"""The processes the bench measures: ringserve stacks, the HTTP ceilings and the peers.

Every one runs as a subprocess in its own session, so the load generator and the server
never share a process. A Service knows how to start its process, when it is ready, which
URL takes inference requests, and how to stop it and everything it started: SIGTERM and a
wait first (ringserve's supervisor then drains, stops its workers and removes its shared
memory); only if that does not finish are the remembered descendants killed by pid and
leftovers removed. The process tree is also where a run's server CPU and memory are read.
"""
from __future__ import annotations

import contextlib
import ctypes
import glob
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Self

import psutil

log = logging.getLogger(__name__)

SHM_DIR = "/dev/shm"
SEGMENT_PREFIX = "ringserve-"  # shm.segment: names are ringserve-<supervisor pid>-<role>
SPARE_PROCESS_NAME = "ringserve-spare"  # worker/spare.py names its process so until it takes over
RUNTIME_PREFIX = "ringserve-"  # supervisor's runtime dir: <tmp>/ringserve-<supervisor pid>-XXXX
_PR_SET_PDEATHSIG = 1
ServiceKind = Literal["ringserve", "ceiling", "peer"]


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def ringserve_command() -> list[str]:
    """The `ringserve` entry point next to this interpreter, else the cli module run directly."""
    script = Path(sys.executable).parent / "ringserve"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-P", "-m", "ringserve.cli"]


def _die_with_parent_hook():
    """preexec_fn that has the kernel SIGTERM the server if this process dies (Linux), else None.

    prctl is looked up here, before the fork, so the child only makes the one system call.
    """
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, int(signal.SIGTERM))

    return hook


class ServerError(RuntimeError):
    pass


@dataclass(frozen=True)
class Probe:
    """What "ready" means: GET paths that answer 200, and optionally one POST that answers 200."""

    get_paths: tuple[str, ...] = ()
    post_path: str | None = None
    post_body: bytes = b""
    post_content_type: str = "application/json"


def role_of(process: psutil.Process) -> str:
    """A short name for a process of a server tree: gateway, worker, spare, supervisor, or its name."""
    with contextlib.suppress(psutil.Error):
        args = process.cmdline()
        joined = " ".join(args)
        if process.name() == SPARE_PROCESS_NAME:  # a warm spare (its command line stays a worker's)
            return "spare"
        for role in ("gateway", "worker"):
            if f"-m ringserve.{role}" in joined or f"-m {role}" in joined:  # (--baseline of an older checkout)
                return role
        if " serve " in f" {joined} " and ("ringserve" in joined or "cli" in joined):
            return "supervisor"
        if "resource_tracker" in joined:
            return "resource_tracker"
        return process.name()
    return "gone"


class Service:
    """One server process tree; start() waits until it is ready, stop() leaves nothing behind."""

    def __init__(self, name: str, kind: ServiceKind, command: Sequence[str], *, port: int, log_dir: Path,
                 probe: Probe, infer_path: str = "/v2/models/mlp/infer", metrics_path: str | None = None,
                 host: str = "127.0.0.1", env: dict[str, str] | None = None, cwd: Path | None = None,
                 description: str = "", stop_signal: signal.Signals = signal.SIGTERM) -> None:
        self.name = name
        self.stop_signal = stop_signal
        self.kind = kind
        self.args = list(command)
        self.port = port
        self.host = host
        self.grpc_port: int | None = None  # a peer that serves gRPC too (bench protocols)
        self.probe = probe
        self.infer_path = infer_path
        self.metrics_path = metrics_path
        self.env = None if env is None else {**os.environ, **env}
        self.cwd = cwd
        self.description = description
        self.log_path = Path(log_dir) / f"server-{name}.log"
        self.process: subprocess.Popen | None = None
        self.started_at = 0.0
        self.ready_s: float | None = None
        self._descendants: set[int] = set()
        self._shm_before: set[str] = set()
        self.stop_report: dict[str, Any] = {}

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def infer_url(self) -> str:
        return self.url + self.infer_path

    @property
    def metrics_url(self) -> str | None:
        return None if self.metrics_path is None else self.url + self.metrics_path

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- start ------------------------------------------------------------------------------
    def start(self, ready_timeout_s: float = 90.0) -> None:
        self.launch()
        self.wait_until_ready(ready_timeout_s)

    def launch(self) -> None:
        """Start the process without waiting (start_all launches every service, then waits)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._shm_before = set(os.listdir(SHM_DIR)) if os.path.isdir(SHM_DIR) else set()
        self.started_at = time.monotonic()
        with open(self.log_path, "wb") as log_file:
            self.process = subprocess.Popen(self.args, stdin=subprocess.DEVNULL, stdout=log_file,
                                            stderr=subprocess.STDOUT, start_new_session=True, env=self.env,
                                            cwd=self.cwd,
                                            # only prctl(PR_SET_PDEATHSIG) runs there, looked up before the fork
                                            preexec_fn=_die_with_parent_hook())  # noqa: PLW1509
        log.info("started %s (pid %d) on %s", self.name, self.process.pid, self.url)

    def wait_until_ready(self, ready_timeout_s: float) -> None:
        try:
            self.wait_ready(ready_timeout_s)
        except BaseException:
            self.stop()
            raise
        self.ready_s = time.monotonic() - self.started_at

    def wait_ready(self, timeout_s: float) -> None:
        assert self.process is not None
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise ServerError(f"{self.name} exited with {self.process.returncode} before it was ready; "
                                  f"log tail:\n{self.log_tail()}")
            if self.is_ready():
                self.remember_descendants()
                return
            if time.monotonic() > deadline:
                raise ServerError(f"{self.name} not ready after {timeout_s:.0f} s; log tail:\n{self.log_tail()}")
            time.sleep(0.2)

    def is_ready(self) -> bool:
        if not all(self.get_status(path) == 200 for path in self.probe.get_paths):
            return False
        if self.probe.post_path is None:
            return True
        request = urllib.request.Request(self.url + self.probe.post_path, data=self.probe.post_body,
                                         headers={"content-type": self.probe.post_content_type})
        return self._status_of(request) == 200

    def get_status(self, path: str) -> int | None:
        return self._status_of(urllib.request.Request(self.url + path))

    @staticmethod
    def _status_of(request: urllib.request.Request, timeout_s: float = 5.0) -> int | None:
        try:
            with urllib.request.urlopen(request, timeout=timeout_s) as response:
                response.read()
                return response.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except (urllib.error.URLError, OSError):
            return None

    def get_text(self, path: str, timeout_s: float = 10.0) -> str:
        with urllib.request.urlopen(self.url + path, timeout=timeout_s) as response:
            return response.read().decode()

    # -- the process tree -------------------------------------------------------------------
    def remember_descendants(self) -> set[int]:
        if self.process is None:
            return set()
        with contextlib.suppress(psutil.Error):
            self._descendants |= {c.pid for c in psutil.Process(self.process.pid).children(recursive=True)}
        return self._descendants

    def processes(self) -> list[psutil.Process]:
        """The live tree: the root and every descendant."""
        if self.process is None or self.process.poll() is not None:
            return []
        try:
            root = psutil.Process(self.process.pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.Error:
            return []
        self._descendants |= {p.pid for p in tree[1:]}
        return tree

    def pids_by_role(self) -> dict[str, list[int]]:
        roles: dict[str, list[int]] = {}
        for process in self.processes():
            roles.setdefault(role_of(process), []).append(process.pid)
        return roles

    def cpu_seconds(self) -> dict[int, tuple[str, float]]:
        """{pid: (role, user + system seconds)} over the live tree."""
        sample = {}
        for process in self.processes():
            with contextlib.suppress(psutil.Error):
                times = process.cpu_times()
                sample[process.pid] = (role_of(process), times.user + times.system)
        return sample

    def memory(self) -> dict[str, Any]:
        """RSS, PSS and USS of the tree, in MiB, in total and by role.

        RSS double-counts pages processes share (the ring, shared libraries); PSS splits them
        among the sharers, so it moves when unrelated processes map the same libraries; USS
        (pages only this process has) is the steady one, the one to watch for growth.
        """
        by_role: dict[str, dict[str, float]] = {}
        for process in self.processes():
            with contextlib.suppress(psutil.Error):
                info = process.memory_full_info()
                entry = by_role.setdefault(role_of(process), {"rss_mib": 0.0, "pss_mib": 0.0, "uss_mib": 0.0,
                                                              "processes": 0})
                entry["rss_mib"] += info.rss / 2**20
                entry["pss_mib"] += getattr(info, "pss", info.rss) / 2**20
                entry["uss_mib"] += getattr(info, "uss", info.rss) / 2**20
                entry["processes"] += 1
        total = {key: round(sum(v[key] for v in by_role.values()), 1) for key in ("rss_mib", "pss_mib", "uss_mib")}
        return {**total, "by_role": {role: {k: (round(v, 1) if k != "processes" else int(v)) for k, v in e.items()}
                                     for role, e in sorted(by_role.items())}}

    # -- logs -------------------------------------------------------------------------------
    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return "(no log)"

    def log_lines(self, needle: str) -> list[str]:
        with contextlib.suppress(OSError):
            return [line for line in self.log_path.read_text(errors="replace").splitlines() if needle in line]
        return []

    # -- stop -------------------------------------------------------------------------------
    def stop(self, timeout_s: float = 60.0) -> dict[str, Any]:
        """stop_signal (SIGTERM), wait; kill by pid and clean up only if the clean stop did not finish."""
        process = self.process
        if process is None or self.stop_report:
            return self.stop_report
        self.remember_descendants()
        report: dict[str, Any] = {"pid": process.pid, "forced": False}
        t = time.monotonic()
        if process.poll() is None:
            process.send_signal(self.stop_signal)
            try:
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                log.error("%s (pid %d) still running %.0f s after %s; killing it", self.name, process.pid,
                          timeout_s, self.stop_signal.name)
                report["forced"] = True
                process.kill()
                process.wait()
        report["returncode"] = process.returncode
        report["stop_s"] = round(time.monotonic() - t, 3)
        # Children watch their parent (ringserve) or are stopped by it (peers); give them a
        # moment, then kill stragglers by pid.
        survivors = []
        deadline = time.monotonic() + 10.0
        for pid in sorted(self._descendants):
            with contextlib.suppress(psutil.Error):
                child = psutil.Process(pid)
                try:
                    child.wait(max(0.0, deadline - time.monotonic()))
                except psutil.TimeoutExpired:
                    survivors.append(pid)
                    child.kill()
                    child.wait(5)
        report["killed_children"] = survivors
        report["removed_leftovers"] = self._remove_leftovers(process.pid)
        self.stop_report = report
        if report["forced"] or survivors or report["removed_leftovers"]:
            log.warning("%s did not stop cleanly: %s", self.name, report)
        return report

    def _remove_leftovers(self, pid: int) -> list[str]:
        removed = []
        patterns = [os.path.join(SHM_DIR, f"{SEGMENT_PREFIX}{pid}-*"),
                    os.path.join(tempfile.gettempdir(), f"{RUNTIME_PREFIX}{pid}-*")]
        for pattern in patterns:
            for path in glob.glob(pattern):
                if os.path.isdir(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
                removed.append(path)
        if self.kind == "peer" and os.path.isdir(SHM_DIR):
            # Peers' own /dev/shm files are only reported, never removed: the machine is shared, and a
            # name that appeared meanwhile may belong to someone else.
            new = sorted(n for n in set(os.listdir(SHM_DIR)) - self._shm_before if not n.startswith(SEGMENT_PREFIX))
            if new:
                log.warning("%s: /dev/shm entries appeared while it ran (not removed): %s", self.name, new)
        return removed


# -- the three kinds --------------------------------------------------------------------------
def ringserve_service(name: str, repo: Path, models: Sequence[str], *, log_dir: Path, workers: int = 1,
                      intra_op_threads: int = 1, extra_args: Sequence[str] = (), description: str = "",
                      source: Path | None = None, cpu_only: bool = True, grpc_port: int = 0) -> Service:
    """ringserve serving `repo`; `source`: run the code of that checkout instead (bench --baseline);
    cpu_only=False lets the worker take the CUDA provider where it loads (bench scaling --providers cuda).
    gRPC is off (grpc_port 0) unless asked for: servers side by side would all want 8001. (A --baseline
    checkout gets --grpc-port only when asked for a port: revisions before gRPC lack the flag.)"""
    port = free_port()
    program, env = ringserve_command(), None
    grpc = ["--grpc-port", str(grpc_port)]
    if source is not None:
        program, env = checkout_command(source)
        grpc = grpc if grpc_port else []
    command = [*program, "serve", "--model-repository", str(repo), "--host", "127.0.0.1",
               "--port", str(port), "--workers", str(workers), "--intra-op-threads", str(intra_op_threads),
               *(["--cpu-only"] if cpu_only else []), *grpc, *extra_args]
    probe = Probe(get_paths=("/v2/health/ready", *(f"/v2/models/{m}/ready" for m in models)))
    return Service(name, "ringserve", command, port=port, log_dir=log_dir, probe=probe, cwd=source, env=env,
                   infer_path=f"/v2/models/{models[0]}/infer", metrics_path="/metrics", description=description)


def checkout_command(source: Path) -> tuple[list[str], dict[str, str]]:
    """How to run the server code of another checkout (bench --baseline), and its environment.

    Since the one `ringserve` import root, a checkout is the package itself: a folder holding a
    `ringserve` link to it goes first on PYTHONPATH, ahead of this installation. Before it, the
    modules were top-level and `-m` put the checkout (the working directory) first.
    """
    if 'ringserve = "."' in (source / "pyproject.toml").read_text():
        root = source.parent / f"{source.name}-import-root"
        root.mkdir(exist_ok=True)
        link = root / "ringserve"
        if not link.is_symlink():
            link.symlink_to(source.resolve(), target_is_directory=True)
        return [sys.executable, "-P", "-m", "ringserve.cli"], {"PYTHONPATH": str(root)}
    return [sys.executable, "-m", "cli"], {"PYTHONPATH": str(source)}


def uvicorn_service(name: str, app: str, *, log_dir: Path, body: bytes, model: str = "mlp",
                    python: str = sys.executable, description: str = "", send_once: bool = False) -> Service:
    """An ASGI app under uvicorn with ringserve's gateway settings (uvloop, httptools, no access log).

    send_once: under the gateway's own HTTP protocol (bench/ceilings/send_once.py) instead of plain uvicorn.
    """
    port = free_port()
    command = [python, "-m", "uvicorn", app, "--host", "127.0.0.1", "--port", str(port), "--loop", "uvloop",
               "--http", "httptools", "--no-access-log", "--log-level", "warning", "--workers", "1"]
    if send_once:
        command = [python, "-m", "bench.ceilings.send_once", app, "--host", "127.0.0.1", "--port", str(port)]
    infer_path = f"/v2/models/{model}/infer"
    probe = Probe(post_path=infer_path, post_body=body)
    root = Path(__file__).resolve().parent.parent
    return Service(name, "ceiling", command, port=port, log_dir=log_dir, probe=probe, infer_path=infer_path,
                   cwd=root, env={"PYTHONPATH": str(root)}, description=description)
