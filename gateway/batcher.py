"""Per-model queues and batches: collect requests, write them into a slot, split outputs.

A model's queue has one lane per priority level (Triton's priority_levels, 1 = highest)
and, within it, one FIFO per group of requests that may share a network call: equal
non-batch shapes (Triton's rule) or, for padded models, one length bucket
(gateway/padding.py). Batches that a dead worker held come back to the head of their
model's queue (`requeued`) and keep their slot: inputs are never copied twice.

BYTES tensors lie in a slot in KServe's binary BYTES form (common/wire.py): a batch's BYTES
input is its requests' serialized elements one after another, in row order, and a BYTES
output is read back from that form and split by rows like any other.
"""
from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np

from ringserve.common.datatypes import numpy_dtype
from ringserve.common.model_config import DynamicBatching, ModelConfig, QueuePolicy
from ringserve.common.wire import BytesTensorRef, TensorRef, deserialize_bytes_tensor
from ringserve.shm.layout import ALIGN_BYTES, pack_offsets
from ringserve.shm.ring import SlotLease
from ringserve.shm.segment import Segment

from .codec import InferRequest, alignment_slack_bytes, input_slot_bytes
from .errors import Unavailable
from .padding import group_key, padded_shapes
from .ragged import batch_input_tensor, batch_inputs_nbytes, element_offsets
from .sizing import LatencyTargetSizer


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
    rewrite: bool = False  # written into its slot again each time it is sent (a half that views can't give)

    @property
    def rows(self) -> int:
        return sum(r.rows for r in self.requests)

    def split(self, batch_ids: Iterator[int]) -> tuple[Batch, Batch]:
        """Two halves over the same slot, for isolating a request that kills workers.

        Where a half's inputs are a row range of the batch's (stacked and BYTES inputs), the
        halves point into the slot as it is. Where they are not (ragged inputs are element
        ranges, batch_input tensors and padding are computed over the whole batch), each half
        is written into the slot again from its requests when it is sent (`rewrite`): halves
        of a slot run one at a time, so that never overwrites a running one.
        """
        half = len(self.requests) // 2
        first_rows = sum(r.rows for r in self.requests[:half])
        batched = self.model.max_batch_size > 0
        rewrite = self.rewrite or (batched and not _rows_are_views(self.model))
        halves = []
        for reqs, before, row_start in ((self.requests[:half], [], 0),
                                        (self.requests[half:], self.requests[:half], first_rows)):
            rows = sum(r.rows for r in reqs)
            refs = [] if rewrite else [
                _bytes_range(ref, before, reqs) if isinstance(ref, BytesTensorRef)
                else _row_range(ref, row_start, rows) for ref in self.inputs] if batched else self.inputs
            halves.append(Batch(next(batch_ids), self.model, reqs, self.slot, refs,
                                self.output_offset, self.attempt, list(self.crash_reasons), rewrite=rewrite))
        self.slot.open_batches += 1
        return halves[0], halves[1]


def _rows_are_views(config: ModelConfig) -> bool:
    """Is a row range of a batch's inputs the same as the inputs of those requests alone?"""
    batching = config.dynamic_batching
    return not (config.ragged_inputs or config.batch_inputs
                or (batching and (batching.padding is not None or batching.pad_to_preferred_batch_size)))


def _row_range(ref: TensorRef, row_start: int, rows: int) -> TensorRef:
    row_bytes = numpy_dtype(ref.datatype).itemsize * math.prod(ref.shape[1:])
    return TensorRef(ref.name, ref.datatype, (rows, *ref.shape[1:]), ref.offset + row_start * row_bytes)


def _bytes_range(ref: BytesTensorRef, before: list[InferRequest], taken: list[InferRequest]) -> BytesTensorRef:
    """The `taken` requests' part of a BYTES input: their serialized elements follow those of `before`."""
    start = sum(len(r.serialized[ref.name]) for r in before)
    nbytes = sum(len(r.serialized[ref.name]) for r in taken)
    rows = sum(r.rows for r in taken)
    return BytesTensorRef(ref.name, ref.datatype, (rows, *ref.shape[1:]), ref.offset + start, nbytes)


