"""supervision/spares.py inside the supervisor: when a spare starts, takes over, dies and is counted.

Processes here are stand-ins (a sleeping or line-echoing Python); the real spare is in
tests/chaos/test_warm_spare.py.
"""
from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from ringserve.common import messages, supervisor_messages
from ringserve.common.settings import Settings
from ringserve.supervision.children import Child
from ringserve.supervision.spares import SPARE_SILENCE_S, Spares

from .test_supervisor_messages import Wired

SLEEP = "import time; time.sleep(60)"
ECHO_ONE_LINE = "import sys; sys.stdout.buffer.write(sys.stdin.buffer.readline())"


@pytest.fixture
def wired(tmp_path) -> Iterator[Wired]:
    wired = Wired(str(tmp_path))
    try:
        yield wired
    finally:
        wired.close()
        for process in wired.processes:
            for pipe in (process.stdin, process.stdout):
                if pipe is not None:
                    pipe.close()


def spare(wired: Wired, device: int = 0, code: str = SLEEP, primed: bool = True) -> Child:
    """A stand-in spare of `device`, as Spares.start_due records it."""
    process = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    wired.processes.append(process)
    now = time.monotonic()
    child = Child("spare", device, 1, process, started_at=now, last_heartbeat=now)
    wired.supervisor.children.add(child)
    wired.supervisor.spares.groups[device].child = child
    if primed:
        wired.beat(supervisor_messages.SpareHeartbeat(device=device, pid=process.pid, primed=True))
    return child


def started_spares(wired: Wired, monkeypatch) -> list[list[str]]:
    """Record the spare processes Spares.start_due would start (their command lines)."""
    calls: list[list[str]] = []

    def start(role, index, generation, args, pass_fds=(), stdin=None):
        calls.append(args)
        return spare(wired, index, primed=False)

    monkeypatch.setattr(wired.supervisor.children, "start", start)
    return calls


def test_a_worker_gets_the_spare_of_its_device_and_its_takeover_after_worker_started(wired):
    taker = spare(wired, code=ECHO_ONE_LINE)
    wired.supervisor.workers.records[1].generation = 4
    wired.supervisor.quarantine.loading["crashy"] = "it crashed the worker 3 times while loading"

    child = wired.supervisor.workers.spawn(1)

    assert child is taker and (child.role, child.index, child.generation) == ("worker", 1, 5)
    # Silent from its TakeOver to its own first heartbeat: a fresh worker's start timeout, from now.
    assert not child.heard and not child.ready and child.last_heartbeat >= child.started_at
    assert wired.received() == [supervisor_messages.WorkerStarted(worker_index=1, pid=taker.process.pid, generation=5)]
    line = taker.process.stdout.readline()
    assert messages.decode_line(line) == supervisor_messages.TakeOver(worker_index=1, generation=5, skip_models=["crashy"])
    assert wired.supervisor.spares.groups[0].child is None and wired.supervisor.spares.groups[0].takeovers == 1


def test_without_a_live_spare_a_worker_starts_fresh(wired, monkeypatch):
    dead = spare(wired)
    dead.process.kill()
    dead.process.wait(5)
    fresh = []
    monkeypatch.setattr(wired.supervisor.children, "start", lambda *args, **kw: fresh.append(args) or dead)

    wired.supervisor.workers.spawn(0)

    assert fresh and fresh[0][0] == "worker" and "--spare-device" not in fresh[0][3]
    assert wired.supervisor.spares.groups[0].takeovers == 0


def test_the_next_spare_waits_until_no_worker_of_its_device_is_starting(wired, monkeypatch):
    calls = started_spares(wired, monkeypatch)
    loading = wired.worker(0, 2)

    wired.supervisor.spares.start_due(wired.supervisor.workers.starting_devices())
    assert calls == []  # worker 0 is still loading its models

    wired.beat(supervisor_messages.Heartbeat(worker_index=0, generation=2, pid=loading.process.pid, ready=True))
    wired.supervisor.spares.start_due(wired.supervisor.workers.starting_devices())

    assert len(calls) == 1 and calls[0][-2:] == ["--spare-device", "0"]


def test_a_spare_that_dies_is_counted_apart_and_started_again_with_backoff(wired, monkeypatch):
    first = spare(wired)
    first.process.kill()
    first.process.wait(5)

    wired.supervisor.reap_children()

    spares = wired.supervisor.spares
    assert spares.infos() == (supervisor_messages.SpareInfo(device=0, pid=0, state="none", deaths={"SIGKILL": 1}),)
    assert wired.supervisor.workers.restarts_by_reason() == {}  # no worker restarted
    assert wired.received() == []  # and the gateways hear of no worker death
    for _ in range(3):  # three in a row start again at once (the workers' backoff), the fourth waits
        child = spare(wired, primed=False)
        child.process.kill()
        child.process.wait(5)
        wired.supervisor.reap_children()
    calls = started_spares(wired, monkeypatch)
    spares.start_due(set())
    assert calls == [] and spares.groups[0].record.restart_at > time.monotonic()
    assert spares.infos()[0].deaths == {"SIGKILL": 4}


def test_a_silent_spare_is_passed_over_killed_and_a_worker_starts_fresh(wired, monkeypatch):
    stopped = spare(wired)
    stopped.last_heartbeat -= SPARE_SILENCE_S + 0.1
    fresh = []
    monkeypatch.setattr(wired.supervisor.children, "start", lambda *args, **kw: fresh.append(args) or stopped)

    wired.supervisor.workers.spawn(0)

    assert fresh and fresh[0][0] == "worker" and "--spare-device" not in fresh[0][3]
    assert stopped.kill_reason == "hung" and stopped.process.wait(5) < 0
    assert wired.supervisor.spares.groups[0].takeovers == 0


def test_a_spare_that_stops_beating_is_killed_as_hung(wired):
    wired.supervisor.settings = wired.supervisor.spares.settings = Settings(model_repository="/m", hang_timeout_s=0.1)
    stuck = spare(wired)
    stuck.last_heartbeat -= 1.0

    wired.supervisor.spares.murder_hung()
    stuck.process.wait(5)
    wired.supervisor.reap_children()

    assert wired.supervisor.spares.infos()[0].deaths == {"hung": 1}


def test_a_spare_per_device_and_none_when_off():
    devices = Spares(Settings(model_repository="/m", workers=4, gpus=(0, 1)), children=None).groups
    off = Spares(Settings(model_repository="/m", workers=4, warm_spare=False), children=None).groups
    cpu = Spares(Settings(model_repository="/m", workers=4, gpus=(0, 1), cpu_only=True), children=None).groups

    assert sorted(devices) == [0, 1] and off == {} and sorted(cpu) == [0]


def test_the_stop_sigterms_the_spare_and_does_not_count_it(wired):
    child = spare(wired)

    wired.supervisor.spares.stop_all()
    assert child.process.wait(5) == -signal.SIGTERM
    wired.supervisor.reap_children()

    assert wired.supervisor.spares.infos()[0].deaths == {}
