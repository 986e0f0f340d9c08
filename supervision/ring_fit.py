"""Fitting the gateways' rings to the shared memory there is (Docker's default /dev/shm is 64 MiB).

The configured rings (--slot-count × --slot-mb each, one per gateway) used to stop the server
with exit 5 wherever /dev/shm was smaller; a default `docker run` was such a place. Now they are
cut to fit, with a warning that says what was cut, and the server refuses only when not even one
slot of its largest model fits.

The rule (`fit_rings`), on the free bytes of /dev/shm after the stale sweep:
1. As configured, when G rings fit.
2. Else, with HEADROOM_BYTES left to others (unless only without it one slot fits), fewer slots of
   the configured size, while at least MIN_FITTED_SLOTS of them fit: every batch that fit a slot
   still does, fewer run at once.
3. Else smaller slots (MIN_FITTED_SLOTS, then 1), as long as a slot holds one full batch of the
   largest model (`model_slot_bytes`): the batcher cuts batches to what a slot holds.
4. Else refused, with the bytes one slot of the largest model needs.
A restarted gateway's ring is made once the dead one's is unlinked; a worker still running a batch of
the dead gateway maps the old ring until that batch ends (tmpfs frees pages with their last mapping),
so the restart waits for the room (supervision/gateways.py) rather than sizing every ring for two.
Run in the supervisor process only.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from ringserve.common.repository.config import ModelConfig
from ringserve.shm import layout

log = logging.getLogger(__name__)

# Left to others when the rings are cut: Python's semaphores, a client's small shared-memory regions.
HEADROOM_BYTES = 1024 * 1024
MIN_FITTED_SLOTS = 2  # one slot being written while another runs: below that, batches queue behind each other
MIB = 1024 * 1024


@dataclass(frozen=True)
class RingSize:
    slot_count: int
    slot_bytes: int

    @property
    def segment_bytes(self) -> int:
        return layout.segment_bytes(self.slot_count, self.slot_bytes)

    def describe(self) -> str:
        return f"{self.slot_count} slot{'s' if self.slot_count != 1 else ''} of {_mib(self.slot_bytes)}"


def fit_rings(configured: RingSize, free_bytes: int, gateway_count: int, need_slot_bytes: int) -> RingSize | None:
    """The rings that fit `free_bytes` (the module's rule), or None when not even one slot of
    `need_slot_bytes` fits each gateway's ring."""
    if gateway_count * configured.segment_bytes <= free_bytes:
        return configured
    for headroom in (HEADROOM_BYTES, 0):  # (the headroom never costs the last slot that fits)
        room = (free_bytes - headroom) // gateway_count - layout.SEGMENT_HEADER_BYTES
        size = _cut(configured, room, need_slot_bytes)
        if size is not None:
            return size
    return None


def _cut(configured: RingSize, room: int, need_slot_bytes: int) -> RingSize | None:
    whole = min(room // configured.slot_bytes, configured.slot_count)
    if whole >= MIN_FITTED_SLOTS:
        return RingSize(whole, configured.slot_bytes)
    smallest = smallest_slot_bytes(need_slot_bytes)
    for count in range(min(MIN_FITTED_SLOTS, configured.slot_count), 0, -1):
        slot_bytes = min(room // count // layout.PAGE_BYTES * layout.PAGE_BYTES, configured.slot_bytes)
        if slot_bytes >= smallest:
            return RingSize(count, slot_bytes)
    return None


def smallest_slot_bytes(need_slot_bytes: int) -> int:
    """The smallest slot that holds `need_slot_bytes`: whole pages, and at least the two a segment allows."""
    return max(layout.align_up(need_slot_bytes, layout.PAGE_BYTES), 2 * layout.PAGE_BYTES)


def needed_bytes(ring_count: int, need_slot_bytes: int) -> int:
    """Shared memory for `ring_count` rings of one slot of the largest model each."""
    return ring_count * RingSize(1, smallest_slot_bytes(need_slot_bytes)).segment_bytes


def model_slot_bytes(config: ModelConfig) -> int:
    """Bytes a slot needs for one full batch (max_batch_size rows) of `config`: its inputs and outputs,
    a variable dim counted at its `max_shapes` bound, or 1 where it has none (its batches are cut to
    what a slot holds); BYTES tensors not counted (their size is the client's)."""
    rows = max(config.max_batch_size, 1)
    bounds = config.max_dims
    row_bytes = 0
    for tensor in (*config.inputs, *config.outputs):
        if tensor.datatype == "BYTES":
            continue
        dims = bounds.get(tensor.name, tensor.dims)
        row_bytes += math.prod(max(d, 1) for d in dims) * tensor.np_dtype.itemsize
    slack = layout.ALIGN_BYTES * (len(config.inputs) + len(config.batch_inputs) + len(config.outputs))
    return layout.SLOT_HEADER_BYTES + rows * row_bytes + slack


def largest_model_slot_bytes(configs: Iterable[ModelConfig]) -> int:
    return max((model_slot_bytes(c) for c in configs), default=2 * layout.PAGE_BYTES)


def repository_slot_bytes(repository: str) -> int:
    """`largest_model_slot_bytes` of the repository's served versions (read only when the rings must shrink)."""
    from ringserve.common.repository.scan import scan_repository  # noqa: PLC0415 - reads ONNX graphs: only when cutting

    try:
        return largest_model_slot_bytes(scan_repository(Path(repository)).all_versions())
    except Exception as exc:  # noqa: BLE001 - the gateway reports an unreadable repository; size for none
        log.debug("repository %s unreadable while fitting the rings: %s", repository, exc)
        return 2 * layout.PAGE_BYTES


def free_shared_memory_bytes(directory: str = "/dev/shm") -> int | None:
    """Free bytes of the tmpfs that holds the rings, or None where there is none to ask."""
    try:
        stat = os.statvfs(directory)
    except OSError:
        return None
    return stat.f_bavail * stat.f_frsize


def choose_rings(
    configured: RingSize,
    gateway_count: int,
    need_slot_bytes: Callable[[], int],
    free_bytes: int | None,
    directory: str = "/dev/shm",
) -> RingSize:
    """The rings to make: `fit_rings`' choice, with the warning that says what was cut and how to give more.

    Raises RingsDoNotFit when not even one slot of the largest model fits each gateway.
    """
    if free_bytes is None or gateway_count * configured.segment_bytes <= free_bytes:
        return configured
    need = need_slot_bytes()
    size = fit_rings(configured, free_bytes, gateway_count, need)
    if size is None:
        raise RingsDoNotFit(directory, free_bytes, gateway_count, need, gateway_count * configured.segment_bytes)
    log.warning(
        "%s has %s free: the ring%s of the %d gateway%s cut from %s to %s each (configured: --slot-count %d "
        "--slot-mb %d); a batch is cut to what a slot holds, and fewer run at once. For the configured rings "
        "give %s %s or more (docker run --shm-size=%dm, or the tmpfs mount's size=), or choose the cut "
        "yourself with --slot-count/--slot-mb",
        directory,
        _mib(free_bytes),
        "s" if gateway_count != 1 else "",
        gateway_count,
        "s" if gateway_count != 1 else "",
        configured.describe(),
        size.describe(),
        configured.slot_count,
        configured.slot_bytes // MIB,
        directory,
        _mib(gateway_count * configured.segment_bytes),
        -(-gateway_count * configured.segment_bytes // MIB),
    )
    return size


class RingsDoNotFit(Exception):
    """Not even one slot of the largest model fits each gateway's ring."""

    def __init__(
        self, directory: str, free_bytes: int, gateway_count: int, slot_bytes: int, configured_bytes: int
    ) -> None:
        self.directory, self.free_bytes = directory, free_bytes
        self.needed_bytes = needed_bytes(gateway_count, slot_bytes)
        super().__init__(
            f"{directory} has {_mib(free_bytes)} free; one slot of the largest model needs {_mib(slot_bytes)}, so "
            f"{gateway_count} gateway ring{'s' if gateway_count != 1 else ''} of one slot need at least "
            f"{_mib(self.needed_bytes)}: give {directory} more (docker run --shm-size=, or the tmpfs mount's "
            f"size=; the configured rings need {_mib(configured_bytes)}), or fewer --gateways"
        )


def _mib(size_bytes: int) -> str:
    if size_bytes < MIB:
        return f"{-(-size_bytes // 1024)} KiB"
    return f"{size_bytes / MIB:.3f}".rstrip("0").rstrip(".") + " MiB"
