"""shm/: the segment's byte layout, slot leases and generations, attach rules, stale sweeps."""
from __future__ import annotations

import os
import shlex
import shutil
import struct
import subprocess
import sys
from multiprocessing import resource_tracker, shared_memory
from pathlib import Path

import numpy as np
import pytest

from ringserve.shm import layout
from ringserve.shm import segment as segment_module
from ringserve.shm.errors import LayoutMismatch, StaleLease
from ringserve.shm.ring import Ring, SlotLease
from ringserve.shm.segment import Segment, sweep_stale_segments

from ..conftest import unique_name

SLOT_COUNT = 4
SLOT_BYTES = 2 * layout.PAGE_BYTES
# Above Linux's largest pid_max (2**22): no process can have it, and no other test's segment uses it.
DEAD_PID = 2**22 + 4242


@pytest.fixture
def attached(segment):
    other = Segment.attach(segment.name)
    try:
        yield other
    finally:
        other.close()


@pytest.fixture
def ring(segment):
    return Ring(segment)


# -- layout -------------------------------------------------------------------------
def test_pack_offsets_aligns_every_tensor_and_the_end_to_64_bytes():
    offsets, end = layout.pack_offsets([1, 64, 65, 0, 130], start=10)

    assert offsets == [64, 128, 192, 320, 320]
    assert end == 512


def test_pack_offsets_never_overlaps_tensors():
    sizes = [3, 100, 64, 1, 4096, 7]
    offsets, end = layout.pack_offsets(sizes, start=1000)

    assert all(o % layout.ALIGN_BYTES == 0 for o in offsets)
    assert offsets[0] >= 1000
    for (o, n), o_next in zip(zip(offsets, sizes), offsets[1:] + [end]):
        assert o + n <= o_next
    assert end % layout.ALIGN_BYTES == 0


def test_create_rounds_slot_bytes_up_to_pages_and_sizes_the_segment():
    seg = Segment.create(unique_name(), slot_count=3, slot_bytes=layout.PAGE_BYTES + 1)
    try:
        assert seg.slot_bytes == 2 * layout.PAGE_BYTES
        assert seg.data_capacity == 2 * layout.PAGE_BYTES - layout.SLOT_HEADER_BYTES
        assert len(seg.buf) >= layout.PAGE_BYTES + 3 * seg.slot_bytes
    finally:
        seg.close()
        seg.unlink()


@pytest.mark.parametrize("slot_count, slot_bytes", [(0, SLOT_BYTES), (1, layout.PAGE_BYTES)])
def test_create_refuses_too_few_slots_or_too_small_slots(slot_count, slot_bytes):
    name = unique_name()
    with pytest.raises(ValueError):
        Segment.create(name, slot_count=slot_count, slot_bytes=slot_bytes)
    assert not Path("/dev/shm", name).exists()


# -- ring: fill, wrap, generations ------------------------------------------------------
def test_fill_hands_out_every_slot_once_then_none(ring):
    leases = [ring.acquire() for _ in range(SLOT_COUNT)]

    assert [lease.index for lease in leases] == [0, 1, 2, 3]
    assert ring.acquire() is None
    assert ring.free_count == 0


def test_acquire_continues_in_ring_order_and_wraps_to_zero(ring):
    first = [ring.acquire() for _ in range(3)]  # slots 0, 1, 2
    ring.release(first[0])

    # Slot 0 is free again, but the ring goes on to 3 before coming back round to 0.
    assert ring.acquire().index == 3
    wrapped = ring.acquire()
    assert wrapped.index == 0
    assert ring.acquire() is None


def test_each_acquire_bumps_the_generation_and_writes_it_into_the_slot_header(ring, segment):
    segment.set_output_generation(0, 99)  # left over from an earlier batch
    lease = ring.acquire()

    assert lease == SlotLease(0, 1)
    assert segment.generation(0) == 1
    assert segment.output_generation(0) == 0  # outputs of the previous lease are not vouched for

    ring.release(lease)
    for _ in range(SLOT_COUNT - 1):
        ring.release(ring.acquire())  # slots 1..3
    again = ring.acquire()

    assert again == SlotLease(0, 2)
    assert segment.generation(0) == 2


