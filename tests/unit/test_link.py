"""gateway/dispatch/link.py over real ZeroMQ sockets in a temporary runtime dir: messages in as dataclasses, out as frames."""
from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import zmq

from ringserve.common import messages, wire
from ringserve.common.messages import Attach, Batch, Load, Ready
from ringserve.common.supervisor_messages import WorkerExited, WorkerRetired
from ringserve.gateway.dispatch.link import Link, send_frames

from .test_batch_controls import poll_for

BATCH = Batch(batch_id=7, model="mlp", version=1, attempt=0, slot_index=2, generation=3,
              inputs=[["x", "FP32", [1, 4], 0]], output_offset=64)


class Peers:
    """The link under test, and the other ends: a worker's DEALER, the supervisor's PUSH and PULL."""

    def __init__(self, runtime_dir: str, loop: asyncio.AbstractEventLoop, gateway: int = 1) -> None:
        self.from_workers: list[tuple[int, int, messages.Message]] = []
        self.from_supervisor: list[messages.Message] = []
        self.context = zmq.Context.instance()
        self.control = self.context.socket(zmq.PULL)  # the supervisor binds control.sock
        self.control.bind(wire.endpoint(runtime_dir, "control"))
        self.link = Link(runtime_dir, lambda i, g, m: self.from_workers.append((i, g, m)), self.from_supervisor.append,
                         gateway)
        self.link.start(loop)
        self.worker = self.context.socket(zmq.DEALER)
        self.worker.setsockopt(zmq.IDENTITY, wire.worker_identity(0, 1))
        # Gateway k's own sockets: dispatch-k.sock and events-k.sock.
        self.worker.connect(wire.gateway_endpoint(runtime_dir, "dispatch", gateway))
        self.events = self.context.socket(zmq.PUSH)
        self.events.connect(wire.gateway_endpoint(runtime_dir, "events", gateway))

    def close(self) -> None:
        self.link.close()
        for socket in (self.control, self.worker, self.events):
            socket.close(linger=0)


@pytest.fixture
def peers(tmp_path, loop) -> Iterator[Peers]:
    peers = Peers(str(tmp_path), loop)
    try:
        yield peers
    finally:
        peers.close()


def test_a_workers_message_arrives_decoded_with_the_workers_index_and_generation(peers, loop):
    ready = Ready(worker_index=0, generation=1, pid=1234, models={"mlp": "CPUExecutionProvider"})

    peers.worker.send_multipart(ready.encode())
    poll_for(loop, lambda: bool(peers.from_workers))

    assert peers.from_workers == [(0, 1, ready)]


def test_a_batch_reaches_the_worker_and_a_drain_follows_every_send(peers, loop):
    peers.worker.send_multipart(Ready(worker_index=0, generation=1, pid=1234, models={}).encode())
    poll_for(loop, lambda: bool(peers.from_workers))  # the router knows the worker's identity now
    drains = []
    reader = peers.link._router_reader
    real_drain = reader.drain
    reader.drain = lambda: (drains.append(1), real_drain())

    assert peers.link.send_batch(0, 1, BATCH)
    assert peers.worker.poll(5000)
    assert messages.decode(peers.worker.recv_multipart()) == BATCH
    # The ZMQ fd is edge-triggered and fires on send too: without this drain a reply that came
    # in meanwhile would wait for the next wake-up.
    loop.run_until_complete(asyncio.sleep(0))
    assert drains == [1]


def test_a_worker_that_is_not_connected_is_refused_not_raised(peers, loop):
    assert not peers.link.send_batch(5, 9, BATCH)
    assert not peers.link.send_to_loader(5, 9, Load("mlp", 1, "lazy"))


def test_supervisor_events_arrive_decoded_and_control_messages_reach_the_supervisor(peers, loop):
    exited = WorkerExited(worker_index=0, pid=1234, generation=1, reason="SIGSEGV", at=1.5, restarts={"SIGSEGV": 1})

    peers.events.send_multipart(exited.encode())
    poll_for(loop, lambda: bool(peers.from_supervisor))
    peers.link.tell_supervisor(WorkerRetired(0, 1))

    assert peers.from_supervisor == [exited]
    assert peers.control.poll(5000)
    assert messages.decode(peers.control.recv_multipart()) == WorkerRetired(0, 1)


def test_attach_goes_to_the_workers_batch_loop_before_the_batch_sent_after_it(peers, loop):
    peers.worker.send_multipart(Ready(worker_index=0, generation=1, pid=1234, models={}).encode())
    poll_for(loop, lambda: bool(peers.from_workers))

    assert peers.link.send_to_worker(0, 1, Attach(gateway_index=1, segment="ringserve-1-abc-ring"))
    assert peers.link.send_batch(0, 1, BATCH)

    received = []
    while len(received) < 2 and peers.worker.poll(5000):
        received.append(messages.decode(peers.worker.recv_multipart()))
    assert received == [Attach(gateway_index=1, segment="ringserve-1-abc-ring"), BATCH]


def test_send_frames_keeps_message_boundaries_empty_and_large_frames_included():
    """send_frames (plain-int flags) is send_multipart: each message comes back whole and alone."""
    context = zmq.Context.instance()
    a, b = context.socket(zmq.PAIR), context.socket(zmq.PAIR)
    try:
        a.bind("inproc://test-link-frames")
        b.connect("inproc://test-link-frames")
        first = [b"id", b"", b"x" * 200_000]
        send_frames(b, first)
        send_frames(b, [b"alone"], zmq.NOBLOCK)
        assert a.poll(2000) == zmq.POLLIN
        assert a.recv_multipart() == first
        assert a.recv_multipart() == [b"alone"]
        assert a.poll(0) == 0
    finally:
        a.close(linger=0)
        b.close(linger=0)
