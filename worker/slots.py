"""A batch's tensors in its slot: inputs read as views, outputs written back (shm/layout.py).

Used by the batch loop for a batch alone (worker/loop.py) and by a fused execution
(worker/fusion.py), which reads several batches' inputs, possibly from several gateways' rings.

String tensors: a BYTES input lies in the slot in KServe's binary BYTES form, any bytes (the
gateway carries them as sent); it reaches ONNX Runtime as an object array of str (ORT takes
str elements; it would turn bytes elements into their repr, "b'...'"). Decoding is strict: an
element that is not UTF-8 fails the batch with NotText naming the input, before the model
runs, and the gateway's bisection answers only its request (400). A string output, an
object array of str, is written back in the same form.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ringserve.common import messages, wire
from ringserve.common.repository.datatypes import numpy_dtype
from ringserve.shm.layout import pack_offsets
from ringserve.shm.segment import Segment

from .errors import NotText, OutputOverflow, StaleBatch
from .session import ModelSession


def check_generation(segment: Segment, batch: messages.Batch) -> None:
    """StaleBatch unless the slot still holds this batch (the gateway reused it since)."""
    found = segment.generation(batch.slot_index)
    if found != batch.generation:
        raise StaleBatch(batch.slot_index, batch.generation, found)


def read_inputs(segment: Segment, batch: messages.Batch) -> dict[str, np.ndarray]:
    """The batch's inputs by name: read-only views over the slot (no copy), strings decoded."""
    slot = batch.slot_index
    inputs = {}
    for item in batch.inputs:
        ref = wire.TensorRef.from_wire(item)
        if isinstance(ref, wire.BytesTensorRef):  # decoded into new str objects: the slot stays as it is
            inputs[ref.name] = read_strings(segment, slot, ref)
            continue
        view = segment.tensor(slot, ref.offset, numpy_dtype(ref.datatype), ref.shape)
        view.flags.writeable = False  # inputs are re-dispatched after a crash: never touch them
        inputs[ref.name] = view
    return inputs


def read_strings(segment: Segment, slot: int, ref: wire.BytesTensorRef) -> np.ndarray:
    view = segment.tensor(slot, ref.offset, np.uint8, (ref.nbytes,))
    try:
        return wire.deserialize_bytes_tensor(view, ref.shape, text=True)
    except wire.NotUtf8 as exc:
        raise NotText(ref.name, str(exc)) from None


def write_outputs(
    segment: Segment, session: ModelSession, slot: int, start: int, results: list[np.ndarray]
) -> list[list[Any]]:
    """Each output into the slot from `start`, packed; their TensorRefs' wire forms. The caller
    sets the output generation afterwards, which vouches for every byte written here."""
    # A string output (object array) goes into the slot serialized: only then is its size known.
    data = [r if not r.dtype.hasobject else np.frombuffer(wire.serialize_bytes_tensor(r), np.uint8) for r in results]
    offsets, end = pack_offsets([d.nbytes for d in data], start)
    if end > segment.data_capacity:
        raise OutputOverflow(session.config.name, end - start, segment.data_capacity - start)
    refs = []
    for name, result, payload, offset in zip(session.output_names, results, data, offsets):
        datatype = session.config.output_datatypes[name]
        dst = segment.tensor(slot, offset, payload.dtype, payload.shape)
        np.copyto(dst, payload)
        ref = (
            wire.TensorRef(name, datatype, result.shape, offset)
            if payload is result
            else wire.BytesTensorRef(name, datatype, result.shape, offset, payload.nbytes)
        )
        refs.append(ref.to_wire())
    return refs