def test_a_new_ring_continues_from_the_generations_in_the_header(segment):
    Ring(segment).acquire()  # slot 0 -> generation 1

    restarted = Ring(segment)  # e.g. a restarted gateway on the same segment

    assert restarted.acquire() == SlotLease(0, 2)


def test_release_with_a_stale_lease_raises_and_keeps_the_slot_leased(ring):
    old = ring.acquire()
    ring.release(old)
    for _ in range(SLOT_COUNT - 1):
        ring.release(ring.acquire())
    current = ring.acquire()
    assert current.index == old.index

    with pytest.raises(StaleLease) as info:
        ring.release(old)

    assert (info.value.index, info.value.generation, info.value.current) == (0, 1, 2)
    assert ring.free_count == SLOT_COUNT - 1
    ring.release(current)
    assert ring.free_count == SLOT_COUNT


def test_double_release_raises(ring):
    lease = ring.acquire()
    ring.release(lease)

    with pytest.raises(StaleLease):
        ring.release(lease)
    assert ring.free_count == SLOT_COUNT


# -- bounds ------------------------------------------------------------------------------
def test_tensor_may_end_exactly_at_the_end_of_the_data_area(segment):
    last = segment.data_capacity - 16
    view = segment.tensor(SLOT_COUNT - 1, last, np.float32, (4,))
    view[:] = [1, 2, 3, 4]

    assert segment.tensor(SLOT_COUNT - 1, last, np.float32, (4,)).tolist() == [1, 2, 3, 4]


@pytest.mark.parametrize("offset, shape", [
    (None, (5,)),      # starts inside, one element past the end
    (0, (2, 2048)),    # bigger than the whole data area
    (-64, (4,)),       # before the data area (the slot header)
])
def test_tensor_outside_the_data_area_raises(segment, offset, shape):
    if offset is None:
        offset = segment.data_capacity - 16

    with pytest.raises(IndexError):
        segment.tensor(0, offset, np.float32, shape)


@pytest.mark.parametrize("index", [-1, SLOT_COUNT])
def test_tensor_in_a_slot_out_of_range_raises(segment, index):
    with pytest.raises(IndexError):
        segment.tensor(index, 0, np.uint8, (1,))


def test_filling_a_slot_leaves_the_next_slot_header_alone(ring, segment):
    leases = [ring.acquire(), ring.acquire()]
    segment.tensor(0, 0, np.uint8, (segment.data_capacity,))[:] = 0xFF

    assert segment.generation(1) == leases[1].generation
    assert segment.output_generation(1) == 0
    assert int(segment.tensor(1, 0, np.uint8, (1,))[0]) == 0


# -- attach ------------------------------------------------------------------------------
def test_attach_reads_the_creators_header(segment, attached):
    assert attached.owner is False
    assert (attached.slot_count, attached.slot_bytes) == (SLOT_COUNT, segment.slot_bytes)
    assert attached.creator_pid == os.getpid()


def test_attach_sees_the_same_bytes_and_slot_headers(segment, attached):
    values = np.arange(12, dtype=np.float32).reshape(3, 4)
    segment.tensor(2, 128, np.float32, (3, 4))[:] = values
    segment.set_generation(2, 7)
    attached.set_output_generation(2, 7)

    assert np.array_equal(attached.tensor(2, 128, np.float32, (3, 4)), values)
    assert attached.generation(2) == 7
    assert segment.output_generation(2) == 7


def test_a_non_owner_cannot_unlink(segment, attached):
    with pytest.raises(PermissionError):
        attached.unlink()

    assert Path("/dev/shm", segment.name).exists()


