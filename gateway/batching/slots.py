"""A batch in its slot: writing the requests' tensors in, splitting a batch in halves, reading outputs out.

A batch keeps its slot while it lives: a batch a dead worker held is sent again from the same
bytes, and the halves of a bisected batch share the slot (running one at a time, as they share
its output area). Each request's rows are copied into the slot once (`write_batch`) and each
request's outputs are copied out once (`split_outputs`), so the slot is free at once after.

BYTES tensors lie in a slot in KServe's binary BYTES form (common/wire.py): a batch's BYTES
input is its requests' serialized elements one after another, in row order, and a BYTES
output is read back from that form and split by rows like any other.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ringserve.common.logfmt import batch_fields
from ringserve.common.messages import RequestInfo
from ringserve.common.repository.batching import DynamicBatching
from ringserve.common.repository.config import ModelConfig
from ringserve.common.repository.datatypes import numpy_dtype
from ringserve.common.repository.reshape import scatter_shapes
from ringserve.common.wire import BytesTensorRef, TensorRef, deserialize_bytes_tensor
from ringserve.gateway.batching.padding import padded_rows, padded_shapes
from ringserve.gateway.batching.ragged import batch_input_tensor, element_offsets
from ringserve.gateway.batching.steps import sequence_plan
from ringserve.gateway.core.regions import RegionInput
from ringserve.shm.layout import ALIGN_BYTES, pack_offsets
from ringserve.shm.ring import SlotLease
from ringserve.shm.segment import Segment

if TYPE_CHECKING:
    from ringserve.gateway.core.request import InferRequest


@dataclass(eq=False)
class SlotUse:
    """A leased slot and the batches still using it (halves of a bisected batch share it)."""

    lease: SlotLease
    open_batches: int = 1
    running: bool = False  # batches of one slot run one at a time: they share its output area


@dataclass(eq=False)
class SlotBatch:
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
    # time.perf_counter_ns() when its requests left the queue and were written into the slot: Triton's
    # statistics (gateway/observe/stats.py)
    formed_ns: int = 0
    written_ns: int = 0
    rewrite: bool = False  # written into its slot again each time it is sent (a half that views can't give)
    span: Any = None  # its tracing span (common/tracing.py); None while tracing is off
    detached: bool = False  # a decoupled batch whose execute returned (EXECUTED): its stream goes on, not its run

    @property
    def rows(self) -> int:
        return sum(r.rows for r in self.requests)

    def log_fields(self) -> dict:
        """`extra=` of a log line about this batch: its id and its requests' ids (common/logfmt.py)."""
        return batch_fields(self.batch_id, [r.request_id for r in self.requests])

    def split(self, batch_ids: Iterator[int]) -> tuple[SlotBatch, SlotBatch]:
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
        for reqs, before, row_start in (
            (self.requests[:half], [], 0),
            (self.requests[half:], self.requests[:half], first_rows),
        ):
            rows = sum(r.rows for r in reqs)
            refs = (
                []
                if rewrite
                else [
                    _bytes_range(ref, before, reqs)
                    if isinstance(ref, BytesTensorRef)
                    else _row_range(ref, row_start, rows)
                    for ref in self.inputs
                ]
                if batched
                else self.inputs
            )
            halves.append(
                SlotBatch(
                    next(batch_ids),
                    self.model,
                    reqs,
                    self.slot,
                    refs,
                    self.output_offset,
                    self.attempt,
                    list(self.crash_reasons),
                    rewrite=rewrite,
                    formed_ns=self.formed_ns,
                    written_ns=self.written_ns,
                )
            )
        self.slot.open_batches += 1
        return halves[0], halves[1]


def request_infos(batch: SlotBatch) -> tuple[RequestInfo, ...] | None:
    """What BATCH tells a Python model or an ensemble of each request (None for an ONNX model)."""
    config = batch.model
    if config.kind == "onnx":
        return None
    ragged = config.ragged_inputs
    return tuple(
        RequestInfo(
            r.rows,
            r.kserve_id,
            r.parameters,
            r.requested_outputs,
            {n: list(r.inputs[n].shape) for n in ragged} if ragged else None,
            *(() if r.sequence is None else (r.sequence.key, r.sequence.flags)),
        )
        for r in batch.requests
    )