@dataclass(eq=False)
class Group:
    """Requests that may share a batch, in arrival order; `delayed` ones (DELAY timeouts) go last."""

    live: deque[InferRequest] = field(default_factory=deque)
    delayed: deque[InferRequest] = field(default_factory=deque)

    def head(self) -> InferRequest | None:
        return self.live[0] if self.live else (self.delayed[0] if self.delayed else None)

    def __len__(self) -> int:
        return len(self.live) + len(self.delayed)


class ModelQueue:
    """Pending requests of one model: per priority level (1 = highest), per shape group or bucket.

    Batches that a dead worker held wait in `requeued` and always go first.
    """

    def __init__(self, config: ModelConfig, slot_capacity_bytes: int) -> None:
        self.config = config
        self.batching = config.dynamic_batching or DynamicBatching()
        self.slot_capacity_bytes = slot_capacity_bytes
        self.levels = list(range(1, self.batching.priority_levels + 1)) or [0]
        self.groups: dict[int, dict[tuple, Group]] = {level: {} for level in self.levels}
        self.level_depth = dict.fromkeys(self.levels, 0)
        self.requeued: deque[Batch] = deque()
        self.depth = 0
        self.flush_timer = None
        # The dispatcher's deadline watch (Dispatcher._watch_deadline): the lanes' heads, a heap
        # of (deadline, seq, request) for the exceptions, one loop timer for the earliest.
        self.deadlines: list[tuple[float, int, InferRequest]] = []
        self.deadline_timer = None
        self.deadline_at = float("inf")
        self.max_queue_delay_s = self.batching.max_queue_delay_us / 1e6
        self.preferred = sorted(s for s in self.batching.preferred_batch_size if s <= max(config.max_batch_size, 1))
        target_s = self.batching.latency_target_ms / 1e3
        self.sizer = LatencyTargetSizer(target_s, max(config.max_batch_size, 1)) if target_s else None
        # Whether a batch that max_rows allows may still overflow the slot: padded batches grow with
        # their longest request, BYTES and ragged inputs differ in size from request to request, and
        # generated batch_input tensors come on top (max_rows estimates from the head request only).
        self.checks_fit = bool(self.batching.padding is not None or self.batching.pad_to_preferred_batch_size
                               or config.bytes_inputs or config.ragged_inputs or config.batch_inputs)

    # -- membership -------------------------------------------------------------------
    def level_of(self, request: InferRequest) -> int:
        return request.priority or self.batching.default_priority_level or self.levels[0]

    def policy_of(self, request: InferRequest) -> QueuePolicy:
        return self.batching.policy_for(self.level_of(request))

    def submit(self, request: InferRequest) -> None:
        """Queue it; 503 when its priority level's queue is full (Triton: max_queue_size)."""
        level = self.level_of(request)
        limit = self.batching.policy_for(level).max_queue_size
        if limit and self.level_depth[level] >= limit:
            raise Unavailable(f"exceeds maximum queue size: model {self.config.name!r} already has {limit} "
                              f"request(s) waiting at priority level {level}; retry later")
        key = group_key(self.config, request.inputs, request.shape_key)
        group = self.groups[level].get(key)
        if group is None:
            group = self.groups[level][key] = Group()
        group.live.append(request)
        request.group = key
        self.level_depth[level] += 1
        self.depth += 1

    def _group_of(self, request: InferRequest) -> Group | None:
        return self.groups[self.level_of(request)].get(request.group)

    def discard(self, request: InferRequest) -> bool:
        group = self._group_of(request)
        for lane in (group.live, group.delayed) if group else ():
            if request in lane:
                lane.remove(request)
                self._forget(request)
                return True
        return False

    def delay(self, request: InferRequest) -> bool:
        """DELAY timeout action: move an expired request behind every unexpired one of its group."""
        group = self._group_of(request)
        if group is None or request not in group.live:
            return False
        group.live.remove(request)
        group.delayed.append(request)
        return True

    def _forget(self, request: InferRequest) -> None:
        self.level_depth[self.level_of(request)] -= 1
        self.depth -= 1

    # -- forming batches -------------------------------------------------------------
    def head_key(self) -> tuple | None:
        """The group to serve next: in the highest level that has requests, the oldest head's.

        Unexpired requests rank before delayed ones (DELAY): a group whose only requests
        timed out waits until no other group of its level has a live one.
        """
        for level in self.levels:
            groups = self.groups[level]
            for lane in ("live", "delayed"):
                heads = [(getattr(g, lane)[0].enqueued_at, key) for key, g in groups.items() if getattr(g, lane)]
                if heads:
                    return min(heads, key=lambda pair: pair[0])[1]
        return None

    def live_lanes(self) -> Iterator[deque[InferRequest]]:
        """Every group's FIFO of unexpired requests, in every priority level."""
        for groups in self.groups.values():
            for group in groups.values():
                yield group.live

    def drain_all(self) -> list[InferRequest]:
        """Empty the queue (requeued batches aside) and return what was waiting."""
        waiting = []
        for groups in self.groups.values():
            for group in groups.values():
                waiting += [*group.live, *group.delayed]
            groups.clear()
        self.level_depth = dict.fromkeys(self.levels, 0)
        self.depth = 0
        return waiting

    def _candidates(self, key: tuple):
        """Requests of one group key across priority levels, highest level first, FIFO within."""
        for level in self.levels:
            group = self.groups[level].get(key)
            if group:
                yield from group.live
                yield from group.delayed

    def max_rows(self, sample: InferRequest) -> int:
        """Rows per batch: max_batch_size (or the latency cap), fewer when a slot can't hold them."""
        if self.config.max_batch_size == 0:
            return 1
        row_bytes = self.config.fixed_output_row_bytes
        if sample.serialized is None:
            for array in sample.inputs.values():
                row_bytes += array.nbytes // array.shape[0]
        else:  # BYTES rows differ in size: the sample's average (_fits checks each batch)
            row_bytes += -(-input_slot_bytes(sample) // sample.rows)
        spare = self.slot_capacity_bytes - alignment_slack_bytes(self.config)
        cap = self.sizer.cap if self.sizer else self.config.max_batch_size
        return max(1, min(cap, spare // max(row_bytes, 1)))

    def flush_due(self, now: float) -> float | None:
        """None when the next batch should go now, else when it becomes due (max_queue_delay)."""
        key = self.head_key()
        if key is None or self.max_queue_delay_s <= 0:
            return None
        candidates = list(self._candidates(key))
        rows = sum(r.rows for r in candidates)
        # Triton: a batch of any preferred size goes at once; otherwise wait up to the delay.
        if rows >= self.max_rows(candidates[0]) or (self.preferred and rows >= self.preferred[0]):
            return None
        due = min(r.enqueued_at for r in candidates) + self.max_queue_delay_s
        return None if now >= due else due

    def collect_batch(self, prune: Callable[[InferRequest], bool] = lambda r: False) -> list[InferRequest]:
        """Requests of the next group, highest priority first, as many as fit one batch.

        `prune` is asked about each candidate first; those it returns True for (client gone,
        deadline passed) leave the queue without costing inference.
        """
        key = self.head_key()
        if key is None:
            return []
        taken: list[InferRequest] = []
        rows = 0
        limit = 0
        for request in list(self._candidates(key)):
            if prune(request):
                self.discard(request)
                continue
            if not taken:
                limit = self._fit_limit(request)
                if not self._fits([request], request.rows):
                    limit = request.rows  # alone it fits only unpadded: no batch-dim padding then
            elif rows + request.rows > limit or not self._fits(taken + [request], rows + request.rows):
                break
            taken.append(request)
            rows += request.rows
            if self.config.max_batch_size == 0:
                break
        taken = self._trim_to_preferred(taken, rows)
        for request in taken:
            self.discard(request)
        return taken if taken or not self.depth else self.collect_batch(prune)

    def _fit_limit(self, head: InferRequest) -> int:
        # The head always goes: it passed the 413 check, which uses the same rule as max_rows.
        return max(head.rows, self.max_rows(head))

    def _fits(self, requests: list[InferRequest], rows: int) -> bool:
        """Does the slot hold this batch as write_batch lays it out? Padded batches grow with their
        longest request (and to a preferred batch size), BYTES inputs with their strings, ragged
        inputs with every request's length, and generated batch_input tensors with the batch."""
        if not self.checks_fit:
            return True
        config = self.config
        needed = alignment_slack_bytes(config)
        if config.batch_inputs:
            needed += batch_inputs_nbytes(config, [r.inputs for r in requests])
        if config.bytes_inputs:  # never padded (common/config.py)
            needed += rows * config.fixed_output_row_bytes
            return needed + sum(input_slot_bytes(r) for r in requests) <= self.slot_capacity_bytes
        rows = _padded_rows(config, rows)
        needed += rows * config.fixed_output_row_bytes
        for (name, sample), shape in zip(requests[0].inputs.items(), padded_shapes(requests, rows)):
            if name in config.ragged_inputs:  # concatenated, as _plan_inputs writes it
                needed += sum(r.inputs[name].nbytes for r in requests)
            else:
                needed += sample.itemsize * math.prod(shape)
        return needed <= self.slot_capacity_bytes

    def _trim_to_preferred(self, taken: list[InferRequest], rows: int) -> list[InferRequest]:
        """With preferred sizes: send the largest preferred size that is reachable, rest stays."""
        if not self.preferred or rows <= self.preferred[0] or rows in self.preferred:
            return taken
        target = max(p for p in self.preferred if p <= rows)
        kept, kept_rows = [], 0
        for request in taken:
            if kept_rows + request.rows > target:
                break
            kept.append(request)
            kept_rows += request.rows
        return kept or taken[:1]


def write_batch(segment: Segment, lease: SlotLease, requests: list[InferRequest]) -> tuple[list[TensorRef], int]:
    """Copy each request's tensors once, straight into their place in the slot.

    Batched inputs stack the requests' rows; padded models pad every variable dim to the
    longest request (the padding value, 0 for the mask) and, with
    pad_to_preferred_batch_size, the batch dim to the next preferred size; ragged inputs
    are concatenated into one 1-D tensor, and batch_input tensors are generated.
    Returns the input refs and where the worker may write outputs.
    """
    if requests[0].serialized is not None:
        return _write_batch_with_bytes(segment, lease, requests)
    plan = _plan_inputs(requests, pad_batch_dim=True)
    offsets, end = pack_offsets([dtype.itemsize * math.prod(shape) for _, _, dtype, shape, _ in plan])
    config = requests[0].model
    pads_batch_dim = bool(config.dynamic_batching and config.dynamic_batching.pad_to_preferred_batch_size)
    if pads_batch_dim and end + plan[0][3][0] * config.fixed_output_row_bytes + ALIGN_BYTES > segment.data_capacity:
        # Padding the batch dim to a preferred size is an optimisation: never at the slot's cost.
        plan = _plan_inputs(requests, pad_batch_dim=False)
        offsets, end = pack_offsets([dtype.itemsize * math.prod(shape) for _, _, dtype, shape, _ in plan])
    refs = []
    for (name, datatype, dtype, shape, fill), offset in zip(plan, offsets):
        fill(segment.tensor(lease.index, offset, dtype, shape))
        refs.append(TensorRef(name, datatype, shape, offset))
    return refs, end


def _write_batch_with_bytes(segment: Segment, lease: SlotLease, requests: list[InferRequest]
                            ) -> tuple[list[TensorRef], int]:
    """write_batch for a model with BYTES inputs (never padded): each BYTES input is the
    requests' serialized elements one after another; the other tensors as write_batch plans them."""
    plan = _plan_inputs(requests, pad_batch_dim=False)
    serialized = requests[0].serialized
    sizes = [sum(len(r.serialized[name]) for r in requests) if name in serialized
             else dtype.itemsize * math.prod(shape) for name, _, dtype, shape, _ in plan]
    offsets, end = pack_offsets(sizes)
    refs: list[TensorRef] = []
    for (name, datatype, dtype, shape, fill), offset, nbytes in zip(plan, offsets, sizes):
        if name in serialized:
            _concatenate_serialized(segment.tensor(lease.index, offset, np.uint8, (nbytes,)), requests, name)
            refs.append(BytesTensorRef(name, datatype, shape, offset, nbytes))
        else:
            fill(segment.tensor(lease.index, offset, dtype, shape))
            refs.append(TensorRef(name, datatype, shape, offset))
    return refs, end


def _concatenate_serialized(dst: np.ndarray, requests: list[InferRequest], name: str) -> None:
    start = 0
    for request in requests:
        data = request.serialized[name]
        dst[start:start + len(data)] = np.frombuffer(data, np.uint8)
        start += len(data)


def _plan_inputs(requests: list[InferRequest], pad_batch_dim: bool) -> list[tuple]:
    """(name, datatype, dtype, shape, fill(dst)) for every tensor the model takes."""
    first = requests[0]
    config = first.model
    if config.max_batch_size == 0:  # one request, its tensors as sent
        return [(name, config.input(name).datatype, a.dtype, a.shape, _copier(a)) for name, a in first.inputs.items()]
    rows = sum(r.rows for r in requests)
    padded = padded_shapes(requests, _padded_rows(config, rows) if pad_batch_dim else rows)
    plan = []
    for (name, sample), shape in zip(first.inputs.items(), padded):
        datatype = config.input(name).datatype
        if name in config.ragged_inputs:
            pieces = [r.inputs[name] for r in requests]
            plan.append((name, datatype, sample.dtype, (sum(p.size for p in pieces),), _concatenator(pieces)))
        else:
            fill_value = _fill_value(config.dynamic_batching, name) if config.dynamic_batching else 0
            padding = bool(config.dynamic_batching and config.dynamic_batching.padding) or shape[0] > rows
            plan.append((name, datatype, sample.dtype, shape, _stacker(requests, name, fill_value if padding else None)))
    for batch_input in config.batch_inputs:
        tensor = batch_input_tensor(batch_input, [r.inputs[batch_input.source_input] for r in requests])
        plan.append((batch_input.target_name, batch_input.datatype, tensor.dtype, tensor.shape, _copier(tensor)))
    return plan


def _copier(array: np.ndarray):
    def fill(dst: np.ndarray) -> None:
        dst[...] = array
    return fill


def _concatenator(pieces: list[np.ndarray]):
    def fill(dst: np.ndarray) -> None:
        start = 0
        for piece in pieces:
            dst[start:start + piece.size] = piece.reshape(-1)
            start += piece.size
    return fill


def _stacker(requests: list[InferRequest], name: str, fill_value: float | None):
    def fill(dst: np.ndarray) -> None:
        if fill_value is not None:
            dst.fill(fill_value)
        row = 0
        for request in requests:
            array = request.inputs[name]
            dst[(slice(row, row + request.rows), *map(slice, array.shape[1:]))] = array
            row += request.rows
    return fill


def _padded_rows(config: ModelConfig, rows: int) -> int:
    batching = config.dynamic_batching
    if not (batching and batching.pad_to_preferred_batch_size):
        return rows
    bigger = [p for p in batching.preferred_batch_size if rows <= p <= config.max_batch_size]
    return min(bigger) if bigger else rows


def _fill_value(batching: DynamicBatching, name: str) -> float:
    """The padding value of an input: the config's, but 0 for the mask (padding is masked out)."""
    padding = batching.padding
    if padding is None or name == padding.mask_input:
        return 0
    return padding.value


def split_outputs(segment: Segment, batch: Batch, outputs: list[TensorRef]) -> list[dict[str, np.ndarray]]:
    """Each request's rows of every output, copied out so the slot can be freed at once.

    Where an output carries a padded dim (config dim -1, as long as the batch's longest
    request), each request gets it cut back to its own length.
    """
    index = batch.slot.lease.index
    views = {ref.name: segment.tensor(index, ref.offset, numpy_dtype(ref.datatype), ref.shape)
             if not isinstance(ref, BytesTensorRef) else _read_bytes_output(segment, index, ref) for ref in outputs}
    config = batch.model
    if config.max_batch_size == 0:
        return [{name: view.copy() for name, view in views.items()}]
    cut = _padded_output_axes(config, views, batch.requests)
    offsets = _ragged_offsets(config, batch.requests)
    per_request = []
    row = 0
    for k, request in enumerate(batch.requests):
        result = {}
        for name, view in views.items():
            if offsets and view.shape[0] == offsets[-1] != batch.rows:
                # A per-element output of a ragged model: split by the same element offsets.
                result[name] = view[offsets[k]:offsets[k + 1]].copy()
                continue
            index = [slice(row, row + request.rows)]
            if name in cut:
                own = _variable_extents(config, request.inputs)
                index += [slice(0, own[cut[name][axis]]) if axis in cut[name] else slice(None)
                          for axis in range(1, view.ndim)]
            result[name] = view[tuple(index)].copy()
        per_request.append(result)
        row += request.rows
    return per_request


def _read_bytes_output(segment: Segment, index: int, ref: BytesTensorRef) -> np.ndarray:
    """A BYTES output as an object array of bytes (the response encodes them as JSON strings or binary)."""
    return deserialize_bytes_tensor(segment.tensor(index, ref.offset, np.uint8, (ref.nbytes,)), ref.shape)


def _ragged_offsets(config: ModelConfig, requests: list[InferRequest]) -> list[int]:
    if not config.ragged_inputs:
        return []
    source = sorted(config.ragged_inputs)[0]
    return element_offsets([r.inputs[source] for r in requests])


def _padded_output_axes(config: ModelConfig, views: dict[str, np.ndarray], requests: list[InferRequest]
                        ) -> dict[str, dict[int, int]]:
    """For each output: {axis: k} where the axis carries the k-th variable dim, padded.

    The k-th variable (-1) dim of an output is matched with the k-th variable dim of the
    first padded input; it is cut back only where its size equals the batch's padded size.
    """
    if config.dynamic_batching is None or config.dynamic_batching.padding is None:
        return {}
    longest = _variable_extents(config, requests[0].inputs)
    for request in requests[1:]:
        longest = [max(a, b) for a, b in zip(longest, _variable_extents(config, request.inputs))]
    cut: dict[str, dict[int, int]] = {}
    for name, view in views.items():
        dims = config.outputs_by_name[name].dims if name in config.outputs_by_name else ()
        variable_axes = [i + 1 for i, d in enumerate(dims) if d == -1 and i + 1 < view.ndim]
        axes = {axis: k for k, axis in enumerate(variable_axes)
                if k < len(longest) and view.shape[axis] == longest[k]}
        if axes:
            cut[name] = axes
    return cut


def _variable_extents(config: ModelConfig, inputs: dict[str, np.ndarray]) -> list[int]:
    """Sizes of the variable dims of the first input that has any, in order."""
    for name, array in inputs.items():
        dims = config.inputs_by_name[name].dims
        extents = [array.shape[i + 1] for i, d in enumerate(dims) if d == -1]
        if extents:
            return extents
    return []
