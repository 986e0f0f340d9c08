"""Fixtures shared by the unit tests: a small real shared-memory segment and an event loop; and the rule
that a unit test starts no server process (no supervisor, gateway, worker or bench: those tests live in
tests/integration, tests/chaos and tests/bench). Tools and stand-in processes (`python -c` sleepers whose
pids a test needs, `make -n`, linters, `ringserve status` as a client) are allowed."""
from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import uuid
from collections.abc import Iterator

import pytest

from ringserve.gateway.batching.queues import ModelQueue
from ringserve.gateway.batching.slots import write_batch
from ringserve.shm.layout import PAGE_BYTES
from ringserve.shm.ring import Ring
from ringserve.shm.segment import Segment

SLOT_COUNT = 4

# argv words that make a process a server's part: a unit test that starts one belongs in tests/integration.
SERVER_MODULES = ("ringserve.gateway", "ringserve.worker", "ringserve.supervisor", "bench")


def server_part(argv: object) -> str | None:
    """The server module `argv` runs with `-m`, if it runs one (`ringserve.cli serve` too)."""
    words = [str(word) for word in argv] if isinstance(argv, (list, tuple)) else str(argv).split()
    for i, word in enumerate(words[:-1]):
        if word == "-m":
            module = words[i + 1]
            if module.startswith(SERVER_MODULES) or (module == "ringserve.cli" and "serve" in words[i + 2 :]):
                return module
    return None


@pytest.fixture(autouse=True)
def no_server_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fails a unit test that starts a supervisor, gateway, worker or bench process."""
    popen_init = subprocess.Popen.__init__

    def refusing(self, args, *rest, **kwargs):  # type: ignore[no-untyped-def]
        module = server_part(args)
        if module is not None:
            pytest.fail(f"a unit test started {module}; tests that start server processes live in tests/integration")
        popen_init(self, args, *rest, **kwargs)

    monkeypatch.setattr(subprocess.Popen, "__init__", refusing)


def unique_name(pid: int | None = None) -> str:
    """A segment name with `-test-<this test process>-` in it, so the session's leak check knows it (and
    not the segments of another test session running on the same machine)."""
    return f"ringserve-{os.getpid() if pid is None else pid}-test-{os.getpid()}-{uuid.uuid4().hex[:12]}"


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


def written_batches(queue: ModelQueue, segment: Segment) -> Iterator[tuple[list, int, list, int]]:
    """The queue's batches one by one, each written into a slot: (requests, slot index, input refs,
    where outputs start). The slot is released once the caller has looked at it."""
    ring = Ring(segment)
    while queue.depth:
        batch = queue.collect_batch()
        lease = ring.acquire()
        refs, output_offset = write_batch(segment, lease, batch)
        yield batch, lease.index, refs, output_offset
        ring.release(lease)