def _rows_are_views(config: ModelConfig) -> bool:
    """Is a row range of a batch's inputs the same as the inputs of those requests alone?"""
    batching = config.dynamic_batching
    return not (
        config.ragged_inputs
        or config.batch_inputs
        or (batching and (batching.padding is not None or batching.pad_to_preferred_batch_size))
    )


def _row_range(ref: TensorRef, row_start: int, rows: int) -> TensorRef:
    row_bytes = numpy_dtype(ref.datatype).itemsize * math.prod(ref.shape[1:])
    return TensorRef(ref.name, ref.datatype, (rows, *ref.shape[1:]), ref.offset + row_start * row_bytes)


def _bytes_range(ref: BytesTensorRef, before: list[InferRequest], taken: list[InferRequest]) -> BytesTensorRef:
    """The `taken` requests' part of a BYTES input: their serialized elements follow those of `before`."""
    start = sum(len(r.serialized[ref.name]) for r in before)
    nbytes = sum(len(r.serialized[ref.name]) for r in taken)
    rows = sum(r.rows for r in taken)
    return BytesTensorRef(ref.name, ref.datatype, (rows, *ref.shape[1:]), ref.offset + start, nbytes)


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
    if pads_batch_dim and end + plan[0][3][0] * config.fixed_row_bytes + ALIGN_BYTES > segment.data_capacity:
        # Padding the batch dim to a preferred size is an optimisation: never at the slot's cost.
        plan = _plan_inputs(requests, pad_batch_dim=False)
        offsets, end = pack_offsets([dtype.itemsize * math.prod(shape) for _, _, dtype, shape, _ in plan])
    refs = []
    for (name, datatype, dtype, shape, fill), offset in zip(plan, offsets):
        fill(segment.tensor(lease.index, offset, dtype, shape))
        refs.append(TensorRef(name, datatype, shape, offset))
    return refs, end


def _write_batch_with_bytes(
    segment: Segment, lease: SlotLease, requests: list[InferRequest]
) -> tuple[list[TensorRef], int]:
    """write_batch for a model with BYTES inputs (never padded): each BYTES input is the
    requests' serialized elements one after another; the other tensors as write_batch plans them."""
    plan = _plan_inputs(requests, pad_batch_dim=False)
    serialized = requests[0].serialized
    sizes = [
        sum(len(r.serialized[name]) for r in requests) if name in serialized else dtype.itemsize * math.prod(shape)
        for name, _, dtype, shape, _ in plan
    ]
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
        dst[start : start + len(data)] = np.frombuffer(data, np.uint8)
        start += len(data)


def _plan_inputs(requests: list[InferRequest], pad_batch_dim: bool) -> list[tuple]:
    """(name, datatype, dtype, shape, fill(dst)) for every tensor the model takes."""
    first = requests[0]
    config = first.model
    if config.max_batch_size == 0:  # one request, its tensors as sent
        plan = [(name, config.input(name).datatype, a.dtype, a.shape, _copier(a)) for name, a in first.inputs.items()]
        return plan + (sequence_plan(requests, config) if config.sequence_batching is not None else [])
    rows = sum(r.rows for r in requests)
    padded = padded_shapes(requests, padded_rows(config, rows) if pad_batch_dim else rows)
    plan = []
    for (name, sample), shape in zip(first.inputs.items(), padded):
        datatype = config.input(name).datatype
        if name in config.ragged_inputs:
            pieces = [r.inputs[name] for r in requests]
            plan.append((name, datatype, sample.dtype, (sum(p.size for p in pieces),), _concatenator(pieces)))
        else:
            fill_value = _fill_value(config.dynamic_batching, name) if config.dynamic_batching else 0
            padding = bool(config.dynamic_batching and config.dynamic_batching.padding) or shape[0] > rows
            plan.append(
                (name, datatype, sample.dtype, shape, _stacker(requests, name, fill_value if padding else None))
            )
    for batch_input in config.batch_inputs:
        tensor = batch_input_tensor(batch_input, [r.inputs[batch_input.source_input] for r in requests])
        plan.append((batch_input.target_name, batch_input.datatype, tensor.dtype, tensor.shape, _copier(tensor)))
    if config.sequence_batching is not None:  # control and state inputs
        plan += sequence_plan(requests, config)
    return plan


