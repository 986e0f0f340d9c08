"""The response cache's store: LRU under the byte budget, one store for every process that opens it, a
change a dead process left half-made, and the cache's flags as Triton's."""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import subprocess
import sys
from collections.abc import Iterator

import pytest

from ringserve.common.cache_config import parse_cache_config
from ringserve.shm.cache import H_DIRTY, USED_RAW, CacheStore, create_cache, layout, unlink_cache


def key(i: int) -> bytes:
    return hashlib.blake2b(str(i).encode(), digest_size=16).digest()


@pytest.fixture
def name() -> Iterator[str]:
    made: list[str] = []

    def make(size: int) -> str:
        made.append(create_cache(str(os.getpid()), size))
        return made[-1]

    try:
        yield make  # type: ignore[misc]
    finally:
        for each in made:
            unlink_cache(each)


def test_the_least_recently_used_value_goes_first_when_the_budget_is_full(name):
    store = CacheStore.open(name(4096))  # 64 blocks of 64 bytes: four values of 960 bytes (+ 64 for the entry)
    try:
        for i in range(4):
            assert store.put(key(i), bytes([i]) * 960)
        assert store.get(key(0)) == bytes([0]) * 960  # 0 is now the most recently used; 1 the least

        assert store.put(key(4), b"x" * 960)

        assert [i for i in range(5) if store.get(key(i)) is not None] == [0, 2, 3, 4]
        assert store.numbers()["evictions"] == 1
    finally:
        store.close()


def test_a_value_is_replaced_under_its_key_and_one_larger_than_the_budget_is_not_stored(name):
    store = CacheStore.open(name(4096))
    try:
        assert store.put(key(1), b"a" * 100) and store.put(key(1), b"b" * 300)
        assert not store.put(key(2), b"c" * (4096 - 63))  # (with its entry's 64 bytes, past the budget)

        assert store.get(key(1)) == b"b" * 300 and store.get(key(2)) is None
        assert store.numbers()["entries"] == 1
    finally:
        store.close()


def test_raw_answers_share_the_budget_but_only_their_hits_count_in_tritons_numbers(name):
    store = CacheStore.open(name(4096))  # four values of 960 bytes
    try:
        store.put(key(1), b"t" * 960)
        store.put(key(2), b"r" * 960, USED_RAW)
        assert store.get(key(3), count_miss=False) is None  # a raw key's miss: Triton's key counts it
        assert store.get(key(2)) == b"r" * 960
        numbers = store.numbers()
        assert (numbers["entries"], numbers["raw_entries"], numbers["insertions"]) == (1, 1, 1)
        assert (numbers["lookups"], numbers["hits"], numbers["misses"], numbers["raw_hits"]) == (1, 1, 0, 1)
        for i in range(3, 7):  # four more: the two oldest (Triton's, then the raw one) are evicted
            store.put(key(i), b"x" * 960)
        numbers = store.numbers()
        assert store.get(key(1)) is None and store.get(key(2)) is None
        assert (numbers["entries"], numbers["raw_entries"], numbers["evictions"]) == (4, 0, 1)
    finally:
        store.close()


def test_random_work_keeps_every_value_it_finds_intact_and_the_budget_kept(name):
    store, rng, written = CacheStore.open(name(1 << 16)), random.Random(7), {}
    try:
        for _ in range(3000):
            i = rng.randrange(400)
            written[i] = rng.randbytes(rng.randrange(1, 2000))
            assert store.put(key(i), written[i])
            j = rng.randrange(400)
            found = store.get(key(j))
            assert found is None or found == written[j]
        numbers = store.numbers()
        assert numbers["used_bytes"] <= numbers["capacity_bytes"] == 1 << 16
        assert numbers["evictions"] > 0 and numbers["hits"] > 0
    finally:
        store.close()


def test_another_process_finds_what_one_stored(name):
    made = name(4096)
    store = CacheStore.open(made)
    try:
        store.put(key(9), b"shared")
        code = ("import sys, hashlib; from ringserve.shm.cache import CacheStore; s = CacheStore.open(sys.argv[1]); "
                "print(s.get(hashlib.blake2b(b'9', digest_size=16).digest()).decode()); "
                "s.put(hashlib.blake2b(b'10', digest_size=16).digest(), b'back')")
        run = subprocess.run([sys.executable, "-c", code, made], capture_output=True, text=True, timeout=60)

        assert run.stdout.strip() == "shared", run.stderr
        assert store.get(key(10)) == b"back"
    finally:
        store.close()


def test_a_change_its_process_never_finished_empties_the_cache_instead_of_being_read(name):
    store = CacheStore.open(name(4096))
    try:
        store.put(key(1), b"value")
        store.header[H_DIRTY] = 1  # what a gateway killed between two writes of one change leaves behind

        assert store.get(key(1)) is None
        assert store.numbers()["entries"] == 0 and store.put(key(1), b"again") and store.get(key(1)) == b"again"
    finally:
        store.close()


def test_the_store_is_unlinked_by_name_and_its_layout_fits_the_budget():
    entries, table, block_bytes, blocks = layout(1 << 30)
    assert blocks * block_bytes == 1 << 30 and table >= 2 * entries and blocks <= 1 << 18
    made = create_cache(str(os.getpid()), 1 << 20)
    try:
        assert os.path.exists(f"/dev/shm/{made}") and os.stat(f"/dev/shm/{made}").st_mode & 0o777 == 0o600
    finally:
        unlink_cache(made)
    assert not os.path.exists(f"/dev/shm/{made}")


@pytest.mark.parametrize(("text", "size"), [("local,size=1048576", 1048576), ("local,size=0", 0),
                                             (" local , size = 4096 ", 4096)])
def test_cache_config_takes_tritons_local_cache(text, size):
    assert parse_cache_config(text) == size


@pytest.mark.parametrize("text", ["redis,host=localhost", "local", "local,bytes=10", "local,size=ten"])
def test_cache_config_refuses_another_cache_or_key_by_name(text):
    with pytest.raises(argparse.ArgumentTypeError):
        parse_cache_config(text)
