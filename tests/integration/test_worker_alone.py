"""One real worker process, with the gateway and the supervisor played by sockets in the test.

Everything the worker sends is read back with messages.decode, and everything it is sent is
built with messages.encode: no gateway is needed, so this pins the worker's side of the wire.
"""
from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import zmq

from ringserve.common import messages, supervisor_messages, wire
from ringserve.common.settings import Settings
from ringserve.shm.segment import Segment

from tests.support.lifecycle_models import WIDTH, build_corrupt, build_versioned
from ..unit.conftest import make_segment

pytestmark = pytest.mark.integration

INPUT = wire.TensorRef("x", "FP32", (3, WIDTH), 0)
OUTPUT_OFFSET = 4096
SLOT, SLOT_GENERATION = 0, 5


class Peers:
    """The worker's peers: gateway 0's ROUTER on dispatch-0.sock, the supervisor's PULL on heartbeat.sock."""

    def __init__(self, runtime_dir: Path, segment: Segment) -> None:
        self.runtime_dir, self.segment = runtime_dir, segment
        self.process: subprocess.Popen | None = None
        self.peaks: list[messages.ModelStateReport] = []
        self.context = zmq.Context()
        self.router = self.context.socket(zmq.ROUTER)
        self.router.bind(wire.gateway_endpoint(str(runtime_dir), "dispatch", 0))
        self.heartbeats = self.context.socket(zmq.PULL)
        self.heartbeats.bind(wire.endpoint(str(runtime_dir), "heartbeat"))

    def start_worker(self, repo: Path) -> None:
        settings = self.runtime_dir / "settings.json"
        Settings(model_repository=str(repo), runtime_dir=str(self.runtime_dir), cpu_only=True,
                 gateways=1).write(settings)
        self.process = subprocess.Popen([
            sys.executable, "-P", "-m", "ringserve.worker", "--settings", str(settings),
            "--index", "0", "--generation", "1", "--parent-pid", str(os.getpid())])

    def ready(self) -> tuple[bytes, messages.Message]:
        """The worker's Ready, answered as a gateway does: Attach, naming the ring."""
        identity, ready = self.receive()
        self.send(identity, messages.Attach(gateway_index=0, segment=self.segment.name))
        return identity, ready

    def send(self, identity: bytes, message: messages.Message) -> None:
        self.router.send_multipart([identity, *message.encode()])

    def receive(self, timeout_s: float = 30) -> tuple[bytes, messages.Message]:
        assert self.router.poll(int(timeout_s * 1000)), "the worker sent nothing"
        identity, *frames = self.router.recv_multipart()
        return identity, messages.decode(frames)

    def reply(self, timeout_s: float = 30) -> messages.Message:
        """The next Result or Error. A ModelState saying a version reached a new peak of references
        (sent when a batch first holds it) may come before it: it is kept in `peaks`."""
        while True:
            _, message = self.receive(timeout_s)
            if not (isinstance(message, messages.ModelState) and message.cause == "peak"):
                return message
            self.peaks.append(message.report)

    def heartbeat(self, timeout_s: float = 30) -> messages.Message:
        assert self.heartbeats.poll(int(timeout_s * 1000)), "no heartbeat"
        return messages.decode(self.heartbeats.recv_multipart())

    def batch(self, batch_id: int, model: str, version: int = 1, generation: int = SLOT_GENERATION) -> messages.Batch:
        return messages.Batch(batch_id=batch_id, model=model, version=version, attempt=0, slot_index=SLOT,
                              generation=generation, inputs=[INPUT.to_wire()], output_offset=OUTPUT_OFFSET)

    def close(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
        self.context.destroy(linger=0)


@pytest.fixture
def peers(tmp_path: Path) -> Iterator[Peers]:
    repo = tmp_path / "models"
    build_versioned(repo, "m", (1, 2), weight_bytes=4096, version_policy={"all": {}})
    build_versioned(repo, "lazy", weight_bytes=4096, model_load_policy="lazy")
    build_corrupt(repo, "broken")
    with make_segment(slot_count=1, slot_bytes=1 << 16) as segment:
        segment.set_generation(SLOT, SLOT_GENERATION)
        segment.tensor(SLOT, INPUT.offset, np.float32, INPUT.shape)[:] = 1.0
        peers = Peers(tmp_path, segment)
        try:
            peers.start_worker(repo)
            yield peers
        finally:
            peers.close()


def test_the_worker_beats_then_says_ready_with_the_state_of_every_version(peers):
    beat = peers.heartbeat()
    identity, ready = peers.ready()

    assert beat == supervisor_messages.Heartbeat(worker_index=0, generation=1, pid=peers.process.pid, batches=0)
    assert identity == wire.worker_identity(0, 1) and isinstance(ready, messages.Ready)
    assert ready.models == {"m": "CPUExecutionProvider", "m/1": "CPUExecutionProvider", "lazy": None}
    assert list(ready.failed_models) == ["broken"] and "INVALID_PROTOBUF" in ready.failed_models["broken"]
    assert {s.key: s.state for s in ready.model_states} == {
        "m": "ready", "m/1": "ready", "lazy": "unloaded", "broken": "failed"}


def test_a_batch_gets_its_result_and_one_that_never_ran_says_why(peers):
    peers.ready()
    worker = wire.worker_identity(0, 1)

    peers.send(worker, peers.batch(11, "m", version=2))
    result = peers.reply()
    assert isinstance(result, messages.Result) and (result.batch_id, result.attempt) == (11, 0)
    (ref,) = [wire.TensorRef.from_wire(item) for item in result.outputs]
    assert peers.segment.tensor(SLOT, ref.offset, np.float32, ref.shape).ravel().tolist() == [6.0] * 3  # 4 + 2

    errors = {}
    for batch in (peers.batch(12, "nope"), peers.batch(13, "broken"), peers.batch(14, "m", generation=4)):
        peers.send(worker, batch)
        error = peers.reply()
        assert isinstance(error, messages.Error) and error.batch_id == batch.batch_id
        errors[batch.model if batch.generation == SLOT_GENERATION else "stale"] = error.kind
    assert errors == {"nope": "not_served", "broken": "load_failed", "stale": None}  # a stale slot did run
    assert [(r.key, r.version, r.peak_refs) for r in peers.peaks] == [("m", 2, 1)]  # only batch 11 held a model


def test_loads_and_unloads_on_the_loader_socket_come_back_as_model_states(peers):
    peers.ready()
    loader = wire.control_identity(0, 1)

    peers.send(loader, messages.Load(model="lazy", version=1, cause="api"))
    peers.send(loader, messages.Unload(model="lazy", version=1))
    changes = [peers.receive() for _ in range(4)]

    assert {identity for identity, _ in changes} == {loader}
    assert [(m.report.key, m.report.state, m.cause, m.loaded) for _, m in changes] == [
        ("lazy", "loading", "api", False), ("lazy", "ready", "api", True),
        ("lazy", "unloading", "api", False), ("lazy", "unloaded", "api", False)]
    assert [m.report.seq for _, m in changes] == [1, 2, 3, 4]


def test_heartbeats_count_the_batches_done_and_sigterm_stops_the_worker_cleanly(peers):
    peers.ready()
    for batch_id in range(3):
        peers.send(wire.worker_identity(0, 1), peers.batch(batch_id, "m"))
        assert isinstance(peers.reply(), messages.Result)

    beat = peers.heartbeat()
    while beat.batches < 3:  # heartbeats sent before the batches are still queued
        beat = peers.heartbeat()
    peers.process.terminate()

    assert beat.batches == 3 and peers.process.wait(15) == 0