def _put(dst: np.ndarray, source: np.ndarray | RegionInput) -> None:
    """One request's tensor into its place in the slot. One in a client's shared-memory region is read
    there with preadv (gateway/core/regions.py: never through a mapping); RegionReadFailed if it cannot."""
    if type(source) is RegionInput:
        source.read_into(dst)
    else:
        dst[...] = source


def _copier(array: np.ndarray | RegionInput):
    def fill(dst: np.ndarray) -> None:
        _put(dst, array)

    return fill


def _concatenator(pieces: list[np.ndarray | RegionInput]):
    def fill(dst: np.ndarray) -> None:
        start = 0
        for piece in pieces:
            _put(dst[start : start + piece.size].reshape(piece.shape), piece)
            start += piece.size

    return fill


def _stacker(requests: list[InferRequest], name: str, fill_value: float | None):
    def fill(dst: np.ndarray) -> None:
        if fill_value is not None:
            dst.fill(fill_value)
        row = 0
        for request in requests:
            array = request.inputs[name]
            _put(dst[(slice(row, row + request.rows), *map(slice, array.shape[1:]))], array)
            row += request.rows

    return fill


def _fill_value(batching: DynamicBatching, name: str) -> float:
    """The padding value of an input: the config's, but 0 for the mask (padding is masked out)."""
    padding = batching.padding
    if padding is None or name == padding.mask_input:
        return 0
    return padding.value


def split_outputs(
    segment: Segment, batch: SlotBatch, outputs: list[TensorRef]
) -> list[dict[str, np.ndarray] | tuple[str, int]]:
    """Each request's rows of every output, copied out so the slot can be freed at once.

    Where an output carries a padded dim (config dim -1, as long as the batch's longest
    request), each request gets it cut back to its own length. A batch_output's target is cut by its
    source input's shapes instead; one the model made too short fails each request, (message, 500).
    """
    index = batch.slot.lease.index
    views = {
        ref.name: segment.tensor(index, ref.offset, numpy_dtype(ref.datatype), ref.shape)
        if not isinstance(ref, BytesTensorRef)
        else _read_bytes_output(segment, index, ref)
        for ref in outputs
    }
    config = batch.model
    try:
        scattered = {
            name: _scatter(config, name, view, batch.requests)
            for name, view in views.items()
            if name in config.batch_output_sources
        }
    except ValueError as exc:  # the model gave fewer elements than its requests' shapes need: each request says so
        return [(str(exc), 500) for _ in batch.requests]
    if config.max_batch_size == 0:
        regions = batch.requests[0].output_regions
        views.update({name: pieces[0] for name, pieces in scattered.items()})
        return [{name: view.copy() if regions is None or name not in regions else view for name, view in views.items()}]
    cut = _padded_output_axes(config, views, batch.requests)
    offsets = _ragged_offsets(config, batch.requests)
    per_request: list[dict[str, np.ndarray] | tuple[str, int]] = []
    row = 0
    for k, request in enumerate(batch.requests):
        result = {}
        regions = request.output_regions
        for name, view in views.items():
            if name in scattered:
                part = scattered[name][k]
                result[name] = part.copy() if regions is None or name not in regions else part
                continue
            if offsets and view.shape[0] == offsets[-1] != batch.rows:
                # A per-element output of a ragged model: split by the same element offsets.
                part = view[offsets[k] : offsets[k + 1]]
                result[name] = part.copy() if regions is None or name not in regions else part
                continue
            index = [slice(row, row + request.rows)]
            if name in cut:
                own = _variable_extents(config, request.inputs)
                index += [
                    slice(0, own[cut[name][axis]]) if axis in cut[name] else slice(None) for axis in range(1, view.ndim)
                ]
            # An output going into a shared-memory region stays a view of the slot: the scheduler
            # copies it into the region before the slot is freed (gateway/core/regions.py).
            part = view[tuple(index)]
            result[name] = part.copy() if regions is None or name not in regions else part
        per_request.append(result)
        row += request.rows
    return per_request


