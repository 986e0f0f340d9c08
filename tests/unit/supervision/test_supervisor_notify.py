"""The supervisor tells its ServiceNotifier (systemd's STATUS=) about every worker it starts or reaps.

tests/unit/supervision/test_health.py checks what ServiceNotifier does with `worker_changed()` and
`tick(worker_pids=...)`; these check that the supervisor's loop calls them, in the right order
(STATUS= must never count a dead worker ready).
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator

import pytest
import zmq

from .test_supervisor_messages import Wired


class RecordingNotifier:
    """Stands in for ServiceNotifier: records what the supervisor calls, in order."""

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def worker_changed(self) -> None:
        self.calls.append(("worker_changed",))

    def tick(self, now: float, *, reload_pending: bool, workers_total: int, restarts: dict[str, int],
             worker_pids=None) -> None:
        self.calls.append(("tick", None if worker_pids is None else set(worker_pids), dict(restarts)))

    def reloading(self) -> None:
        self.calls.append(("reloading",))

    def stopping(self) -> None:
        self.calls.append(("stopping",))

    def close(self) -> None:
        pass


@pytest.fixture
def looping(tmp_path) -> Iterator[tuple[Wired, RecordingNotifier]]:
    """A wired Supervisor whose `tick()` (its loop's iteration) can run: a poller, a recording notifier."""
    wired = Wired(str(tmp_path))
    supervisor = wired.supervisor
    supervisor.poller = zmq.Poller()
    for sock in (supervisor.heartbeats, supervisor.control):
        supervisor.poller.register(sock, zmq.POLLIN)
    supervisor._wake_r = None  # no signal wakeup socket: poll's timeout ends the iteration
    supervisor.service = notifier = RecordingNotifier()
    try:
        yield wired, notifier
    finally:
        wired.close()


def sleeper(wired: Wired, notifier: RecordingNotifier, monkeypatch) -> subprocess.Popen:
    """The process the supervisor's next Popen starts (a sleeper, not a worker); the start is recorded."""
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    wired.processes.append(process)

    def popen(args, **kwargs) -> subprocess.Popen:
        notifier.calls.append(("popen",))
        return process

    monkeypatch.setattr("ringserve.supervision.children.subprocess.Popen", popen)
    return process


def test_starting_a_worker_tells_the_notifier_and_the_next_tick_counts_it(looping, monkeypatch):
    wired, notifier = looping
    started = sleeper(wired, notifier, monkeypatch)

    wired.supervisor.workers.spawn(0)
    assert notifier.calls == [("popen",), ("worker_changed",)]  # at once: the probe fetches /admin/status now

    wired.supervisor.tick()
    assert notifier.calls[2:] == [("tick", {started.pid}, {})]


def test_the_tick_that_reaps_a_worker_tells_the_notifier_first_and_no_longer_counts_it(looping, monkeypatch):
    wired, notifier = looping
    dead = wired.worker(0, 1)
    alive = wired.worker(1, 1)
    os.kill(dead.process.pid, signal.SIGKILL)
    os.waitid(os.P_PID, dead.process.pid, os.WEXITED | os.WNOWAIT)  # dead, but left for the supervisor to reap
    replacement = sleeper(wired, notifier, monkeypatch)  # if its restart is due in the same iteration

    wired.supervisor.tick()

    # Reaped: fetch the gateway's view now (before, and whether or not, a replacement starts).
    assert notifier.calls[0] == ("worker_changed",), notifier.calls
    ticks = [call for call in notifier.calls if call[0] == "tick"]
    assert len(ticks) == 1 and notifier.calls[-1] is ticks[0], notifier.calls  # after the reap, in that iteration
    _, worker_pids, restarts = ticks[0]
    assert dead.process.pid not in worker_pids
    assert alive.process.pid in worker_pids and worker_pids <= {alive.process.pid, replacement.pid}
    assert restarts == {"SIGKILL": 1}
