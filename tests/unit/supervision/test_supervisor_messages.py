"""supervisor.py's messages: heartbeats and control in, events out, each a messages.* dataclass."""
from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import zmq

from ringserve.common import messages, supervisor_messages
from ringserve.common.exits import REASON_RETIRED
from ringserve.common.settings import Settings
from ringserve.supervision.children import Child
from ringserve.supervisor import Supervisor


class Wired:
    """A Supervisor that was never set up (no rings, no sockets of its own) on inproc sockets, with the
    other ends: a worker's heartbeat PUSH, the gateways' control PUSH and each gateway's events PULL."""

    def __init__(self, runtime_dir: str, gateways: int = 1) -> None:
        self.context = zmq.Context()
        self.supervisor = Supervisor(Settings(model_repository="/m", workers=2, gateways=gateways))
        self.supervisor.children.runtime_dir = runtime_dir
        self.supervisor.children.settings_path = f"{runtime_dir}/settings.json"
        self.supervisor.heartbeats, self.heartbeats = self._pair(zmq.PULL, zmq.PUSH, "heartbeat")
        self.supervisor.control, self.control = self._pair(zmq.PULL, zmq.PUSH, "control")
        self.events_of: list[zmq.Socket] = []  # gateway k's events PULL
        for k in range(gateways):
            pull, push = self._pair(zmq.PULL, zmq.PUSH, f"events-{k}")
            self.events_of.append(pull)
            self.supervisor.events.sockets.append(push)
        self.events = self.events_of[0]
        self.processes: list[subprocess.Popen] = []

    def _pair(self, bound: int, connected: int, name: str) -> tuple[zmq.Socket, zmq.Socket]:
        first, second = self.context.socket(bound), self.context.socket(connected)
        first.bind(f"inproc://{name}")
        second.connect(f"inproc://{name}")
        return first, second

    def worker(self, index: int, generation: int, code: str = "import time; time.sleep(60)") -> Child:
        process = subprocess.Popen([sys.executable, "-c", code])
        self.processes.append(process)
        now = time.monotonic()
        child = Child("worker", index, generation, process, started_at=now, last_heartbeat=now)
        self.supervisor.children.add(child)
        return child

    def gateway(self, index: int, generation: int = 0) -> Child:
        process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        self.processes.append(process)
        now = time.monotonic()
        child = Child("gateway", index, generation, process, started_at=now, last_heartbeat=now)
        self.supervisor.children.add(child)
        return child

    def beat(self, *sent: messages.Message | list[bytes]) -> None:
        """Heartbeats (or raw frames) from workers, then the supervisor reads them."""
        self._send(self.heartbeats, sent)
        self.supervisor._read_heartbeats()

    def tell(self, *sent: messages.Message) -> None:
        """Control messages from the gateway, then the supervisor reads them."""
        self._send(self.control, sent)
        self.supervisor._read_control()

    @staticmethod
    def _send(sock: zmq.Socket, sent: tuple[messages.Message | list[bytes], ...]) -> None:
        for message in sent:  # inproc: readable on the other end once sent
            sock.send_multipart(message if isinstance(message, list) else message.encode())

    def received(self, gateway: int = 0) -> list[messages.Message]:
        found = []
        events = self.events_of[gateway]
        while events.poll(100):
            found.append(messages.decode(events.recv_multipart()))
        return found

    def close(self) -> None:
        for process in self.processes:
            process.kill()
            process.wait()
        self.context.destroy(linger=0)


@pytest.fixture
def wired(tmp_path) -> Iterator[Wired]:
    wired = Wired(str(tmp_path))
    try:
        yield wired
    finally:
        wired.close()


def test_a_heartbeat_marks_its_worker_heard_with_its_batch_count(wired):
    old, successor = wired.worker(0, 1), wired.worker(0, 2)

    wired.beat(supervisor_messages.Heartbeat(worker_index=0, generation=2, pid=successor.process.pid, batches=7))

    assert successor.heard and successor.batches_done == 7
    assert not old.heard and old.batches_done == 0


