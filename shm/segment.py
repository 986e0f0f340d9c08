"""A shared-memory segment: created (and unlinked) by the supervisor, attached by others.

Creation reserves every page at once (posix_fallocate): tmpfs allocates pages on first
touch, so a ring larger than /dev/shm's free space was created without complaint and the
first write past it killed the gateway with SIGBUS (Docker's default /dev/shm is 64 MiB,
the default ring 128 MiB). Names carry a random part: /dev/shm is world-writable, and a
predictable name lets any local user pre-create it and stop the server from starting.

Python 3.11/3.12 register every SharedMemory a process opens with that process's
resource tracker, which unlinks the segment when the process exits - so a worker that
crashed would delete the ring under everybody's feet. Attaching processes therefore
open segments untracked (`track=False` on 3.13+, a scoped opt-out before that); only the
creator tracks and unlinks.

`private_view` maps part of a slot copy-on-write (MAP_PRIVATE over the segment's file in
/dev/shm): reads see the slot's bytes, writes make private pages of this process, so code that
writes into its inputs (a Python model's in-place preprocessing) never changes what a replay reads.
"""

from __future__ import annotations

import errno
import logging
import mmap
import os
import secrets
import sys
from multiprocessing import resource_tracker, shared_memory

import numpy as np

from . import layout
from .errors import LayoutMismatch, SharedMemoryFull

log = logging.getLogger(__name__)

SEGMENT_PREFIX = "ringserve-"
_SHM_DIR = "/dev/shm"
NAME_ATTEMPTS = 16  # names taken by someone else, tried before giving up (64 random bits each)


def _open_untracked(name: str) -> shared_memory.SharedMemory:
    if sys.version_info >= (3, 13):
        return shared_memory.SharedMemory(name, track=False)
    # Before 3.13 there is no track=False: skip registration for this one call. The swap of
    # the module global is safe while one thread per process attaches and no other thread
    # registers anything (a worker attaches each gateway's ring from its batch loop only).
    register = resource_tracker.register
    resource_tracker.register = lambda *args, **kwargs: None
    try:
        return shared_memory.SharedMemory(name)
    finally:
        resource_tracker.register = register


