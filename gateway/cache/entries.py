"""What the response cache stores: a request's key and a response's bytes.

The key is Triton's (core src/cache_manager.cc, `TritonCache::Hash`): the model's name, the version the
request resolved to, and every input's name, shape, datatype and bytes, in the order of their names.
Triton folds them with boost::hash_combine into 64 bits; here they go through BLAKE2b into 128 bits, so
that two requests share an entry only when they are the same request (a 64-bit hash over a full cache
would, now and then, answer one request with another's outputs). A BYTES input is hashed in KServe's
binary form (each element's 4-byte length, then its bytes), as it reached the gateway. An input in a client's
shared-memory region is hashed by its bytes there now, as Triton hashes the buffer it reads.

A response is stored as its outputs in one buffer: a JSON table (name, dtype or BYTES, shape, bytes) after
its 4-byte length, then each output's bytes; a hit rebuilds the arrays over a private copy of it.
"""

from __future__ import annotations

import hashlib
import struct

import numpy as np
import orjson

from ringserve.common.wire import deserialize_bytes_tensor, serialize_bytes_tensor
from ringserve.gateway.core.regions import RegionInput
from ringserve.gateway.core.request import InferRequest

KEY_BYTES = 16
BYTES_DTYPE = "BYTES"
_LENGTH = struct.Struct("<I")


def request_key(request: InferRequest) -> bytes:
    """The 16-byte key of `request` (its model version, and its inputs as the client sent them)."""
    config = request.model
    digest = hashlib.blake2b(digest_size=KEY_BYTES)
    digest.update(orjson.dumps([config.name, config.version]))
    serialized = request.serialized or {}
    for name in sorted(request.inputs):
        array = request.inputs[name]
        datatype = config.input(name).datatype
        digest.update(orjson.dumps([name, datatype, array.shape]))
        data: bytes | memoryview | None = serialized.get(name)
        if isinstance(array, RegionInput):  # (its bytes are read for the slot later, once more)
            region_bytes = np.empty(array.shape, array.dtype)
            array.read_into(region_bytes)
            data = region_bytes.reshape(-1).view(np.uint8).data
        elif data is None:
            data = np.ascontiguousarray(array).reshape(-1).view(np.uint8).data  # (no copy when contiguous)
        digest.update(_LENGTH.pack(len(data) & 0xFFFFFFFF))
        digest.update(data)
    return digest.digest()


def encode_outputs(outputs: dict[str, np.ndarray]) -> bytes | None:
    """A response's outputs as one buffer; None for a result that is not plain arrays (not stored)."""
    table, parts = [], []
    for name, array in outputs.items():
        if not isinstance(array, np.ndarray):
            return None
        if array.dtype == np.object_:
            data = serialize_bytes_tensor(array)
            table.append([name, BYTES_DTYPE, array.shape, len(data)])
        else:
            data = array.tobytes()
            table.append([name, array.dtype.str, array.shape, len(data)])
        parts.append(data)
    head = orjson.dumps(table)
    return b"".join([_LENGTH.pack(len(head)), head, *parts])


def decode_outputs(value: bytes) -> dict[str, np.ndarray]:
    """The outputs `encode_outputs` stored (arrays over `value`, which the caller owns)."""
    (head_bytes,) = _LENGTH.unpack_from(value, 0)
    at = _LENGTH.size + head_bytes
    outputs: dict[str, np.ndarray] = {}
    for name, dtype, shape, nbytes in orjson.loads(value[_LENGTH.size : at]):
        shape = tuple(shape)
        if dtype == BYTES_DTYPE:
            outputs[name] = deserialize_bytes_tensor(memoryview(value)[at : at + nbytes], shape)
        else:
            outputs[name] = np.frombuffer(value, np.dtype(dtype), nbytes // np.dtype(dtype).itemsize, at).reshape(shape)
        at += nbytes
    return outputs