def test_attach_does_not_register_with_the_resource_tracker(segment, monkeypatch):
    registered = []
    monkeypatch.setattr(resource_tracker, "register", lambda name, rtype: registered.append((name, rtype)))

    # The recorder works: a plain SharedMemory open would be tracked (and unlinked at exit).
    plain = shared_memory.SharedMemory(segment.name)
    plain.close()
    assert registered == [(f"/{segment.name}", "shared_memory")]
    registered.clear()

    other = Segment.attach(segment.name)
    other.close()

    assert registered == []


def test_bad_magic_is_a_layout_mismatch(segment):
    segment.buf[0:8] = b"NOTARING"

    with pytest.raises(LayoutMismatch) as info:
        Segment.attach(segment.name)

    assert (info.value.field, info.value.expected, info.value.found) == ("magic", layout.MAGIC, b"NOTARING")


def test_other_layout_version_is_a_layout_mismatch(segment):
    struct.pack_into("<I", segment.buf, 8, layout.LAYOUT_VERSION + 1)

    with pytest.raises(LayoutMismatch) as info:
        Segment.attach(segment.name)

    assert info.value.field == "layout version"
    assert info.value.found == layout.LAYOUT_VERSION + 1


# -- sweeping segments of dead servers ------------------------------------------------------
def test_sweep_removes_only_ringserve_names_whose_pid_is_dead(tmp_path, monkeypatch):
    monkeypatch.setattr(segment_module, "_SHM_DIR", str(tmp_path))
    names = ["ringserve-111-ring", "ringserve-111-test-abc", "ringserve-222-ring",
             "ringserve-abc-ring", "ringserve-", "other-111-ring", "sem.ringserve-111"]
    for name in names:
        (tmp_path / name).write_bytes(b"x")
    asked = []

    def alive(pid: int) -> bool:
        asked.append(pid)
        return pid == 222

    removed = sweep_stale_segments(alive)

    assert sorted(removed) == ["ringserve-111-ring", "ringserve-111-test-abc"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(set(names) - set(removed))
    assert sorted(set(asked)) == [111, 222]


def test_sweep_without_a_shm_directory_removes_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(segment_module, "_SHM_DIR", str(tmp_path / "missing"))

    assert sweep_stale_segments(lambda pid: False) == []


def test_sweep_unlinks_a_real_segment_of_a_dead_pid_and_spares_live_ones(segment):
    stale = Segment.create(unique_name(DEAD_PID), slot_count=1, slot_bytes=SLOT_BYTES)
    try:
        removed = sweep_stale_segments(lambda pid: pid != DEAD_PID)

        assert removed == [stale.name]
        assert not Path("/dev/shm", stale.name).exists()
        assert Path("/dev/shm", segment.name).exists()
        with pytest.raises(FileNotFoundError):
            Segment.attach(stale.name)
    finally:
        stale.close()
        if Path("/dev/shm", stale.name).exists():
            stale.unlink()
        else:
            # The sweep unlinked it behind the tracker's back: tell the tracker, or it warns at exit.
            resource_tracker.unregister(f"/{stale.name}", "shared_memory")


def test_sweep_leaves_a_stale_segment_of_another_user_alone(tmp_path, monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("needs root to give a file to another user")
    monkeypatch.setattr(segment_module, "_SHM_DIR", str(tmp_path))
    ours, theirs = tmp_path / "ringserve-111-aa-ring", tmp_path / "ringserve-111-bb-ring"
    ours.write_bytes(b"x")
    theirs.write_bytes(b"x")
    os.chown(theirs, 65534, 65534)

    assert sweep_stale_segments(lambda pid: False) == [ours.name]
    assert theirs.exists()


# -- names nobody can take beforehand ---------------------------------------------------------
def test_segment_names_carry_the_pid_first_and_a_random_part():
    first, second = segment_module.segment_name("123"), segment_module.segment_name("123")

    assert first.startswith("ringserve-123-") and first.endswith("-ring") and first != second
    assert len(first.split("-")[2]) == 16


def test_a_name_taken_by_someone_else_is_tried_anew(monkeypatch):
    taken = shared_memory.SharedMemory(unique_name(), create=True, size=4096)
    names = iter([taken.name, unique_name()])
    monkeypatch.setattr(segment_module, "segment_name", lambda instance, role="ring": next(names))
    try:
        created = Segment.create_unique("x", slot_count=1, slot_bytes=SLOT_BYTES)
        try:
            assert created.name != taken.name and created.owner
        finally:
            created.close()
            created.unlink()
    finally:
        taken.close()
        taken.unlink()


def test_a_ring_larger_than_the_free_shared_memory_is_refused_with_the_numbers(tmp_path, monkeypatch):
    """posix_fallocate on a tmpfs too small: the creation fails and leaves nothing, where the sparse
    segment used to be created and the first write past the free space raised SIGBUS."""
    script = (
        "import sys\n"
        "from ringserve.shm.errors import SharedMemoryFull\n"
        "from ringserve.shm.segment import Segment\n"
        "try:\n"
        "    Segment.create_unique('4242', slot_count=8, slot_bytes=2 << 20)\n"
        "except SharedMemoryFull as exc:\n"
        "    import os; print(exc); print(os.listdir('/dev/shm')); sys.exit(0)\n"
        "sys.exit('created a 16 MiB ring in an 8 MiB /dev/shm')\n"
    )
    done = in_small_shm(8, [sys.executable, "-c", script])
    assert done.returncode == 0, done.stderr
    message, listing = done.stdout.splitlines()
    assert message == "cannot reserve 16 MiB of shared memory for the ring: /dev/shm has 8 MiB free of 8 MiB"
    assert listing == "[]"


def in_small_shm(size_mib: float, command: list[str]) -> subprocess.CompletedProcess:
    """Run command in a private mount namespace whose /dev/shm is a tmpfs of size_mib (root only)."""
    if os.geteuid() != 0:
        pytest.skip("needs root for a private mount namespace with a small tmpfs on /dev/shm")
    if shutil.which("unshare") is None:
        pytest.skip("unshare (util-linux) is not installed")
    probe = subprocess.run(["unshare", "-m", "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip(f"no private mount namespace here: {probe.stderr.decode().strip()}")
    shell = f"mount -t tmpfs -o size={round(size_mib * 1024)}k tmpfs /dev/shm && exec {shlex.join(command)}"
    return subprocess.run(["unshare", "-m", "sh", "-c", shell], capture_output=True, text=True, timeout=120)


# -- private views ------------------------------------------------------------------
def test_a_private_view_reads_the_slot_and_its_writes_stay_private(segment, attached):
    slot, offset = 2, 3 * layout.PAGE_BYTES // 2 - 64  # not page-aligned: the mapping starts before it
    shared = segment.tensor(slot, offset, np.float32, (2, 16))
    shared[:] = np.arange(32, dtype=np.float32).reshape(2, 16)
    view = attached.private_view(slot, offset, offset + shared.nbytes)

    private = view.tensor(offset, np.float32, (2, 16))
    np.testing.assert_array_equal(private, shared)
    private *= 2  # writable, as Triton's as_numpy() is

    np.testing.assert_array_equal(shared, np.arange(32, dtype=np.float32).reshape(2, 16))
    np.testing.assert_array_equal(attached.tensor(slot, offset, np.float32, (2, 16)), shared)
    assert private[1, 15] == 62.0
    with pytest.raises(IndexError):
        view.tensor(offset + shared.nbytes, np.float32, (1,))


def test_an_empty_span_has_no_private_view_and_a_span_past_the_slot_is_refused(segment):
    assert segment.private_view(0, 128, 128) is None
    with pytest.raises(IndexError):
        segment.private_view(0, 0, segment.data_capacity + 1)
