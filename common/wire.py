"""What the processes share beside the messages themselves (those are common/messages.py).

- Where a tensor lies in a shared-memory slot: a TensorRef, [name, datatype, shape, offset] on
  the wire (inside Batch's `inputs` and Result's `outputs`). A BYTES tensor lies there in
  KServe's binary BYTES form (per element, row-major: a 4-byte little-endian length, then the
  bytes) and its ref has a fifth element, its length in bytes (BytesTensorRef).
- The ZeroMQ routing ids of a worker's two DEALER sockets, and the ipc endpoint of each socket
  in the runtime directory.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass(frozen=True, slots=True)
class TensorRef:
    """Where one tensor lies in a slot's data area."""

    name: str
    datatype: str  # KServe name, e.g. "FP32"
    shape: tuple[int, ...]
    offset: int

    def to_wire(self) -> list[Any]:
        return [self.name, self.datatype, list(self.shape), self.offset]

    @classmethod
    def from_wire(cls, item: list[Any]) -> TensorRef:
        try:
            name, datatype, shape, offset = item
        except ValueError:  # five elements: a BYTES tensor (a try costs nothing when it does not raise)
            name, datatype, shape, offset, nbytes = item
            return BytesTensorRef(name, datatype, tuple(shape), offset, nbytes)
        return cls(name, datatype, tuple(shape), offset)


@dataclass(frozen=True, slots=True)
class BytesTensorRef(TensorRef):
    """A BYTES tensor in a slot: `nbytes` bytes of KServe's binary BYTES form from `offset`.

    A subclass, so that fixed-size refs keep four fields (their construction is on the hot path).
    """

    nbytes: int = 0

    def to_wire(self) -> list[Any]:
        return [self.name, self.datatype, list(self.shape), self.offset, self.nbytes]


BYTES_LENGTH = struct.Struct("<I")


def serialize_bytes_tensor(array: np.ndarray) -> bytes:
    """Object array of bytes (or str, written as UTF-8) -> KServe's binary BYTES form, row-major."""
    parts = []
    pack = BYTES_LENGTH.pack
    for item in array.reshape(-1):
        data = item.encode() if isinstance(item, str) else bytes(item)
        parts.append(pack(len(data)))
        parts.append(data)
    return b"".join(parts)


class BytesFormatError(ValueError):
    """BYTES data that does not hold the elements its shape needs (the message says how)."""


class BytesCountError(BytesFormatError):
    """BYTES data of whole elements, but not as many as the shape needs. `found` is Triton's count (core
    infer_request.cc ValidateBytesInputs): the elements the data starts, stopping at `expected` + 1."""

    def __init__(self, expected: int, found: int) -> None:
        held = f"more than {expected}" if found > expected else str(found)
        super().__init__(f"BYTES data holds {held} elements; its shape needs {expected}")
        self.expected, self.found = expected, found


class NotUtf8(ValueError):
    """A BYTES element that is not UTF-8, where text was asked for (deserialize_bytes_tensor's `text`)."""

    def __init__(self, element: int, exc: UnicodeDecodeError) -> None:
        super().__init__(f"BYTES element {element} is not UTF-8 ({exc.reason} at byte {exc.start})")
        self.element = element


