"""The sequences' state store: entries by sequence id, one step lock across processes, torn commits."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
import time
from collections.abc import Iterator

import numpy as np
import pytest

from ringserve.shm.states import StateStore, StoreUnusable, key_words, unlink_stores


@pytest.fixture
def prefix() -> Iterator[str]:
    prefix = f"ringserve-{os.getpid()}-{secrets.token_hex(4)}-state-"
    try:
        yield prefix
    finally:
        unlink_stores(prefix)


def test_a_sequence_id_finds_its_entry_until_it_is_freed(prefix: str):
    store = StateStore.open(prefix + "a", 2, (16,))
    try:
        first = store.allocate(key_words(7), time.monotonic_ns())
        second = store.allocate(key_words("7"), time.monotonic_ns())  # a string id is another sequence
        assert first is not None and second is not None and first[0] != second[0]
        assert store.allocate(key_words(8), 0) is None  # every entry taken: the backlog's case
        assert store.find(key_words(7)) == first
        assert store.free(*first) and store.find(key_words(7)) is None
        assert not store.free(*first)  # freed already: a stale owner frees nothing
        assert store.allocate(key_words(8), 0)[1] > second[1]  # allocation numbers never repeat
    finally:
        store.close()


def test_a_second_gateway_attaches_and_sees_the_same_state(prefix: str):
    one = StateStore.open(prefix + "b", 4, (16,))
    two = StateStore.open(prefix + "b", 4, (16,))
    try:
        assert (one.created, two.created) == (True, False)
        entry, _ = one.allocate(key_words(1), 0)
        one.begin_commit(entry)
        one.set_shape(entry, 0, (4,))
        one.view(entry, 0, (4,), np.dtype(np.float32))[:] = [1, 2, 3, 4]
        one.end_commit(entry)
        assert two.shape(entry, 0) == (4,)
        assert two.view(entry, 0, (4,), np.dtype(np.float32)).tolist() == [1, 2, 3, 4]
        assert not two.torn(entry)
    finally:
        one.close()
        two.close()


def test_a_store_of_another_layout_is_refused(prefix: str):
    store = StateStore.open(prefix + "c", 4, (16,))
    try:
        with pytest.raises(StoreUnusable, match="another layout"):
            StateStore.open(prefix + "c", 4, (32,))
    finally:
        store.close()


HOLD_LOCK = """
import sys, time
from ringserve.shm.states import StateStore
store = StateStore.open(sys.argv[1], 4, (16,))
assert store.try_lock(2)
{after}
print("locked", flush=True)
time.sleep(60)
"""


def test_a_steps_lock_held_by_another_process_excludes_this_one_until_that_process_dies(prefix: str):
    store = StateStore.open(prefix + "d", 4, (16,))
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK.format(after=""), prefix + "d"], stdout=subprocess.PIPE, text=True
    )
    with child:
        try:
            assert child.stdout.readline().strip() == "locked"
            assert not store.try_lock(2)  # a step of that sequence runs at the other gateway
            assert store.try_lock(1)  # other sequences are free
        finally:
            child.kill()
            child.wait()
        assert store.try_lock(2)  # the kernel dropped the dead process's lock
        store.close()


def test_a_commit_whose_writer_died_halfway_reads_as_torn(prefix: str):
    store = StateStore.open(prefix + "e", 4, (16,))
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK.format(after="store.begin_commit(2)"), prefix + "e"],
        stdout=subprocess.PIPE,
        text=True,
    )
    with child:
        try:
            assert child.stdout.readline().strip() == "locked"
        finally:
            child.kill()
            child.wait()
        assert store.try_lock(2) and store.torn(2)
        assert not store.torn(1)
        store.close()


def test_the_supervisor_unlinks_every_store_of_its_prefix(prefix: str):
    for name in ("f", "g"):
        StateStore.open(prefix + name, 1, (8,)).close()
    assert sorted(unlink_stores(prefix)) == [prefix + "f", prefix + "g"]
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(prefix)]
