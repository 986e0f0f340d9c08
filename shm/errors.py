"""Errors raised by the shared-memory ring."""

from __future__ import annotations


class ShmError(Exception):
    """Root of every shared-memory error."""


class LayoutMismatch(ShmError):
    def __init__(self, name: str, field: str, expected: object, found: object) -> None:
        self.name, self.field, self.expected, self.found = name, field, expected, found
        super().__init__(f"segment {name!r}: {field} is {found!r}, expected {expected!r}")


class SlotOverflow(ShmError):
    """A batch (or one request) needs more bytes than one slot holds."""

    def __init__(self, needed_bytes: int, capacity_bytes: int) -> None:
        self.needed_bytes, self.capacity_bytes = needed_bytes, capacity_bytes
        super().__init__(f"needs {needed_bytes} bytes, a slot holds {capacity_bytes}")


class StaleLease(ShmError):
    """A slot was released or checked with a generation that is no longer its own."""

    def __init__(self, index: int, generation: int, current: int) -> None:
        self.index, self.generation, self.current = index, generation, current
        super().__init__(f"slot {index}: lease generation {generation}, slot is at {current}")


class SharedMemoryFull(ShmError):
    """/dev/shm cannot hold the ring: refused at creation, instead of a SIGBUS at the first write."""

    def __init__(self, name: str, size_bytes: int, free_bytes: int, total_bytes: int, directory: str) -> None:
        self.name, self.size_bytes, self.free_bytes, self.total_bytes = name, size_bytes, free_bytes, total_bytes
        self.directory = directory
        super().__init__(
            f"cannot reserve {_mib(size_bytes)} of shared memory for the ring: {directory} has "
            f"{_mib(free_bytes)} free of {_mib(total_bytes)}"
        )


def _mib(size_bytes: int) -> str:
    return f"{size_bytes / 2**20:.0f} MiB"
