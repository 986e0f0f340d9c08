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
