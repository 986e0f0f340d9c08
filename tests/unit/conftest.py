"""Fixtures shared by the unit tests: a small real shared-memory segment and an event loop."""
from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import Iterator

import pytest

from shm.layout import PAGE_BYTES
from shm.segment import Segment

SLOT_COUNT = 4


def unique_name(pid: int | None = None) -> str:
    """A segment name with `-test-` in it, so the session's leak check knows it."""
    return f"ringserve-{os.getpid() if pid is None else pid}-test-{uuid.uuid4().hex[:12]}"


@contextlib.contextmanager
def make_segment(slot_count: int = SLOT_COUNT, slot_bytes: int = 2 * PAGE_BYTES) -> Iterator[Segment]:
    """A real segment, always unlinked."""
    seg = Segment.create(unique_name(), slot_count=slot_count, slot_bytes=slot_bytes)
    try:
        yield seg
    finally:
        seg.close()
        seg.unlink()


@pytest.fixture
def segment():
    """4 slots of 8 KiB."""
    with make_segment() as seg:
        yield seg


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    try:
        yield loop
    finally:
        loop.close()
