"""gateway/http.py: what one event-loop step writes leaves in one write, and close() loses nothing."""
from __future__ import annotations

import asyncio

from ringserve.gateway.http import CoalescingTransport


class RecordingTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False
        self.aborted = False
        self.paused = False

    def write(self, data: bytes) -> None:
        assert not self.closed
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = self.closed = True

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        self.paused = True


def run_steps(loop: asyncio.AbstractEventLoop, steps: int = 3) -> None:
    for _ in range(steps):
        loop.run_until_complete(asyncio.sleep(0))


def test_writes_in_one_step_leave_in_one_write(loop):
    real = RecordingTransport()
    transport = CoalescingTransport(real, loop)
    transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    transport.write(b"{}")
    assert real.writes == []  # held until the step ends
    assert transport.get_write_buffer_size() == len(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
    run_steps(loop)
    assert real.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]
    transport.write(b"second")
    run_steps(loop)
    assert real.writes[1:] == [b"second"]


def test_close_flushes_first_and_abort_drops(loop):
    real = RecordingTransport()
    transport = CoalescingTransport(real, loop)
    transport.writelines([b"a", b"", b"b"])
    transport.close()
    assert real.writes == [b"ab"] and real.closed
    run_steps(loop)  # the scheduled flush finds nothing left
    assert real.writes == [b"ab"]

    real = RecordingTransport()
    transport = CoalescingTransport(real, loop)
    transport.write(b"lost")
    transport.abort()
    run_steps(loop)
    assert real.writes == [] and real.aborted


def test_a_closing_transport_gets_no_write_and_other_calls_pass_through(loop):
    real = RecordingTransport()
    transport = CoalescingTransport(real, loop)
    transport.write(b"late")
    real.closed = True  # the peer went away before the step ended
    run_steps(loop)
    assert real.writes == []
    transport.pause_reading()
    assert real.paused and transport.is_closing()