class Segment:
    """One ring segment: a header page followed by `slot_count` fixed-size slots."""

    def __init__(self, shm: shared_memory.SharedMemory, *, owner: bool) -> None:
        self._shm = shm
        self.owner = owner
        self.name = shm.name
        magic, version, self.slot_count, self.slot_bytes, self.creator_pid = layout.SEGMENT_HEADER.unpack_from(
            shm.buf, 0
        )
        if magic != layout.MAGIC:
            raise LayoutMismatch(self.name, "magic", layout.MAGIC, magic)
        if version != layout.LAYOUT_VERSION:
            raise LayoutMismatch(self.name, "layout version", layout.LAYOUT_VERSION, version)
        self.buf = shm.buf
        self.data_capacity = layout.data_capacity(self.slot_bytes)
        # One uint64 view over the whole segment makes header reads/writes cheap.
        self._words = np.frombuffer(shm.buf, dtype=np.uint64)
        self._file_fd: int | None = None  # opened read-only at the first private_view

    @classmethod
    def create(cls, name: str, *, slot_count: int, slot_bytes: int) -> Segment:
        if slot_count < 1:
            raise ValueError(f"slot_count must be >= 1, got {slot_count}")
        slot_bytes = layout.align_up(slot_bytes, layout.PAGE_BYTES)
        if slot_bytes < 2 * layout.PAGE_BYTES:
            raise ValueError(f"slot_bytes must be >= {2 * layout.PAGE_BYTES}, got {slot_bytes}")
        size = layout.segment_bytes(slot_count, slot_bytes)
        shm = shared_memory.SharedMemory(name, create=True, size=size)
        try:
            _reserve(shm.name, size)
        except SharedMemoryFull:
            shm.close()
            shm.unlink()
            raise
        layout.SEGMENT_HEADER.pack_into(
            shm.buf, 0, layout.MAGIC, layout.LAYOUT_VERSION, slot_count, slot_bytes, os.getpid()
        )
        return cls(shm, owner=True)

    @classmethod
    def create_unique(cls, instance: str, role: str = "ring", *, slot_count: int, slot_bytes: int) -> Segment:
        """A new segment named `ringserve-<instance>-<random>-<role>`; a name already taken is tried anew."""
        for _ in range(NAME_ATTEMPTS):
            try:
                return cls.create(segment_name(instance, role), slot_count=slot_count, slot_bytes=slot_bytes)
            except FileExistsError:
                log.warning("shared-memory name taken by someone else; trying another")
        raise FileExistsError(
            errno.EEXIST,
            f"{NAME_ATTEMPTS} random shared-memory names were all taken in "
            f"{_SHM_DIR}: is someone creating ringserve-{instance}-* names?",
        )

    @classmethod
    def attach(cls, name: str) -> Segment:
        return cls(_open_untracked(name), owner=False)

    # -- slot headers -------------------------------------------------------------
    def _word_index(self, index: int, field_offset: int) -> int:
        return (layout.slot_offset(index, self.slot_bytes) + field_offset) // 8

    def generation(self, index: int) -> int:
        return int(self._words[self._word_index(index, layout.SLOT_GENERATION_OFFSET)])

    def set_generation(self, index: int, generation: int) -> None:
        self._words[self._word_index(index, layout.SLOT_GENERATION_OFFSET)] = generation

    def output_generation(self, index: int) -> int:
        return int(self._words[self._word_index(index, layout.SLOT_OUTPUT_GENERATION_OFFSET)])

    def set_output_generation(self, index: int, generation: int) -> None:
        self._words[self._word_index(index, layout.SLOT_OUTPUT_GENERATION_OFFSET)] = generation

    # -- tensors ------------------------------------------------------------------
    def data_offset(self, index: int) -> int:
        if not 0 <= index < self.slot_count:
            raise IndexError(f"slot {index} out of range 0..{self.slot_count - 1}")
        return layout.slot_offset(index, self.slot_bytes) + layout.SLOT_HEADER_BYTES

    def tensor(self, index: int, offset: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        """A numpy view (no copy) of a tensor at `offset` in slot `index`'s data area."""
        dtype = np.dtype(dtype)
        count = 1
        for d in shape:
            count *= d
        if offset < 0 or offset + count * dtype.itemsize > self.data_capacity:
            raise IndexError(
                f"tensor of {count * dtype.itemsize} bytes at {offset} leaves slot data area "
                f"of {self.data_capacity} bytes"
            )
        start = self.data_offset(index) + offset
        return np.frombuffer(self.buf, dtype=dtype, count=count, offset=start).reshape(shape)

    def private_view(self, index: int, start: int, end: int) -> PrivateView | None:
        """Slot `index`'s data bytes [start, end) mapped copy-on-write; None where the segment has no
        file to map (not tmpfs-backed, or unlinked since: a restarted gateway's old ring)."""
        if not 0 <= start <= end <= self.data_capacity:
            raise IndexError(f"bytes [{start}, {end}) leave slot data area of {self.data_capacity} bytes")
        if end == start:
            return None
        if self._file_fd is None:
            try:
                self._file_fd = os.open(os.path.join(_SHM_DIR, self.name.lstrip("/")), os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                return None
        first = self.data_offset(index) + start
        mapped_from = first - first % mmap.ALLOCATIONGRANULARITY  # mmap's offset must be page-aligned
        try:
            mapping = mmap.mmap(
                self._file_fd,
                self.data_offset(index) + end - mapped_from,
                flags=mmap.MAP_PRIVATE,
                prot=mmap.PROT_READ | mmap.PROT_WRITE,
                offset=mapped_from,
            )
        except (OSError, ValueError):
            return None
        return PrivateView(mapping, start - (first - mapped_from))

    # -- lifetime -----------------------------------------------------------------
    def close(self) -> None:
        if self._file_fd is not None:
            os.close(self._file_fd)
            self._file_fd = None
        # numpy views keep the buffer exported; drop ours before closing the mapping.
        self._words = None
        self.buf = None
        try:
            self._shm.close()
        except BufferError:
            # A caller still holds a view; the mapping goes away with the process.
            log.debug("segment %s still has views at close", self.name)

    def unlink(self) -> None:
        """Remove the segment name. Only its creator does this."""
        if not self.owner:
            raise PermissionError(f"segment {self.name!r} is unlinked only by its creator")
        self._shm.unlink()


class PrivateView:
    """A copy-on-write mapping of part of one slot's data area (Segment.private_view).

    Arrays from `tensor` are writable and keep the mapping alive; it is unmapped when the last goes.
    """

    def __init__(self, mapping: mmap.mmap, base: int) -> None:
        self.mapping = mapping
        self.base = base  # the slot-data offset of the mapping's first byte

    def tensor(self, offset: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
        """A writable array over the tensor at slot-data `offset`; its writes stay in this process."""
        dtype = np.dtype(dtype)
        count = 1
        for d in shape:
            count *= d
        if offset < self.base or offset - self.base + count * dtype.itemsize > len(self.mapping):
            raise IndexError(f"tensor of {count * dtype.itemsize} bytes at {offset} leaves the private view")
        return np.frombuffer(self.mapping, dtype=dtype, count=count, offset=offset - self.base).reshape(shape)


def _reserve(name: str, size: int) -> None:
    """Allocate every page of the segment now, or raise SharedMemoryFull with the numbers."""
    path = os.path.join(_SHM_DIR, name.lstrip("/"))
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return  # not a tmpfs-backed name (another OS): nothing to reserve here
    try:
        reserve_pages(fd, name, size)
    finally:
        os.close(fd)


def reserve_pages(fd: int, name: str, size: int) -> None:
    """Every page of the open file `fd` (/dev/shm's `name`) now, or SharedMemoryFull with the numbers."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno not in (errno.ENOSPC, errno.ENOMEM):
            raise
        stat = os.statvfs(_SHM_DIR)
        raise SharedMemoryFull(
            name, size, stat.f_bavail * stat.f_frsize, stat.f_blocks * stat.f_frsize, _SHM_DIR
        ) from None


def segment_name(instance: str, role: str = "ring") -> str:
    """`ringserve-<instance>-<16 random hex digits>-<role>`: the instance (the creator's pid)
    first, for the sweep; the random part so that nobody can take the name beforehand."""
    return f"{SEGMENT_PREFIX}{instance}-{secrets.token_hex(8)}-{role}"


def sweep_stale_segments(alive: "callable[[int], bool]") -> list[str]:
    """Unlink segments left by a ringserve whose creator pid is gone. Returns their names.

    Names are `ringserve-<creator pid>-...`; a segment whose pid is still alive belongs to
    another running server, and one owned by another user is not ours: both are left alone.
    """
    removed = []
    try:
        entries = os.listdir(_SHM_DIR)
    except FileNotFoundError:
        return removed
    for entry in entries:
        if not entry.startswith(SEGMENT_PREFIX):
            continue
        pid_text = entry[len(SEGMENT_PREFIX) :].split("-", 1)[0]
        if not pid_text.isdigit() or alive(int(pid_text)):
            continue
        path = os.path.join(_SHM_DIR, entry)
        try:
            if os.stat(path).st_uid != os.geteuid():
                continue
            os.unlink(path)
            removed.append(entry)
        except FileNotFoundError:
            pass
    return removed
