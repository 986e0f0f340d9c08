"""The response cache's store: one shared-memory segment that every gateway of the server maps.

The supervisor creates it at its start when --cache-config local,size=N (or --response-cache-byte-size N)
asks for a cache, reserves its pages (posix_fallocate: tmpfs allocates on first touch, and a page it could
not allocate later would be a SIGBUS) and unlinks it at its stop; the next start sweeps one a dead
supervisor left (its name is `ringserve-<pid>-<random>-cache`, shm/segment.py). It is opened with os.open
and mmap, never through multiprocessing.shared_memory: Python 3.11's resource tracker would unlink it when a
gateway exits. Nobody ever truncates it (a mapping past a file's end reads as SIGBUS); it is 0600 and its
name has 64 random bits. No worker maps it: a hit never reaches a worker.

    offset 0         4096               +E*64            +T*4 (64-aligned)   +B (4096-aligned)
    +----------------+------------------+------------------+-------------------+---------------------+
    | header (u64s)  | entries          | table            | block map         | arena               |
    | see HEADER     | E records of 8   | T u32: entry + 1 | B u8: 1 = used    | B blocks of         |
    | below          | u64 (ENTRY_*)    | (0 = empty),     |                   | block_bytes each    |
    |                |                  | linear probing   |                   |                     |
    +----------------+------------------+------------------+-------------------+---------------------+

An entry is a stored response: its 128-bit key, its value's first block and length, and its place in one
LRU list (prev/next, entry + 1) from the most recently used (`lru_head`) to the least (`lru_tail`). A value
lies in consecutive blocks; the budget N is the arena, counted in whole blocks, each value charged its bytes and
its 64-byte entry record (ENTRY_CHARGE_BYTES). Storing evicts from the LRU
end until a run of free blocks (and a free entry) holds the value; a value larger than the arena is not
stored. A hit moves its entry to the LRU head, so a lookup writes too.

Every operation holds the lock: a POSIX record lock (fcntl) on byte 0 of the file, which the kernel drops
when its process dies, so a killed gateway never leaves it held. A gateway killed in the middle of a change
leaves `dirty` set behind the lock it no longer holds: the next holder finds it and empties the cache (the
counters stay) rather than read half-written links. POSIX locks belong to a process, and closing any
descriptor of the file drops them all: a gateway opens the store once.
"""

from __future__ import annotations

import fcntl
import mmap
import os
import time

import numpy as np

from .errors import ShmError
from .segment import reserve_pages, segment_name

MAGIC = 0x31454843_41435352  # "RSCACHE1", little-endian
HEADER_BYTES = 4096
ENTRY_WORDS = 8
MIN_BLOCK_BYTES = 64
MAX_BLOCKS = 1 << 18  # the block map is scanned (numpy) when the next-fit run is taken: bounded
MIN_ENTRIES = 16
BYTES_PER_ENTRY = 512  # one entry per this many bytes of budget (a response smaller than it is rare)
# What a stored value is charged beyond its bytes: its entry record (key, place, links). Triton's local cache
# charges an entry's bookkeeping to the same budget (its allocator's), so a size that holds a response's bytes
# alone does not hold the response (Triton's qa/L0_response_cache: 200 bytes hold no answer of 2 x 16 FP32).
ENTRY_CHARGE_BYTES = ENTRY_WORDS * 8
_SHM_DIR = "/dev/shm"

