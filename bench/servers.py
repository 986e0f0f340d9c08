"""Model repositories for the benchmark cases, and a ringserve started and stopped around them.

The server runs as a subprocess (its own session), so the load generator and the server
never share a process. Stopping is SIGTERM and a wait: the supervisor drains the gateway,
stops the workers and removes its shared memory. Only if that does not finish in time are
the supervisor and its direct children killed by pid and their leftovers removed.
"""
from __future__ import annotations

import contextlib
import copy
import ctypes
import glob
import json
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
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

SHM_DIR = "/dev/shm"
SEGMENT_PREFIX = "ringserve-"  # shm.segment.SEGMENT_PREFIX; names are ringserve-<supervisor pid>-<role>
RUNTIME_PREFIX = "ringserve-"  # supervisor's runtime dir: <tmp>/ringserve-<supervisor pid>-XXXX
_PR_SET_PDEATHSIG = 1


# -- model repositories ---------------------------------------------------------------------
def unbatched_config(config: dict[str, Any]) -> dict[str, Any]:
    """A copy of a Triton-style config with max_batch_size 1 and no dynamic_batching section."""
    doc = copy.deepcopy(config)
    doc["max_batch_size"] = 1
    doc.pop("dynamic_batching", None)
    return doc


def rewrite_config_unbatched(model_dir: Path) -> dict[str, Any]:
    """Rewrite `<model_dir>/config.json` in place with unbatched_config(); returns the new doc."""
    path = Path(model_dir) / "config.json"
    doc = unbatched_config(json.loads(path.read_text()))
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return doc


def build_case_repositories(root: Path, model: str = "mlp") -> dict[str, Path]:
    """Write the demo models once, then one single-model repository per case under `root`.

    Returns {"batched": repo, "unbatched": repo}; the batched one keeps the demo config
    (max_batch_size 64, dynamic_batching), the unbatched one has max_batch_size 1.
    """
    from common.demo_models import build_demo_models

    root = Path(root)
    demo = root / "demo"
    build_demo_models(demo)
    repos = {"batched": root / "repo-batched", "unbatched": root / "repo-unbatched"}
    for repo in repos.values():
        repo.mkdir(parents=True, exist_ok=True)
        shutil.copytree(demo / model, repo / model)
    rewrite_config_unbatched(repos["unbatched"] / model)
    return repos


# -- the server -------------------------------------------------------------------------------
def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def ringserve_command() -> list[str]:
    """The `ringserve` entry point next to this interpreter, else the cli module run directly."""
    script = Path(sys.executable).parent / "ringserve"
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-c", "import sys, cli; sys.exit(cli.main())"]


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


class Server:
    """One `ringserve serve` subprocess; use as a context manager or call start()/stop()."""

    def __init__(self, repo: Path, *, name: str, log_dir: Path, host: str = "127.0.0.1", port: int | None = None,
                 workers: int = 1, intra_op_threads: int = 1, extra_args: tuple[str, ...] = ()) -> None:
        self.repo = Path(repo)
        self.name = name
        self.host = host
        self.port = port or free_port(host)
        self.log_path = Path(log_dir) / f"server-{name}.log"
        self.args = [*ringserve_command(), "serve", "--model-repository", str(self.repo), "--host", host,
                     "--port", str(self.port), "--workers", str(workers),
                     "--intra-op-threads", str(intra_op_threads), *extra_args]
        self.process: subprocess.Popen | None = None
        self._children: set[int] = set()
        self.stop_report: dict[str, Any] = {}

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def __enter__(self) -> Server:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self, ready_timeout_s: float = 60.0, models: tuple[str, ...] = ("mlp",)) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "wb") as log_file:
            self.process = subprocess.Popen(self.args, stdin=subprocess.DEVNULL, stdout=log_file,
                                            stderr=subprocess.STDOUT, start_new_session=True,
                                            preexec_fn=_die_with_parent_hook())
        log.info("started %s (pid %d) on %s", self.name, self.process.pid, self.url)
        try:
            self.wait_ready(ready_timeout_s, models)
        except BaseException:
            self.stop()
            raise

    def wait_ready(self, timeout_s: float, models: tuple[str, ...]) -> None:
        assert self.process is not None
        paths = ["/v2/health/ready", *(f"/v2/models/{m}/ready" for m in models)]
        deadline = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise ServerError(f"{self.name} exited with {self.process.returncode} before it was ready; "
                                  f"log tail:\n{self.log_tail()}")
            if all(self._get_status(path) == 200 for path in paths):
                self._remember_children()
                return
            if time.monotonic() > deadline:
                raise ServerError(f"{self.name} not ready after {timeout_s:.0f} s; log tail:\n{self.log_tail()}")
            time.sleep(0.2)

    def _get_status(self, path: str) -> int | None:
        try:
            with urllib.request.urlopen(self.url + path, timeout=2) as response:
                return response.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except (urllib.error.URLError, OSError):
            return None

    def _remember_children(self) -> None:
        import psutil

        if self.process is None:
            return
        with contextlib.suppress(psutil.Error):
            self._children |= {c.pid for c in psutil.Process(self.process.pid).children(recursive=True)}

    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return "(no log)"

    def log_lines(self, needle: str) -> list[str]:
        with contextlib.suppress(OSError):
            return [line for line in self.log_path.read_text(errors="replace").splitlines() if needle in line]
        return []

    def stop(self, timeout_s: float = 60.0) -> dict[str, Any]:
        """SIGTERM, wait; kill by pid and clean up only if the clean stop did not finish."""
        import psutil

        process = self.process
        if process is None or self.stop_report:
            return self.stop_report
        self._remember_children()
        report: dict[str, Any] = {"pid": process.pid, "forced": False}
        t = time.monotonic()
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout_s)
            except subprocess.TimeoutExpired:
                log.error("%s (pid %d) still running %.0f s after SIGTERM; killing it", self.name, process.pid,
                          timeout_s)
                report["forced"] = True
                process.kill()
                process.wait()
        report["returncode"] = process.returncode
        report["stop_s"] = round(time.monotonic() - t, 3)
        # The gateway and workers watch their parent; give them a moment, then kill stragglers by pid.
        survivors = []
        deadline = time.monotonic() + 10.0
        for pid in sorted(self._children):
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

    @staticmethod
    def _remove_leftovers(pid: int) -> list[str]:
        removed = []
        for path in glob.glob(os.path.join(SHM_DIR, f"{SEGMENT_PREFIX}{pid}-*")):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                removed.append(path)
        for path in glob.glob(os.path.join(tempfile.gettempdir(), f"{RUNTIME_PREFIX}{pid}-*")):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        return removed
