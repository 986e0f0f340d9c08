"""`pb_utils.Tensor` (a named numpy array; DLPack in and out) and the datatype helpers of Triton's
`triton_python_backend_utils`: TYPE_* strings and DataType numbers to numpy and back, BYTES tensors
serialized and read back. pb_utils re-exports every name."""

from __future__ import annotations

from typing import Any

import numpy as np

from ringserve.common.wire import deserialize_bytes_tensor as deserialize_bytes
from ringserve.common.wire import serialize_bytes_tensor

from .pb_errors import TritonModelException, UnsupportedFeature

TRITON_STRING_TO_NUMPY = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}
# Triton's DataType enum numbers (model_config.proto), BOOL = 1 .. STRING = 13.
_TRITON_TYPE_NUMBERS = [
    np.bool_,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.float16,
    np.float32,
    np.float64,
    np.object_,
]


class Tensor:
    """A named numpy array. Inputs of a request are read-only views of its rows in the batch's slot."""

    def __init__(self, name: str, data: Any, *_: Any) -> None:
        if not isinstance(data, np.ndarray):
            raise TritonModelException(f"Tensor {name!r}: expected a numpy array, got {type(data).__name__}")
        self._name, self._array = str(name), data

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def triton_dtype(self) -> int:
        return numpy_to_triton_type(self._array.dtype.type)

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        """A DLPack capsule of the array. numpy exports no read-only array: such one is copied first
        (a request's inputs are writable, over a private mapping of the slot: worker/requests.py)."""
        if self._array.dtype.hasobject:
            raise UnsupportedFeature(f"to_dlpack of BYTES tensor {self._name!r}")
        array = self._array if self._array.flags.writeable else self._array.copy()
        return array.__dlpack__()

    def __dlpack__(self, stream: Any = None) -> Any:
        return self.to_dlpack()

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU

    @staticmethod
    def from_dlpack(name: str, tensor: Any) -> Tensor:
        """From an object with __dlpack__ (a torch tensor, ...) or a DLPack capsule, on the CPU."""
        source = tensor if hasattr(tensor, "__dlpack__") else _Capsule(tensor)
        try:
            return Tensor(name, np.from_dlpack(source))
        except (BufferError, TypeError, RuntimeError) as exc:
            raise TritonModelException(
                f"Tensor.from_dlpack({name!r}): {exc} (only C-contiguous CPU tensors of numpy's types are accepted)"
            ) from None


class _Capsule:
    """A bare DLPack capsule as numpy.from_dlpack takes it (an object with __dlpack__)."""

    def __init__(self, capsule: Any) -> None:
        self.capsule = capsule

    def __dlpack__(self, stream: Any = None, **_: Any) -> Any:
        return self.capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)


def triton_string_to_numpy(triton_type_string: str) -> Any:
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def numpy_to_triton_string(data_type: Any) -> str:
    """'TYPE_FP32' for np.float32 (object and bytes_ arrays: 'TYPE_STRING')."""
    dtype = np.dtype(data_type)
    if dtype.hasobject or dtype.kind == "S":
        return "TYPE_STRING"
    return next(t for t, n in TRITON_STRING_TO_NUMPY.items() if np.dtype(n) == dtype)


def triton_to_numpy_type(data_type: int) -> Any:
    return _TRITON_TYPE_NUMBERS[data_type - 1] if 1 <= data_type <= len(_TRITON_TYPE_NUMBERS) else None


def numpy_to_triton_type(data_type: Any) -> int | None:
    dtype = np.dtype(data_type)
    if dtype.hasobject or dtype.kind == "S":
        return 13
    return next((i + 1 for i, n in enumerate(_TRITON_TYPE_NUMBERS) if np.dtype(n) == dtype), None)


def serialize_byte_tensor(input_tensor: np.ndarray) -> np.ndarray:
    return np.frombuffer(serialize_bytes_tensor(input_tensor), np.uint8)


def deserialize_bytes_tensor(encoded_tensor: Any) -> np.ndarray:
    """Every element of KServe's binary BYTES form, as a 1-D object array of bytes."""
    view, count, offset = memoryview(encoded_tensor).cast("B"), 0, 0
    while offset + 4 <= len(view):  # (the element count is not written down: walk the lengths once)
        offset += 4 + int.from_bytes(view[offset : offset + 4], "little")
        count += 1
    return deserialize_bytes(view, (count,))
