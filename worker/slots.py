"""A batch's tensors in its slot: inputs read as views, outputs written back (shm/layout.py).

Used by the batch loop for a batch alone (worker/loop.py) and by a fused execution
(worker/fusion.py), which reads several batches' inputs, possibly from several gateways' rings.

String tensors: a BYTES input lies in the slot in KServe's binary BYTES form, any bytes (the
gateway carries them as sent); it reaches ONNX Runtime as an object array of str (ORT takes
str elements; it would turn bytes elements into their repr, "b'...'"). Decoding is strict: an
element that is not UTF-8 fails the batch with NotText naming the input, before the model
runs, and the gateway's bisection answers only its request (400). A string output, an
object array of str, is written back in the same form.

The one codec of a slot's tensors in the worker: `read_tensor` (one tensor by its ref) and `write_packed`
(tensors packed into the output area, their refs). ONNX models read and write through `read_inputs` and
`write_outputs` here; the models that answer each request (worker/requests.py) through the same two.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from ringserve.common import messages, wire
from ringserve.common.repository.datatypes import numpy_dtype
from ringserve.shm.layout import pack_offsets
from ringserve.shm.segment import Segment

from .errors import NotText, OutputOverflow, OutputsDoNotFit, StaleBatch

if TYPE_CHECKING:
    from .session import ModelSession


def check_generation(segment: Segment, batch: messages.Batch) -> None:
    """StaleBatch unless the slot still holds this batch (the gateway reused it since)."""
    found = segment.generation(batch.slot_index)
    if found != batch.generation:
        raise StaleBatch(batch.slot_index, batch.generation, found)


def read_inputs(segment: Segment, batch: messages.Batch) -> dict[str, np.ndarray]:
    """The batch's inputs by name: read-only views over the slot (no copy), strings decoded."""
    inputs = {}
    for item in batch.inputs:
        ref = wire.TensorRef.from_wire(item)
        inputs[ref.name] = read_tensor(segment, batch.slot_index, ref, text=True)
    return inputs


def read_tensor(segment: Segment, slot: int, ref: wire.TensorRef, *, text: bool) -> np.ndarray:
    """One tensor of the slot: a read-only view (no copy); BYTES decoded into new objects (the slot stays as
    it is): str with `text` (strictly: NotText naming the tensor), else bytes."""
    if isinstance(ref, wire.BytesTensorRef):
        view = segment.tensor(slot, ref.offset, np.uint8, (ref.nbytes,))
        if not text:
            return wire.deserialize_bytes_tensor(view, ref.shape)
        try:
            return wire.deserialize_bytes_tensor(view, ref.shape, text=True)
        except wire.NotUtf8 as exc:
            raise NotText(ref.name, str(exc)) from None
    view = segment.tensor(slot, ref.offset, numpy_dtype(ref.datatype), ref.shape)
    view.flags.writeable = False  # inputs are re-dispatched after a crash: never touch them
    return view


def write_outputs(
    segment: Segment, session: ModelSession, slot: int, start: int, results: list[np.ndarray]
) -> list[list[Any]]:
    """Each output into the slot from `start`, packed; their TensorRefs' wire forms. The caller
    sets the output generation afterwards, which vouches for every byte written here."""
    datatypes = session.config.output_datatypes
    tensors = [(name, datatypes[name], result) for name, result in zip(session.output_names, results)]
    try:
        refs, _ = write_packed(segment, slot, start, tensors)
    except OutputsDoNotFit as exc:
        raise OutputOverflow(session.config.name, exc.needed_bytes, exc.left_bytes) from None
    return refs


def write_packed(
    segment: Segment, slot: int, start: int, tensors: Sequence[tuple[str, str, np.ndarray]]
) -> tuple[list[list[Any]], int]:
    """(name, datatype, array) each into the slot from `start`, packed; their refs' wire forms and the end.
    OutputsDoNotFit when they need more than the slot has left. A BYTES tensor (an object array of str or
    bytes) goes into the slot serialized: only then is its size known."""
    payloads = [
        np.frombuffer(wire.serialize_bytes_tensor(np.asarray(a, dtype=object)), np.uint8)
        if datatype == "BYTES"
        else np.ascontiguousarray(a)
        for _, datatype, a in tensors
    ]
    offsets, end = pack_offsets([p.nbytes for p in payloads], start)
    if end > segment.data_capacity:
        raise OutputsDoNotFit(end - start, segment.data_capacity - start)
    refs = []
    for (name, datatype, array), payload, offset in zip(tensors, payloads, offsets):
        np.copyto(segment.tensor(slot, offset, payload.dtype, payload.shape), payload)
        ref = (
            wire.BytesTensorRef(name, datatype, array.shape, offset, payload.nbytes)
            if datatype == "BYTES"
            else wire.TensorRef(name, datatype, array.shape, offset)
        )
        refs.append(ref.to_wire())
    return refs, end