# Header words (u64). Layout first, then the state, then the server-wide counters (nv_cache_*).
(
    H_MAGIC,
    H_ENTRIES,
    H_TABLE,
    H_BLOCK_BYTES,
    H_BLOCKS,
    H_DIRTY,
    H_LRU_HEAD,
    H_LRU_TAIL,
    H_FREE_ENTRY,
    H_USED_ENTRIES,
    H_USED_BLOCKS,
    H_CURSOR,
    H_LOOKUPS,
    H_HITS,
    H_MISSES,
    H_EVICTIONS,
    H_INSERTIONS,
    H_LOOKUP_NS,
    H_INSERTION_NS,
    H_RAW_ENTRIES,
    H_RAW_HITS,
) = range(21)
# Entry words: key (2), its first block, value bytes, blocks, LRU links (entry + 1; 0: none), and E_USED (0: free,
# USED_TRITON or USED_RAW). A free entry's E_NEXT links the free list.
E_KEY0, E_KEY1, E_BLOCK, E_BYTES, E_BLOCKS, E_PREV, E_NEXT, E_USED = range(ENTRY_WORDS)
# An entry under Triton's key (a response's outputs), or an HTTP answer under its raw request's key
# (gateway/cache/raw.py): same budget and LRU, but Triton's numbers (entries, insertions, evictions) count
# only the first kind, so nv_cache_* mean what Triton's mean.
USED_TRITON, USED_RAW = 1, 2


class CacheUnusable(ShmError):
    pass


def create_cache(instance: str, size_bytes: int) -> str:
    """Make the server's store (the supervisor, at its start) and return its name; the caller unlinks it."""
    store = CacheStore.create(segment_name(instance, "cache"), size_bytes)
    store.close()
    return store.name


def unlink_cache(name: str) -> None:
    """Unlink the store (the supervisor, at its stop); "" is none. The gateways' mappings stay valid."""
    if name:
        try:
            os.unlink(os.path.join(_SHM_DIR, name))
        except FileNotFoundError:
            pass