def test_a_malformed_message_is_dropped_and_the_ones_after_it_are_read(wired, caplog):
    child = wired.worker(1, 3)

    with caplog.at_level(logging.ERROR, logger="ringserve.supervision.events"):
        wired.beat([messages.PROTOCOL_VERSION, b"HEARTBEAT", b'{"worker_index": 1}'],
                   supervisor_messages.Heartbeat(worker_index=1, generation=3, pid=child.process.pid))

    assert child.heard
    assert "dropped a malformed message: HEARTBEAT body does not match its fields" in caplog.text


def test_control_messages_kill_retire_and_lift_a_quarantine(wired, monkeypatch):
    hung, old, successor = wired.worker(0, 1), wired.worker(1, 1), wired.worker(1, 2)
    replaced = []
    monkeypatch.setattr(wired.supervisor.workers, "recycle", lambda child, reason: replaced.append((child, reason)))
    old.successor, successor.replaces, old.retire_votes = successor, 1, {0: 0}  # as Workers.recycle links them
    wired.supervisor.quarantine.loading["m"] = "it crashed the worker 3 times"

    wired.tell(supervisor_messages.KillWorker(worker_index=0, generation=1, reason="batch_timeout"),
               supervisor_messages.KillWorker(worker_index=0, generation=9, reason="batch_timeout"),  # gone already: ignored
               supervisor_messages.WorkerRetired(worker_index=1, generation=1),
               supervisor_messages.Unquarantine(model="m"))

    assert hung.kill_reason == "batch_timeout" and hung.process.wait(5) == -signal.SIGKILL
    assert old.kill_reason == REASON_RETIRED and old.process.wait(5) == -signal.SIGTERM
    assert wired.supervisor.quarantine.loading == {}
    assert wired.received() == [supervisor_messages.ModelUnquarantined(model="m")]
    assert replaced == [(successor, "reload")]  # it serves now, and loads the model again in its successor


def test_a_replacement_is_announced_with_the_generation_it_replaces_and_why(wired, monkeypatch):
    old = wired.worker(0, 1)
    wired.supervisor.workers.records[0].generation = 1
    wired.supervisor.segment = SimpleNamespace(name="ringserve-test-segment")
    spare = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    wired.processes.append(spare)
    monkeypatch.setattr("ringserve.supervision.children.subprocess.Popen", lambda args, **kwargs: spare)

    wired.supervisor.workers.recycle(old, "recycled")

    assert wired.received() == [supervisor_messages.WorkerStarted(worker_index=0, pid=spare.pid, generation=2,
                                                       restarts={"recycled": 1}, replaces=1, reason="recycled")]


def test_a_worker_exit_is_sent_and_kept_as_the_last_exit_in_the_next_snapshot(wired, tmp_path):
    child = wired.worker(1, 4, code="import os, signal; os.kill(os.getpid(), signal.SIGTERM)")
    (tmp_path / "loading-w1.g4").write_text("mlp/2")  # it died loading this version
    child.process.wait(10)

    wired.supervisor.reap_children()
    wired.supervisor._send_snapshot()

    exited, snapshot = wired.received()
    assert exited == supervisor_messages.WorkerExited(worker_index=1, pid=child.process.pid, generation=4, reason="SIGTERM",
                                           at=exited.at, restarts={"SIGTERM": 1}, loading_model="mlp/2")
    assert wired.supervisor.workers.records[1].last_exit == exited.last_exit
    assert isinstance(snapshot, supervisor_messages.Snapshot)
    assert [(w.worker_index, w.last_exit) for w in snapshot.workers] == [(0, None), (1, exited.last_exit)]


def test_a_successor_the_gateway_refused_is_stopped_and_its_old_generation_serves_on(wired):
    old, successor = wired.worker(0, 1), wired.worker(0, 2)
    old.successor, successor.replaces = successor, 1  # as Workers.recycle links them

    wired.tell(supervisor_messages.WorkerRetired(worker_index=0, generation=2))  # it failed a model generation 1 serves

    assert successor.kill_reason == REASON_RETIRED and successor.process.wait(5) == -signal.SIGTERM
    assert old.kill_reason is None and old.successor is None  # no reload pending: a SIGHUP may try again
    assert wired.supervisor.workers.serving() == [old]


def test_a_repository_load_of_a_fixed_model_replaces_every_serving_worker(wired, monkeypatch):
    first, second = wired.worker(0, 1), wired.worker(1, 1)
    replaced = []
    monkeypatch.setattr(wired.supervisor.workers, "recycle", lambda child, reason: replaced.append((child, reason)))

    wired.tell(supervisor_messages.ReloadWorkers(model="late"))

    assert replaced == [(first, "reload"), (second, "reload")]


