"""Sequences' committed state: a shared-memory store that outlives workers and gateways.

One store per model version with `sequence_batching` state (issue 38). The first gateway that
serves the model creates it under the supervisor's prefix (`Settings.state_store_prefix`, with 64
random bits, so nobody can take the name beforehand); the other gateways attach; the supervisor
unlinks every store at its stop, and the next start sweeps those of a dead supervisor. No worker
ever maps it: a step's state reaches the worker as an input in the batch's slot, and its next state
comes back as an output there, which the gateway commits here only when the live worker's RESULT
for that batch arrives. A worker's death therefore replays the step from the same state.

    offset 0              4096              4096 + E            4096 + 2E
    +---------------------+-----------------+-----------------+---
    | store header (64 B) | entry 0         | entry 1         | ...     E = entry_bytes
    | magic, entry_count, |                 |                 |
    | entry_bytes, layout |                 |                 |
    | digest, allocations |                 |                 |
    +---------------------+-----------------+-----------------+---

    one entry (a sequence's candidate slot):
    +--------------------------------------------+---------------------+---------------------+---
    | entry header (ENTRY_HEADER_BYTES), u64s:   | state 0 at its      | state 1 ...         |
    | owner (0 = free; else the allocation's     | largest (window),   | 64-byte aligned     |
    |   number), last_used_ns (CLOCK_MONOTONIC), | 64-byte aligned     |                     |
    | version (odd: a commit began and never     |                     |                     |
    |   ended: torn), key (kind + 32-byte hash), |                     |                     |
    | per state: ndim and dims (its shape now),  |                     |                     |
    |   and its bytes now (a STRING state's vary)|                     |                     |
    +--------------------------------------------+---------------------+---------------------+---

Who may write what, across processes (POSIX record locks, fcntl, on bytes of the file; the kernel
drops a process's locks when it dies, so a dead gateway never leaves one held):

    byte 0 of the file   held while allocating or freeing an entry (owner, key), briefly
    byte 1 + i           held by the one gateway that runs a step of entry i's sequence, from the
                         batch's forming to its answer: no two steps of one sequence ever run at once,
                         whichever gateway they arrive at

A commit is `version += 1` (odd), the new shape and bytes, `version += 1` (even). A gateway that died
in between leaves an odd version behind an unlocked entry: the next step sees the state was torn and
fails with that error instead of computing on half-written bytes. POSIX locks belong to a process, not
to a file descriptor, and closing any descriptor of the file drops them all: a store is opened once
per process (StateStores in the gateway keeps one per name).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import mmap
import os
import struct
import time

import numpy as np

from .errors import ShmError
from .segment import reserve_pages

MAGIC = b"RSSTATE1"
HEADER_BYTES = 4096
ENTRY_HEADER_BYTES = 1024
ALIGN = 64
MAX_STATES = 8
MAX_STATE_DIMS = 8
# magic, entry_count, entry_bytes, layout digest (16), allocations (u64, at ALLOCATIONS_OFFSET)
STORE_HEADER = struct.Struct("<8sQQ16s")
ALLOCATIONS_OFFSET = 48
_SHM_DIR = "/dev/shm"
ATTACH_WAIT_S = 5.0  # a store another gateway is creating: how long its header may take to appear

# u64 fields of an entry header
OWNER, LAST_USED, VERSION, KEY = 0, 1, 2, 3  # KEY .. KEY + 4: kind, then the 32-byte digest as 4 u64
KEY_WORDS = 5
SHAPES = KEY + KEY_WORDS  # per state: ndim, then MAX_STATE_DIMS dims
SHAPE_WORDS = 1 + MAX_STATE_DIMS
LENGTHS = SHAPES + MAX_STATES * SHAPE_WORDS  # per state: its bytes now (a STRING state's vary)


class StoreUnusable(ShmError):
    """A state store that cannot be created or attached (its size, a name taken, a layout mismatch)."""


def key_words(key: int | str) -> np.ndarray:
    """A sequence id as the store keeps it: its kind (1: uint64, 2: string) and a 32-byte hash."""
    kind = 1 if isinstance(key, int) else 2
    raw = key.to_bytes(8, "little") if isinstance(key, int) else key.encode("utf-8", "surrogatepass")
    digest = hashlib.blake2b(raw, digest_size=32, person=b"ringserve-seq").digest()
    return np.array([kind, *struct.unpack("<4Q", digest)], np.uint64)


def entry_bytes_for(state_bytes: tuple[int, ...]) -> int:
    return ENTRY_HEADER_BYTES + sum(_align(n) for n in state_bytes)


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class StateStore:
    """One model version's sequences: `entry_count` entries, each with room for every state at its largest."""

    def __init__(self, name: str, fd: int, entry_count: int, state_bytes: tuple[int, ...], *, created: bool) -> None:
        self.name, self.fd, self.created = name, fd, created
        self.entry_count, self.state_bytes = entry_count, state_bytes
        self.entry_bytes = entry_bytes_for(state_bytes)
        size = HEADER_BYTES + entry_count * self.entry_bytes
        self.map = mmap.mmap(fd, size)
        self.words = np.ndarray(
            (entry_count, ENTRY_HEADER_BYTES // 8),
            np.uint64,
            buffer=self.map,
            offset=HEADER_BYTES,
            strides=(self.entry_bytes, 8),
        )
        self._fixed: dict[tuple[int, int], np.ndarray] = {}  # fixed_view's, by (entry, state)
        offsets, at = [], ENTRY_HEADER_BYTES
        for n in state_bytes:
            offsets.append(at)
            at += _align(n)
        self.state_offsets = tuple(offsets)

    # -- opening ----------------------------------------------------------------------------
    @classmethod
    def open(cls, name: str, entry_count: int, state_bytes: tuple[int, ...]) -> StateStore:
        """Create the store (the first gateway to serve the model) or attach to it (the others)."""
        if len(state_bytes) > MAX_STATES:
            raise StoreUnusable(f"a model may keep at most {MAX_STATES} states, this one has {len(state_bytes)}")
        path = os.path.join(_SHM_DIR, name)
        size = HEADER_BYTES + entry_count * entry_bytes_for(state_bytes)
        digest = _layout_digest(entry_count, state_bytes)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            return cls._attach(name, path, entry_count, state_bytes, digest)
        try:
            os.ftruncate(fd, size)
            reserve_pages(fd, name, size)  # (tmpfs allocates on first touch: past its space, a SIGBUS)
            store = cls(name, fd, entry_count, state_bytes, created=True)
            # The magic last: an attaching gateway waits for it, and then sees the whole header.
            STORE_HEADER.pack_into(store.map, 0, b"\0" * 8, entry_count, store.entry_bytes, digest)
            store.map[0:8] = MAGIC
            return store
        except BaseException:
            os.close(fd)
            os.unlink(path)
            raise

    @classmethod
    def _attach(cls, name: str, path: str, entry_count: int, state_bytes: tuple[int, ...], digest: bytes) -> StateStore:
        fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
        try:
            if os.fstat(fd).st_uid != os.geteuid():
                raise StoreUnusable(f"state store {name!r} belongs to another user")
            deadline = time.monotonic() + ATTACH_WAIT_S
            while True:
                header = os.pread(fd, STORE_HEADER.size, 0)
                if len(header) == STORE_HEADER.size and header[:8] == MAGIC:
                    break
                if time.monotonic() > deadline:
                    raise StoreUnusable(f"state store {name!r}: its creator never finished it")
                time.sleep(0.001)
            _, count, entry_bytes, found = STORE_HEADER.unpack(header)
            if found != digest or count != entry_count or entry_bytes != entry_bytes_for(state_bytes):
                raise StoreUnusable(f"state store {name!r} was made for another layout of the model's state")
            return cls(name, fd, entry_count, state_bytes, created=False)
        except BaseException:
            os.close(fd)
            raise

    def close(self) -> None:
        """Unmap and close: drops this process's locks on the store."""
        self.words = None  # type: ignore[assignment]
        self._fixed.clear()
        try:
            self.map.close()
        except BufferError:
            pass  # a view of a state is still held; the mapping goes with the process
        os.close(self.fd)

    # -- entries ------------------------------------------------------------------------------
    def find(self, key: np.ndarray) -> tuple[int, int] | None:
        """(entry, owner) of the live entry holding `key` (key_words), or None."""
        words = self.words
        hits = np.flatnonzero((words[:, OWNER] != 0) & (words[:, KEY : KEY + KEY_WORDS] == key).all(axis=1))
        if not len(hits):
            return None
        entry = int(hits[0])
        return entry, int(words[entry, OWNER])

    def allocate(self, key: np.ndarray, now_ns: int) -> tuple[int, int] | None:
        """A free entry for `key`, as (entry, owner), or None when every entry is taken."""
        with self._allocation_lock():
            words = self.words
            free = np.flatnonzero(words[:, OWNER] == 0)
            if not len(free):
                return None
            entry = int(free[0])
            owner = struct.unpack_from("<Q", self.map, ALLOCATIONS_OFFSET)[0] + 1
            struct.pack_into("<Q", self.map, ALLOCATIONS_OFFSET, owner)
            words[entry, KEY : KEY + KEY_WORDS] = key
            words[entry, LAST_USED] = now_ns
            words[entry, VERSION] = 0
            words[entry, SHAPES:] = 0
            words[entry, OWNER] = owner  # last: `find` sees the entry whole
            return entry, owner

    def free(self, entry: int, owner: int) -> bool:
        """Release `entry` if `owner` still holds it; False if it was freed (and maybe taken) since."""
        with self._allocation_lock():
            if int(self.words[entry, OWNER]) != owner:
                return False
            self.words[entry, OWNER] = 0
            return True

    def owner(self, entry: int) -> int:
        return int(self.words[entry, OWNER])

    def touch(self, entry: int, now_ns: int) -> None:
        self.words[entry, LAST_USED] = now_ns

    def idle_entries(self, older_than_ns: int) -> list[tuple[int, int]]:
        """(entry, owner) of the live entries last used before `older_than_ns`."""
        words = self.words
        idle = np.flatnonzero((words[:, OWNER] != 0) & (words[:, LAST_USED] < older_than_ns))
        return [(int(i), int(words[i, OWNER])) for i in idle]

    def oldest_use_ns(self) -> int | None:
        """When the longest-unused live entry was last used (CLOCK_MONOTONIC ns), or None with none live."""
        words = self.words
        live = words[:, OWNER] != 0
        return int(words[live, LAST_USED].min()) if live.any() else None

    def in_use(self) -> int:
        return int(np.count_nonzero(self.words[:, OWNER]))

    # -- the one step in flight per sequence ---------------------------------------------------------
    def try_lock(self, entry: int) -> bool:
        """Take entry's step lock, unless another gateway holds it (a step of this sequence runs there)."""
        try:
            fcntl.lockf(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 1 + entry)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                return False
            raise
        return True

    def unlock(self, entry: int) -> None:
        fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, 1 + entry)

    def _allocation_lock(self) -> _Held:
        return _Held(self.fd)

    # -- the state itself ---------------------------------------------------------------------------
    def torn(self, entry: int) -> bool:
        return int(self.words[entry, VERSION]) % 2 == 1

    def shape(self, entry: int, state: int) -> tuple[int, ...] | None:
        """The state's shape now, or None before its first commit (the sequence's START gives it)."""
        at = SHAPES + state * SHAPE_WORDS
        words = self.words[entry, at : at + SHAPE_WORDS].tolist()  # (Python ints, in one call)
        stored = words[0]  # ndim + 1; 0: no shape yet
        return None if stored == 0 else tuple(words[1:stored])

    def view(self, entry: int, state: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """The state's bytes as an array of `shape` (a view into the store: no copy)."""
        offset = HEADER_BYTES + entry * self.entry_bytes + self.state_offsets[state]
        return np.ndarray(shape, dtype, buffer=self.map, offset=offset)

    def fixed_view(self, entry: int, state: int, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        """`view` of a state whose shape never changes, made once per entry (every step of every sequence
        reads one, and commits into it)."""
        key = (entry, state)
        view = self._fixed.get(key)
        if view is None:
            view = self._fixed[key] = self.view(entry, state, shape, dtype)
        return view

    def length(self, entry: int, state: int) -> int:
        return int(self.words[entry, LENGTHS + state])

    def bytes_view(self, entry: int, state: int, nbytes: int) -> np.ndarray:
        """The state's first `nbytes` bytes (a STRING state in KServe's BYTES form): a view, no copy."""
        return self.view(entry, state, (nbytes,), np.dtype(np.uint8))

    def set_length(self, entry: int, state: int, nbytes: int) -> None:
        self.words[entry, LENGTHS + state] = nbytes

    def begin_commit(self, entry: int) -> None:
        self.words[entry, VERSION] += np.uint64(1)

    def end_commit(self, entry: int) -> None:
        self.words[entry, VERSION] += np.uint64(1)

    def set_shape(self, entry: int, state: int, shape: tuple[int, ...]) -> None:
        if len(shape) > MAX_STATE_DIMS:
            raise StoreUnusable(f"a state has at most {MAX_STATE_DIMS} dims, got {len(shape)}")
        at = SHAPES + state * SHAPE_WORDS
        words = self.words
        words[entry, at + 1 : at + 1 + len(shape)] = np.array(shape, np.uint64)
        words[entry, at] = len(shape) + 1  # (0 is "no shape yet")

    def capacity(self, state: int) -> int:
        return self.state_bytes[state]


class _Held:
    """Byte 0 of the store, held while an entry is allocated or freed."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __enter__(self) -> None:
        fcntl.lockf(self.fd, fcntl.LOCK_EX, 1, 0)

    def __exit__(self, *exc: object) -> None:
        fcntl.lockf(self.fd, fcntl.LOCK_UN, 1, 0)


def _layout_digest(entry_count: int, state_bytes: tuple[int, ...]) -> bytes:
    text = f"{entry_count}:{','.join(map(str, state_bytes))}:{ENTRY_HEADER_BYTES}"
    return hashlib.blake2b(text.encode(), digest_size=16).digest()


def unlink_stores(prefix: str) -> list[str]:
    """Unlink every store whose name starts with `prefix` (the supervisor's, at its stop)."""
    removed: list[str] = []
    if not prefix:
        return removed
    try:
        entries = os.listdir(_SHM_DIR)
    except FileNotFoundError:
        return removed
    for entry in entries:
        if entry.startswith(prefix):
            try:
                os.unlink(os.path.join(_SHM_DIR, entry))
                removed.append(entry)
            except FileNotFoundError:
                pass
    return removed
