"""Fixtures shared by the unit tests: a small real shared-memory segment and an event loop."""
from __future__ import annotations

import asyncio
import os
import uuid

import pytest

from shm.layout import PAGE_BYTES
from shm.segment import Segment

SLOT_COUNT = 4


@pytest.fixture
def segment():
    """4 slots of 8 KiB, named `-test-` so the session's leak check knows it; always unlinked."""
    seg = Segment.create(f"ringserve-{os.getpid()}-test-{uuid.uuid4().hex[:12]}", slot_count=SLOT_COUNT,
                         slot_bytes=2 * PAGE_BYTES)
    try:
        yield seg
    finally:
        seg.close()
        seg.unlink()


@pytest.fixture
def loop():
    loop = asyncio.new_event_loop()
    try:
        yield loop
    finally:
        loop.close()