# -- several gateways -----------------------------------------------------------------------------
@pytest.fixture
def wired2(tmp_path) -> Iterator[Wired]:
    wired = Wired(str(tmp_path), gateways=2)
    try:
        yield wired
    finally:
        wired.close()


def replacing(wired: Wired, old: Child, monkeypatch) -> Child:
    """Start old's successor as Workers.recycle does (its process: a sleeper)."""
    spare = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    wired.processes.append(spare)
    monkeypatch.setattr("ringserve.supervision.children.subprocess.Popen", lambda args, **kwargs: spare)
    wired.supervisor.workers.records[old.index].generation = old.generation
    wired.supervisor.workers.recycle(old, "reload")
    return old.successor


def test_every_event_goes_to_every_gateway(wired2):
    wired2.supervisor.events.send(supervisor_messages.ModelQuarantined(model="m", reason="why"))
    wired2.supervisor.events.send(supervisor_messages.Reload(model_repository="/m"))

    for k in (0, 1):
        assert wired2.received(k) == [supervisor_messages.ModelQuarantined(model="m", reason="why"),
                                      supervisor_messages.Reload(model_repository="/m")]


def test_a_repository_change_goes_on_to_every_other_gateway(wired2):
    change = supervisor_messages.RepositoryChanged(model="m", action="unload", gateway_index=1)
    wired2.tell(change)

    assert wired2.received(0) == [change]
    assert wired2.received(1) == []  # the gateway that carried it out applied it already


def test_an_old_generation_is_stopped_only_once_every_gateway_retired_it(wired2, monkeypatch):
    wired2.gateway(0), wired2.gateway(1)
    old = wired2.worker(0, 1)
    successor = replacing(wired2, old, monkeypatch)
    assert old.retire_votes == {0: 0, 1: 0}

    wired2.tell(supervisor_messages.WorkerRetired(worker_index=0, generation=1, gateway_index=1))
    assert old.kill_reason is None and old.successor is successor  # gateway 0 still sends it batches

    wired2.tell(supervisor_messages.WorkerRetired(worker_index=0, generation=1, gateway_index=0))
    assert old.kill_reason == REASON_RETIRED and old.process.wait(5) == -signal.SIGTERM
    assert successor.replaces is None and wired2.supervisor.workers.serving() == [successor]


def test_a_gateway_that_dies_during_a_replacement_counts_as_having_retired_the_old_generation(wired2, monkeypatch):
    first, second = wired2.gateway(0), wired2.gateway(1)
    old = wired2.worker(0, 1)
    replacing(wired2, old, monkeypatch)
    wired2.tell(supervisor_messages.WorkerRetired(worker_index=0, generation=1, gateway_index=0))
    assert old.kill_reason is None

    second.process.kill()
    second.process.wait(5)
    wired2.supervisor.reap_children()

    assert old.kill_reason == REASON_RETIRED
    assert first.process.poll() is None


def test_a_stale_worker_retired_for_a_serving_worker_is_ignored(wired2, caplog):
    serving = wired2.worker(0, 3)

    with caplog.at_level(logging.WARNING, logger="ringserve.supervision.workers"):
        wired2.tell(supervisor_messages.WorkerRetired(worker_index=0, generation=3, gateway_index=1))

    assert serving.kill_reason is None and serving.process.poll() is None
    assert "gateway 1 retired worker 0 generation 3, which no replacement involves; ignored" in caplog.text


def test_a_gateways_death_restarts_that_gateway_alone_and_never_a_worker(wired2):
    first, second = wired2.gateway(0), wired2.gateway(1, generation=4)
    worker = wired2.worker(0, 1)

    second.process.kill()
    second.process.wait(5)
    wired2.supervisor.reap_children()

    assert worker.kill_reason is None and worker.process.poll() is None
    records = wired2.supervisor.gateways.records
    assert records[1].restarts == {"SIGKILL": 1} and records[1].restart_at is not None
    assert records[1].last_exit.pid == second.process.pid and records[1].last_exit.generation == 4
    assert records[0].restarts == {} and records[0].restart_at is None
    assert first.process.poll() is None and not wired2.supervisor.stopping