def deserialize_bytes_tensor(buffer: Any, shape: tuple[int, ...], *, text: bool = False) -> np.ndarray:
    """KServe's binary BYTES form (a request body's or a slot's) -> object array of `shape`.

    Elements are bytes, or str when `text` (strict UTF-8: NotUtf8 otherwise, naming the element). The
    buffer must hold exactly the elements the shape needs; BytesFormatError says how it does not
    (the gateway answers it as a 400 naming the input).
    """
    view = memoryview(buffer).cast("B")
    count = 1
    for d in shape:
        count *= d
    unpack, end, offset = BYTES_LENGTH.unpack_from, len(view), 0
    if count * BYTES_LENGTH.size > end:  # before allocating: a shape from a request may be huge
        raise _miscount(view, count) or BytesFormatError(
            f"BYTES data of {end} bytes cannot hold {count} elements (each takes a {BYTES_LENGTH.size}-byte length)"
        )
    items = np.empty(count, dtype=np.object_)
    i = 0
    try:  # (a try costs nothing while nothing raises)
        for i in range(count):
            if offset + BYTES_LENGTH.size > end:
                raise _miscount(view, count) or BytesFormatError(
                    f"BYTES data of {end} bytes ends inside the length of element {i} of {count}"
                )
            (length,) = unpack(view, offset)
            offset += BYTES_LENGTH.size
            if offset + length > end:
                raise BytesFormatError(f"BYTES element {i} says {length} bytes but only {end - offset} remain")
            chunk = view[offset : offset + length]
            items[i] = str(chunk, "utf-8") if text else bytes(chunk)
            offset += length
    except UnicodeDecodeError as exc:
        raise NotUtf8(i, exc) from None
    if offset != end:
        raise _miscount(view, count) or BytesFormatError(
            f"BYTES data has {end - offset} bytes after its {count} elements"
        )
    return items.reshape(shape)


def _miscount(view: memoryview, count: int) -> BytesCountError | None:
    """The error Triton's count of the elements gives (BytesCountError), where the data holds whole
    elements but not `count` of them; None where it does not (a length cut short: the caller's own error).
    Triton's walk: each element's length, then its bytes, an element past the end taking what is left."""
    unpack, end, offset, found = BYTES_LENGTH.unpack_from, len(view), 0, 0
    while offset < end and found <= count:
        if offset + BYTES_LENGTH.size > end:
            return None
        offset += BYTES_LENGTH.size + unpack(view, offset)[0]
        found += 1
    return BytesCountError(count, found) if found != count else None


def worker_identity(index: int, generation: int) -> bytes:
    """ZeroMQ routing id of one worker process: unique per (index, generation)."""
    return f"w{index}.g{generation}".encode()


def control_identity(index: int, generation: int) -> bytes:
    """Routing id of a worker's model loader thread (LOAD, UNLOAD in; MODEL_STATE out). A second
    DEALER, so loads are taken while the batch loop is busy running a batch."""
    return f"c{index}.g{generation}".encode()


def courier_identity(index: int, generation: int) -> bytes:
    """Routing id of a worker's courier thread (CANCEL in; a decoupled batch's STREAM_RESPONSE and RESULT
    out): a third DEALER, so that both move while the batch loop runs model code (worker/python/decoupled.py)."""
    return f"s{index}.g{generation}".encode()


def call_identity(index: int, generation: int) -> bytes:
    """Routing id of a worker's call socket (worker/calls.py): its requests to models it does not hold
    (CALL out, CALL_REPLY in), from whichever thread of the worker makes them."""
    return f"b{index}.g{generation}".encode()


def parse_worker_identity(identity: bytes) -> tuple[int, int]:
    """(index, generation) of a worker's batch loop ('w0.g1'), loader thread ('c0.g1'), courier ('s0.g1') or
    calls ('b0.g1')."""
    text = identity.decode()
    index, generation = text[1:].split(".g")
    return int(index), int(generation)


def endpoint(runtime_dir: str, name: str) -> str:
    return f"ipc://{runtime_dir}/{name}.sock"


def gateway_endpoint(runtime_dir: str, name: str, gateway: int) -> str:
    """A socket of gateway `gateway` (0..G-1): 'dispatch' (its ROUTER) or 'events' (its PULL)."""
    return endpoint(runtime_dir, f"{name}-{gateway}")


def gateway_http_path(runtime_dir: str, gateway: int) -> str:
    """The Unix socket on which gateway `gateway` serves HTTP to its peers (gateway/cluster/peers.py)."""
    return f"{runtime_dir}/gateway-{gateway}.http"
