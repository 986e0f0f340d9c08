"""A batch's outputs read out of its slot: each request's rows (cut back where padded, scattered where a
batch_output says so), or each request's own answer; copied out, so the slot is free at once after
(gateway/batching/slots.py writes the inputs in).

BYTES outputs lie in the slot in KServe's binary BYTES form (common/wire.py) and are read back from it.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from ringserve.common.repository.config import ModelConfig
from ringserve.common.repository.datatypes import numpy_dtype
from ringserve.common.repository.reshape import scatter_shapes
from ringserve.common.wire import BytesTensorRef, TensorRef, deserialize_bytes_tensor
from ringserve.gateway.batching.ragged import element_offsets
from ringserve.shm.segment import Segment

if TYPE_CHECKING:
    from ringserve.gateway.batching.slots import SlotBatch
    from ringserve.gateway.core.request import InferRequest


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
            cuts = [slice(row, row + request.rows)]
            if name in cut:
                own = _variable_extents(config, request.inputs)
                cuts += [
                    slice(0, own[cut[name][axis]]) if axis in cut[name] else slice(None) for axis in range(1, view.ndim)
                ]
            # An output going into a shared-memory region stays a view of the slot: the scheduler
            # copies it into the region before the slot is freed (gateway/core/regions.py).
            part = view[tuple(cuts)]
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
    return deserialize_bytes_tensor(segment.tensor(index, ref.offset, np.dtype(np.uint8), (ref.nbytes,)), ref.shape)


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
