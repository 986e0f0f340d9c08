"""Gateway deaths: restarted with backoff like a worker; a crash loop at start-up stops the server."""
from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil
import pytest

from tests.support.stack import Stack, poll_for

pytestmark = pytest.mark.chaos

EXIT_GATEWAY_CRASH_LOOP = 4


def gateway_pid(stack: Stack) -> int | None:
    try:
        children = psutil.Process(stack.pid).children()
    except psutil.NoSuchProcess:
        return None
    for child in children:
        try:
            if "ringserve.gateway" in child.cmdline() and child.status() != psutil.STATUS_ZOMBIE:
                return child.pid
        except psutil.NoSuchProcess:
            continue
    return None


def test_a_killed_gateway_is_restarted_and_serves_again(start_stack, demo_repo: Path) -> None:
    stack = start_stack(demo_repo)
    first = gateway_pid(stack)
    os.kill(first, signal.SIGKILL)
    poll_for(lambda: gateway_pid(stack) not in (None, first), 30, what="a new gateway")
    poll_for(stack.is_ready, 60, 0.05, "the restarted gateway to be ready")
    assert stack.post("/v2/models/mlp/infer", {"inputs": [
        {"name": "x", "shape": [1, 512], "datatype": "FP32", "data": [0.5] * 512}]})[0] == 200
    # Counted where ops look: the supervisor's numbers reach the new gateway with its next snapshot.
    # (A snapshot queued while the gateway was down names no pid for it: wait for a fresh one.)
    # (The pid alone is no sign: the answering gateway puts its own in at once.)
    (gateway,) = poll_for(lambda: (g := stack.status()["gateways"]) and g[0]["pid"] == gateway_pid(stack)
                          and g[0]["last_exit"] and g, 10, what="the supervisor's snapshot")
    assert (gateway["pid"], gateway["restarts"], gateway["last_exit"]["pid"]) == (gateway_pid(stack), {"SIGKILL": 1},
                                                                                   first)
    assert stack.metric("ringserve_gateway_restarts_total", gateway="0", reason="SIGKILL") == 1
    assert stack.status()["workers"][0]["restarts_total"] == 0  # a gateway's death restarts no worker


def test_a_gateway_that_keeps_dying_at_start_stops_the_server_with_a_clear_message(
        start_stack, demo_repo: Path, capfd) -> None:
    stack = start_stack(demo_repo, "--log-level", "INFO")
    killed: list[int] = []
    while stack.process.poll() is None and len(killed) < 10:
        # Each new gateway dies moments after its start, as one that fails at import would.
        pid = poll_for(lambda: gateway_pid(stack) not in (None, *killed) and gateway_pid(stack)
                       or stack.process.poll() is not None, 30, 0.01, "the next gateway")
        if pid is True:
            break
        os.kill(pid, signal.SIGKILL)
        killed.append(pid)
    assert stack.process.wait(60) == EXIT_GATEWAY_CRASH_LOOP
    assert len(killed) == 5
    log = capfd.readouterr().err
    assert "the gateway died 5 times in a row, each within 10 s of its start (last: SIGKILL); giving up" in log
    assert "restarting it in 0.1 s" in log  # the 4th death waited: backoff as for workers
