"""The supervisor's ZeroMQ ends: what it tells every gateway (one events PUSH per index), and
reading what arrives on its PULL sockets (heartbeats, control). Run in the supervisor process only.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import zmq

from ringserve.common import messages, wire

from .children import gateway_name

log = logging.getLogger(__name__)


class GatewayEvents:
    """One PUSH per gateway index, to that gateway's events PULL: each gateway keeps its own view of the
    workers, the quarantine and the reloads, so every event goes to every gateway."""

    def __init__(self, gateway_count: int) -> None:
        self.gateway_count = gateway_count
        self.sockets: list[zmq.Socket] = []  # index k: gateway k's

    def connect(self, context: zmq.Context, runtime_dir: str) -> None:
        for index in range(self.gateway_count):
            events = context.socket(zmq.PUSH)
            events.setsockopt(zmq.LINGER, 0)
            events.connect(wire.gateway_endpoint(runtime_dir, "events", index))
            self.sockets.append(events)

    def send(self, event: messages.Message, skip: int | None = None) -> None:
        """To every gateway (but `skip`): each keeps its own view of the workers, the quarantine and the reloads."""
        frames = event.encode()
        for index, events in enumerate(self.sockets):
            if index == skip:
                continue
            try:
                events.send_multipart(frames, zmq.NOBLOCK)
            except zmq.Again:
                log.warning("%s is not reading events; dropped %s", gateway_name(index, self.gateway_count), event.KIND)


def received(sock: zmq.Socket) -> Iterator[messages.Message]:
    """The messages waiting on `sock`; one that does not follow the protocol is logged and dropped."""
    while True:
        try:
            frames = sock.recv_multipart(zmq.NOBLOCK)
        except zmq.Again:
            return
        try:
            message = messages.decode(frames)
        except messages.WireError as exc:
            log.error("dropped a malformed message: %s", exc)
            continue
        yield message