def read_answers(
    segment: Segment, batch: SlotBatch, answers: list[list[Any]]
) -> list[dict[str, np.ndarray] | tuple[str, int]]:
    """Each request's own outputs (a Python model or an ensemble answers each request: RESULT's
    `answers`), copied out of the slot as split_outputs copies; (message, status) for one that failed."""
    index = batch.slot.lease.index
    outcomes: list[dict[str, np.ndarray] | tuple[str, int]] = []
    for request, answer in zip(batch.requests, answers):
        refs, error, status = answer[:3]
        if error is not None:
            outcomes.append((error, status))
            continue
        if len(answer) > 3:  # the response's parameters (common/messages.py: Result.answers)
            request.response_parameters = answer[3]
        outcomes.append(read_refs(segment, index, refs, request.output_regions))
    return outcomes


def read_refs(
    segment: Segment, index: int, refs: list[list[Any]], regions: dict | None = None
) -> dict[str, np.ndarray]:
    """Tensors by name from slot `index` (TensorRef wire forms), copied out; those going into a
    shared-memory region stay views (the scheduler writes them into it before freeing the slot)."""
    result = {}
    for item in refs:
        ref = TensorRef.from_wire(item)
        view = (
            _read_bytes_output(segment, index, ref)
            if isinstance(ref, BytesTensorRef)
            else segment.tensor(index, ref.offset, numpy_dtype(ref.datatype), ref.shape)
        )
        result[ref.name] = view.copy() if regions is None or ref.name not in regions else view
    return result


def _read_bytes_output(segment: Segment, index: int, ref: BytesTensorRef) -> np.ndarray:
    """A BYTES output as an object array of bytes (the response encodes them as JSON strings or binary)."""
    return deserialize_bytes_tensor(segment.tensor(index, ref.offset, np.uint8, (ref.nbytes,)), ref.shape)


def _scatter(config: ModelConfig, name: str, view: np.ndarray, requests: list[InferRequest]) -> list[np.ndarray]:
    """Triton's BATCH_SCATTER_WITH_INPUT_SHAPE (common/repository/reshape.py): the batch's output read in order,
    each request's piece in the shape its source input gives the output's variable dims."""
    source = config.batch_output_sources[name]
    shapes = scatter_shapes(
        config.output(name).dims, config.max_batch_size > 0, [r.inputs[source].shape for r in requests]
    )
    flat, start, pieces = view.reshape(-1), 0, []
    for shape in shapes:
        end = start + math.prod(shape)
        if end > flat.size:
            raise ValueError(
                f"model {config.name!r}: output {name!r} has {flat.size} elements, "
                f"fewer than its batch_output's requests' shapes {shapes} need"
            )
        pieces.append(flat[start:end].reshape(shape))
        start = end
    return pieces


def _ragged_offsets(config: ModelConfig, requests: list[InferRequest]) -> list[int]:
    if not config.ragged_inputs:
        return []
    source = sorted(config.ragged_inputs)[0]
    return element_offsets([r.inputs[source] for r in requests])


def _padded_output_axes(
    config: ModelConfig, views: dict[str, np.ndarray], requests: list[InferRequest]
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
        axes = {axis: k for k, axis in enumerate(variable_axes) if k < len(longest) and view.shape[axis] == longest[k]}
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
