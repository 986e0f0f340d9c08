"""Per-model queues and batches: collect requests, write them into a slot, split outputs.

Requests batch together only when their non-batch shapes are equal (Triton's rule), so
each model keeps one FIFO per shape. Batches that a dead worker held come back to the
head of their model's queue (`requeued`) and keep their slot: inputs are never copied
twice.
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from common.config import ModelConfig, numpy_dtype
from common.wire import TensorRef
from shm.layout import pack_offsets
from shm.ring import SlotLease
from shm.segment import Segment

from .codec import InferRequest, alignment_slack_bytes


@dataclass(eq=False)
class SlotUse:
    """A leased slot and the batches still using it (halves of a bisected batch share it)."""

    lease: SlotLease
    open_batches: int = 1
    running: bool = False  # batches of one slot run one at a time: they share its output area


@dataclass(eq=False)
class Batch:
    batch_id: int
    model: ModelConfig
    requests: list[InferRequest]
    slot: SlotUse
    inputs: list[TensorRef]  # this batch's rows inside the slot
    output_offset: int
    attempt: int = 0
    crash_reasons: list[str] = field(default_factory=list)
    worker: object = None  # the WorkerHandle running it, while it runs
    sent_at: float = 0.0

    @property
    def rows(self) -> int:
        return sum(r.rows for r in self.requests)

    def split(self, batch_ids: Iterator[int]) -> tuple[Batch, Batch]:
        """Two halves over the same slot rows, for isolating a request that kills workers."""
        half = len(self.requests) // 2
        first_rows = sum(r.rows for r in self.requests[:half])
        batched = self.model.max_batch_size > 0
        halves = []
        for reqs, row_start in ((self.requests[:half], 0), (self.requests[half:], first_rows)):
            rows = sum(r.rows for r in reqs)
            refs = [_row_range(ref, row_start, rows) for ref in self.inputs] if batched else self.inputs
            halves.append(Batch(next(batch_ids), self.model, reqs, self.slot, refs,
                                self.output_offset, self.attempt, list(self.crash_reasons)))
        self.slot.open_batches += 1
        return halves[0], halves[1]


def _row_range(ref: TensorRef, row_start: int, rows: int) -> TensorRef:
    row_bytes = numpy_dtype(ref.datatype).itemsize * math.prod(ref.shape[1:])
    return TensorRef(ref.name, ref.datatype, (rows, *ref.shape[1:]), ref.offset + row_start * row_bytes)


class ModelQueue:
    """Pending requests of one model, one FIFO per input shape, plus requeued batches."""

    def __init__(self, config: ModelConfig, slot_capacity_bytes: int) -> None:
        self.config = config
        self.slot_capacity_bytes = slot_capacity_bytes
        self.groups: dict[tuple, deque[InferRequest]] = {}
        self.requeued: deque[Batch] = deque()
        self.depth = 0
        self.flush_timer = None
        batching = config.dynamic_batching
        self.max_queue_delay_s = batching.max_queue_delay_us / 1e6 if batching else 0.0

    def submit(self, request: InferRequest) -> None:
        self.groups.setdefault(request.shape_key, deque()).append(request)
        self.depth += 1

    def discard(self, request: InferRequest) -> bool:
        group = self.groups.get(request.shape_key)
        if group is None or request not in group:
            return False
        group.remove(request)
        self.depth -= 1
        return True

    def oldest_group(self) -> deque[InferRequest] | None:
        best = None
        for group in self.groups.values():
            if group and (best is None or group[0].enqueued_at < best[0].enqueued_at):
                best = group
        return best

    def max_rows(self, sample: InferRequest) -> int:
        """Rows per batch: max_batch_size, or fewer when a slot cannot hold that many."""
        if self.config.max_batch_size == 0:
            return 1
        row_bytes = self.config.fixed_output_row_bytes
        for array in sample.inputs.values():
            row_bytes += array.nbytes // array.shape[0]
        spare = self.slot_capacity_bytes - alignment_slack_bytes(self.config)
        return max(1, min(self.config.max_batch_size, spare // max(row_bytes, 1)))

    def flush_due(self, now: float) -> float | None:
        """None when the oldest group should be sent now, else the time it becomes due."""
        group = self.oldest_group()
        if group is None or self.max_queue_delay_s <= 0:
            return None
        rows = sum(r.rows for r in group)
        if rows >= self.max_rows(group[0]):
            return None
        due = group[0].enqueued_at + self.max_queue_delay_s
        return None if now >= due else due

    def collect_batch(self) -> list[InferRequest]:
        """FIFO requests of the oldest shape group, as many as fit one batch."""
        group = self.oldest_group()
        if group is None:
            return []
        limit = self.max_rows(group[0])
        taken: list[InferRequest] = []
        rows = 0
        # The head always goes: it passed the 413 check, which uses the same rule as max_rows.
        while group and (not taken or rows + group[0].rows <= limit):
            request = group.popleft()
            taken.append(request)
            rows += request.rows
            if self.config.max_batch_size == 0:
                break
        self.depth -= len(taken)
        return taken


def write_batch(segment: Segment, lease: SlotLease, requests: list[InferRequest]) -> tuple[list[TensorRef], int]:
    """Copy each request's tensors once, straight into their rows of the slot.

    Returns the input refs and the offset where the worker may start writing outputs.
    """
    first = requests[0]
    batched = first.model.max_batch_size > 0
    total_rows = sum(r.rows for r in requests)
    shapes = [((total_rows, *a.shape[1:]) if batched else a.shape) for a in first.inputs.values()]
    nbytes = [a.itemsize * math.prod(s) for a, s in zip(first.inputs.values(), shapes)]
    offsets, end = pack_offsets(nbytes)
    refs = []
    for (name, sample), shape, offset in zip(first.inputs.items(), shapes, offsets):
        dst = segment.tensor(lease.index, offset, sample.dtype, shape)
        if not batched:  # one request, its tensors as sent
            dst[...] = first.inputs[name]
        else:
            row = 0
            for request in requests:
                dst[row:row + request.rows] = request.inputs[name]
                row += request.rows
        refs.append(TensorRef(name, first.model.input(name).datatype, shape, offset))
    return refs, end


def split_outputs(segment: Segment, batch: Batch, outputs: list[TensorRef]) -> list[dict[str, np.ndarray]]:
    """Each request's rows of every output, copied out so the slot can be freed at once."""
    views = {ref.name: segment.tensor(batch.slot.lease.index, ref.offset, numpy_dtype(ref.datatype), ref.shape)
             for ref in outputs}
    if batch.model.max_batch_size == 0:
        return [{name: view.copy() for name, view in views.items()}]
    per_request = []
    row = 0
    for request in batch.requests:
        per_request.append({name: view[row:row + request.rows].copy() for name, view in views.items()})
        row += request.rows
    return per_request
