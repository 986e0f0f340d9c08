"""ZeroMQ sockets read from the gateway's event loop, with no asyncio future per message."""
from __future__ import annotations

import asyncio
import logging

import zmq

log = logging.getLogger(__name__)


class ZmqReader:
    """Drains a ZeroMQ socket from the event loop without a future per message.

    The ZMQ fd is edge-triggered and also fires on send, so after each wake-up (and
    after each send) we read until EAGAIN.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, socket: zmq.Socket, handle) -> None:
        self.loop, self.socket, self.handle = loop, socket, handle
        loop.add_reader(socket.getsockopt(zmq.FD), self.drain)

    def drain(self) -> None:
        while self.socket.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            try:
                frames = self.socket.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            try:
                self.handle(frames)
            except Exception:
                log.exception("failed to handle a control message")

    def close(self) -> None:
        self.loop.remove_reader(self.socket.getsockopt(zmq.FD))
        self.socket.close(linger=0)