def test_one_gateway_index_in_a_crash_loop_stops_the_server(wired2, caplog):
    from ringserve.common.exits import EXIT_GATEWAY_CRASH_LOOP

    wired2.gateway(0)
    with caplog.at_level(logging.CRITICAL, logger="ringserve.supervision.gateways"):
        for generation in range(5):
            child = wired2.gateway(1, generation)
            child.process.kill()
            child.process.wait(5)
            wired2.supervisor.reap_children()

    assert wired2.supervisor.exit_code == EXIT_GATEWAY_CRASH_LOOP and wired2.supervisor.stopping
    assert "gateway 1 died 5 times in a row, each within 10 s of its start (last: SIGKILL)" in caplog.text


def test_the_snapshot_has_one_entry_per_gateway_index_up_or_restarting(wired2):
    up = wired2.gateway(0)
    wired2.supervisor.gateways.records[1].restarts = {"SIGKILL": 2}

    wired2.supervisor._send_snapshot()

    (snapshot,) = wired2.received(1)
    assert [(g.gateway_index, g.pid, g.restarts) for g in snapshot.gateways] == [(0, up.process.pid, {}),
                                                                           (1, 0, {"SIGKILL": 2})]


def test_a_gateways_poison_quarantine_becomes_the_servers_and_a_load_lifts_it_without_replacing_workers(
        wired2, monkeypatch):
    wired2.worker(0, 1)
    replaced = []
    monkeypatch.setattr(wired2.supervisor.workers, "recycle", lambda child, reason: replaced.append(child))

    wired2.tell(supervisor_messages.QuarantineModel(model="m", reason="3 of its requests crashed the worker"),
                supervisor_messages.QuarantineModel(model="m", reason="again, from the other gateway"))

    quarantined = supervisor_messages.ModelQuarantined(model="m", reason="3 of its requests crashed the worker")
    assert wired2.received(0) == [quarantined] and wired2.received(1) == [quarantined]
    assert wired2.supervisor.quarantine.loading == {}  # workers still load it: it crashed them at inference, not load
    wired2.supervisor._send_snapshot()
    assert wired2.received(1)[0].quarantined == {"m": "3 of its requests crashed the worker"}  # a new gateway learns it

    wired2.tell(supervisor_messages.Unquarantine(model="m"))

    assert wired2.received(0)[-1] == supervisor_messages.ModelUnquarantined(model="m")  # (after the snapshot)
    assert wired2.received(1) == [supervisor_messages.ModelUnquarantined(model="m")]
    assert replaced == []


def test_poison_requests_isolated_by_different_gateways_add_up_to_the_quarantine(wired2):
    for gateway_reason in ("SIGSEGV", "SIGABRT"):  # through gateway 0, then gateway 1: 2 of the 3
        wired2.tell(supervisor_messages.QuarantineModel(model="m", reason=gateway_reason, poison_request=True))
    assert wired2.received(0) == [] and wired2.supervisor.quarantine.poisoned == {}

    wired2.tell(supervisor_messages.QuarantineModel(model="m", reason="SIGSEGV", poison_request=True))

    why = ("3 of its requests crashed the worker on their own within 60 s (last: SIGSEGV); restart the server "
           "or load it again to retry it")
    assert wired2.received(0) == wired2.received(1) == [supervisor_messages.ModelQuarantined(model="m", reason=why)]


def test_a_worker_whose_call_into_model_code_is_past_its_bound_is_killed_with_the_hooks_reason(wired):
    looping, busy = wired.worker(0, 1), wired.worker(1, 1)
    now = time.monotonic()
    wired.beat(supervisor_messages.Heartbeat(worker_index=0, generation=1, pid=looping.process.pid,
                                             calls=(("execute", "m", now - 2.0, 1.5),)),
               supervisor_messages.Heartbeat(worker_index=1, generation=1, pid=busy.process.pid,
                                             calls=(("execute", "m", now - 2.0, 10.0),  # within its bound
                                                    ("load", "n", now - 0.1, 1.0))))

    wired.supervisor.workers.murder_hung()

    assert looping.kill_reason == "execute_timeout" and looping.process.wait(5) == -signal.SIGKILL
    assert looping.kill_bound_s == 1.5
    assert busy.kill_reason is None and busy.process.poll() is None