def layout(size_bytes: int) -> tuple[int, int, int, int]:
    """(entries, table slots, block bytes, blocks) of a store whose arena is `size_bytes`."""
    block_bytes = MIN_BLOCK_BYTES
    while size_bytes // block_bytes > MAX_BLOCKS:
        block_bytes *= 2
    blocks = max(1, size_bytes // block_bytes)
    entries = max(MIN_ENTRIES, min(blocks, size_bytes // BYTES_PER_ENTRY))
    table = 1
    while table < 2 * entries:
        table *= 2
    return entries, table, block_bytes, blocks


def _align(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def _offsets(entries: int, table: int, blocks: int) -> tuple[int, int, int]:
    """Where the table, the block map and the arena start."""
    table_at = HEADER_BYTES + entries * ENTRY_WORDS * 8
    map_at = _align(table_at + table * 4, 64)
    return table_at, map_at, _align(map_at + blocks, 4096)


class CacheStore:
    """The store, created (the supervisor) or opened (each gateway). Keys are 16 bytes (a digest)."""

    def __init__(self, name: str, fd: int) -> None:
        self.name, self.fd = name, fd
        head = np.frombuffer(os.pread(fd, 8 * 5, 0), np.uint64)
        if int(head[H_MAGIC]) != MAGIC:
            raise CacheUnusable(f"response cache {name!r} is not a ringserve cache")
        self.entry_count, self.table_slots, self.block_bytes, self.block_count = (int(x) for x in head[1:5])
        table_at, map_at, arena_at = _offsets(self.entry_count, self.table_slots, self.block_count)
        self.map = mmap.mmap(fd, arena_at + self.block_count * self.block_bytes)
        self.header = memoryview(self.map)[:HEADER_BYTES].cast("Q")
        self.entries = memoryview(self.map)[HEADER_BYTES:table_at].cast("Q")
        self.table = memoryview(self.map)[table_at : table_at + self.table_slots * 4].cast("I")
        self.block_map = np.frombuffer(self.map, np.uint8, self.block_count, map_at)
        self.arena_at = arena_at
        self.capacity_bytes = self.block_count * self.block_bytes

    # -- opening ----------------------------------------------------------------------------------
    @classmethod
    def create(cls, name: str, size_bytes: int) -> CacheStore:
        """Make the segment (the supervisor, once); raises SharedMemoryFull where /dev/shm cannot hold it."""
        entries, table, block_bytes, blocks = layout(size_bytes)
        _, _, arena_at = _offsets(entries, table, blocks)
        size = arena_at + blocks * block_bytes
        path = os.path.join(_SHM_DIR, name)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            os.ftruncate(fd, size)
            reserve_pages(fd, name, size)
            words = np.array([MAGIC, entries, table, block_bytes, blocks], np.uint64)
            os.pwrite(fd, words.tobytes(), 0)
            store = cls(name, fd)
            store._reset()
            return store
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise

    @classmethod
    def open(cls, name: str) -> CacheStore:
        fd = os.open(os.path.join(_SHM_DIR, name), os.O_RDWR | os.O_CLOEXEC)
        try:
            if os.fstat(fd).st_uid != os.geteuid():
                raise CacheUnusable(f"response cache {name!r} belongs to another user")
            return cls(name, fd)
        except BaseException:
            os.close(fd)
            raise

    def close(self) -> None:
        """Unmap and close (drops this process's lock)."""
        self.header = self.entries = self.table = None  # type: ignore[assignment]
        self.block_map = None  # type: ignore[assignment]
        try:
            self.map.close()
        except BufferError:
            pass  # a view is still held; the mapping goes with the process
        os.close(self.fd)

    # -- the lock ---------------------------------------------------------------------------------
    def _lock(self) -> None:
        fcntl.lockf(self.fd, fcntl.LOCK_EX, 1, 0)
        if self.header[H_DIRTY]:  # its last holder died in the middle of a change
            self._reset()

    def _unlock(self) -> None:
        fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, 0)

    def _reset(self) -> None:
        """Empty: every entry free (chained), no block used, the table cleared. Counters stay."""
        h, count = self.header, self.entry_count
        h[H_DIRTY] = 1
        entries = np.frombuffer(self.map, np.uint64, count * ENTRY_WORDS, HEADER_BYTES).reshape(count, ENTRY_WORDS)
        entries[:, E_USED] = 0
        entries[:, E_NEXT] = np.arange(2, count + 2, dtype=np.uint64)
        entries[-1, E_NEXT] = 0  # (the free list: entry i links i + 1, as entry + 1)
        np.frombuffer(self.map, np.uint32, self.table_slots, HEADER_BYTES + count * ENTRY_WORDS * 8)[:] = 0
        self.block_map[:] = 0
        h[H_LRU_HEAD] = h[H_LRU_TAIL] = 0
        h[H_FREE_ENTRY] = 1
        h[H_USED_ENTRIES] = h[H_USED_BLOCKS] = h[H_CURSOR] = h[H_RAW_ENTRIES] = 0
        h[H_DIRTY] = 0

    # -- operations -------------------------------------------------------------------------------
    def get(self, key: bytes, count_miss: bool = True) -> bytes | None:
        """The value stored under `key` (a copy), now the most recently used; None on a miss. `count_miss`
        False: a miss counts no lookup (a raw key's miss goes on to Triton's key, which counts it)."""
        started = time.perf_counter_ns()
        k0, k1 = int.from_bytes(key[:8], "little"), int.from_bytes(key[8:16], "little")
        self._lock()
        try:
            h = self.header
            _, entry = self._find(k0, k1)
            if entry < 0:
                if count_miss:
                    h[H_LOOKUPS] += 1
                    h[H_MISSES] += 1
                    h[H_LOOKUP_NS] += time.perf_counter_ns() - started
                return None
            h[H_LOOKUPS] += 1
            e, base = self.entries, entry * ENTRY_WORDS
            if e[base + E_USED] == USED_RAW:
                h[H_RAW_HITS] += 1
            h[H_DIRTY] = 1
            self._unlink_lru(entry)
            self._push_lru(entry)
            h[H_DIRTY] = 0
            at = self.arena_at + e[base + E_BLOCK] * self.block_bytes
            value = self.map[at : at + e[base + E_BYTES]]
            h[H_HITS] += 1
            h[H_LOOKUP_NS] += time.perf_counter_ns() - started
            return value
        finally:
            self._unlock()

    def put(self, key: bytes, value: bytes | memoryview, kind: int = USED_TRITON) -> bool:
        """Store `value` under `key` (replacing one there), evicting the least recently used entries until
        it fits; False when it cannot fit even in the empty arena. `kind` USED_RAW: not one of Triton's
        entries (counted apart)."""
        size = len(value)
        need = -(-(size + ENTRY_CHARGE_BYTES) // self.block_bytes)
        if need > self.block_count:
            return False
        started = time.perf_counter_ns()
        k0, k1 = int.from_bytes(key[:8], "little"), int.from_bytes(key[8:16], "little")
        self._lock()
        try:
            h = self.header
            h[H_DIRTY] = 1
            _, old = self._find(k0, k1)
            if old >= 0:
                self._remove(old)
            while not h[H_FREE_ENTRY]:
                self._evict()
            block = self._take_blocks(need)
            entry = int(h[H_FREE_ENTRY]) - 1
            e, base = self.entries, entry * ENTRY_WORDS
            h[H_FREE_ENTRY] = e[base + E_NEXT]
            e[base + E_KEY0], e[base + E_KEY1] = k0, k1
            e[base + E_BLOCK], e[base + E_BYTES], e[base + E_BLOCKS], e[base + E_USED] = block, size, need, kind
            at = self.arena_at + block * self.block_bytes
            self.map[at : at + size] = value
            self._push_lru(entry)
            self._insert_table(k0, entry)
            h[H_USED_ENTRIES] += 1
            if kind == USED_RAW:
                h[H_RAW_ENTRIES] += 1
            else:
                h[H_INSERTIONS] += 1
                h[H_INSERTION_NS] += time.perf_counter_ns() - started
            h[H_DIRTY] = 0
            return True
        finally:
            self._unlock()

    def numbers(self) -> dict[str, int]:
        """The server-wide counters and gauges (nv_cache_*), read without the lock (each a word)."""
        h = self.header
        return {
            "entries": int(h[H_USED_ENTRIES]) - int(h[H_RAW_ENTRIES]),
            "raw_entries": int(h[H_RAW_ENTRIES]),
            "raw_hits": int(h[H_RAW_HITS]),
            "used_bytes": int(h[H_USED_BLOCKS]) * self.block_bytes,
            "capacity_bytes": self.capacity_bytes,
            "lookups": int(h[H_LOOKUPS]),
            "hits": int(h[H_HITS]),
            "misses": int(h[H_MISSES]),
            "evictions": int(h[H_EVICTIONS]),
            "insertions": int(h[H_INSERTIONS]),
            "lookup_ns": int(h[H_LOOKUP_NS]),
            "insertion_ns": int(h[H_INSERTION_NS]),
        }

    # -- the table, the LRU list and the blocks (the lock held) -----------------------------------
    def _find(self, k0: int, k1: int) -> tuple[int, int]:
        """(table slot, entry) of the key, or (the empty slot that ends its probe, -1)."""
        mask, table, e = self.table_slots - 1, self.table, self.entries
        slot = k0 & mask
        while True:
            ref = table[slot]
            if ref == 0:
                return slot, -1
            base = (ref - 1) * ENTRY_WORDS
            if e[base + E_KEY0] == k0 and e[base + E_KEY1] == k1:
                return slot, ref - 1
            slot = (slot + 1) & mask

    def _insert_table(self, k0: int, entry: int) -> None:
        mask, table = self.table_slots - 1, self.table
        slot = k0 & mask
        while table[slot]:
            slot = (slot + 1) & mask
        table[slot] = entry + 1

    def _delete_table(self, entry: int) -> None:
        """Take the entry out of the table, shifting the probe chain back (no tombstones)."""
        mask, table, e = self.table_slots - 1, self.table, self.entries
        slot = e[entry * ENTRY_WORDS + E_KEY0] & mask
        while table[slot] != entry + 1:
            slot = (slot + 1) & mask
        hole, probe = slot, (slot + 1) & mask
        while table[probe]:
            home = e[(table[probe] - 1) * ENTRY_WORDS + E_KEY0] & mask
            # the entry at `probe` may fill the hole when its home is not cyclically in (hole, probe]
            if (probe - home) & mask >= (probe - hole) & mask:
                table[hole] = table[probe]
                hole = probe
            probe = (probe + 1) & mask
        table[hole] = 0

    def _push_lru(self, entry: int) -> None:
        h, e, base = self.header, self.entries, entry * ENTRY_WORDS
        e[base + E_PREV], e[base + E_NEXT] = 0, h[H_LRU_HEAD]
        if h[H_LRU_HEAD]:
            e[(h[H_LRU_HEAD] - 1) * ENTRY_WORDS + E_PREV] = entry + 1
        else:
            h[H_LRU_TAIL] = entry + 1
        h[H_LRU_HEAD] = entry + 1

    def _unlink_lru(self, entry: int) -> None:
        h, e, base = self.header, self.entries, entry * ENTRY_WORDS
        prev, nxt = e[base + E_PREV], e[base + E_NEXT]
        if prev:
            e[(prev - 1) * ENTRY_WORDS + E_NEXT] = nxt
        else:
            h[H_LRU_HEAD] = nxt
        if nxt:
            e[(nxt - 1) * ENTRY_WORDS + E_PREV] = prev
        else:
            h[H_LRU_TAIL] = prev

    def _remove(self, entry: int) -> None:
        h, e, base = self.header, self.entries, entry * ENTRY_WORDS
        self._delete_table(entry)
        self._unlink_lru(entry)
        block, blocks = e[base + E_BLOCK], e[base + E_BLOCKS]
        self.block_map[block : block + blocks] = 0
        h[H_USED_BLOCKS] -= blocks
        h[H_USED_ENTRIES] -= 1
        if e[base + E_USED] == USED_RAW:
            h[H_RAW_ENTRIES] -= 1
        e[base + E_USED] = 0
        e[base + E_NEXT] = h[H_FREE_ENTRY]
        h[H_FREE_ENTRY] = entry + 1

    def _evict(self) -> tuple[int, int]:
        """Evict the least recently used entry; (its first block, its blocks)."""
        entry = int(self.header[H_LRU_TAIL]) - 1
        base = entry * ENTRY_WORDS
        freed = int(self.entries[base + E_BLOCK]), int(self.entries[base + E_BLOCKS])
        if self.entries[base + E_USED] != USED_RAW:
            self.header[H_EVICTIONS] += 1
        self._remove(entry)
        return freed

    def _take_blocks(self, need: int) -> int:
        """The first block of `need` free consecutive blocks, marked used; evicts until there is such a run.

        Next fit first (right after the last value stored: with LRU order that is mostly where the oldest
        were), then one scan of the block map; then each eviction looks only around the blocks it freed."""
        h, used = self.header, self.block_map
        cursor = int(h[H_CURSOR])
        if cursor + need <= self.block_count and not used[cursor : cursor + need].any():
            block = cursor
        else:
            block = _first_run(used, need) if self.block_count - h[H_USED_BLOCKS] >= need else -1
        while block < 0:
            start, count = self._evict()
            low = max(0, start - need)
            found = _first_run(used[low : start + count + need], need)
            block = -1 if found < 0 else low + found
        used[block : block + need] = 1
        h[H_USED_BLOCKS] += need
        h[H_CURSOR] = (block + need) % self.block_count
        return block


def _first_run(used: np.ndarray, need: int) -> int:
    """The start of the first run of `need` zeros in `used`, or -1."""
    free = np.concatenate(([0], (used == 0).view(np.int8), [0]))
    edges = np.diff(free)
    starts, ends = np.flatnonzero(edges == 1), np.flatnonzero(edges == -1)
    fits = np.flatnonzero(ends - starts >= need)
    return int(starts[fits[0]]) if fits.size else -1
