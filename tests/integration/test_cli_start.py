"""`ringserve serve` refusing to start: a port in use, a missing repository. One message, exit code,
no traceback, and nothing started (no child process, no segment)."""
from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from ringserve.common.exits import EXIT_BOOT_ERROR, EXIT_USAGE

from tests.support.stack import Stack, free_port, shm_segments

pytestmark = pytest.mark.integration


def serve(repo: Path, port: int) -> tuple[int, str, int]:
    """Run `ringserve serve` to its end: (exit code, stderr, its pid)."""
    cmd = [sys.executable, "-P", "-m", "ringserve.cli", "serve", "--model-repository", str(repo),
           "--port", str(port), "--grpc-port", "0"]
    with subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True) as process:
        Stack.started_pids.append(process.pid)  # the session's segment check covers it
        try:
            _, err = process.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            raise
    return process.returncode, err, process.pid


def children_of(pid: int) -> list[psutil.Process]:
    """Processes started for the supervisor `pid` (each child gets --parent-pid)."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        cmdline = process.info["cmdline"] or []
        if "--parent-pid" in cmdline and cmdline[cmdline.index("--parent-pid") + 1:][:1] == [str(pid)]:
            found.append(process)
    return found


def test_a_port_in_use_is_refused_before_any_model_loads(demo_repo: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        code, err, pid = serve(demo_repo, port)
    assert code == EXIT_BOOT_ERROR, err
    assert f"cannot listen on 127.0.0.1:{port}: Address already in use" in err
    assert "Traceback" not in err and "started" not in err  # no gateway, no worker
    assert children_of(pid) == [] and shm_segments(pid) == []


def test_a_missing_repository_is_refused_before_any_process_starts(tmp_path: Path) -> None:
    code, err, pid = serve(tmp_path / "no-such-models", free_port())
    assert code == EXIT_USAGE
    assert err == f"ringserve serve: --model-repository: {tmp_path / 'no-such-models'} is not a directory\n"
    assert children_of(pid) == [] and shm_segments(pid) == []
