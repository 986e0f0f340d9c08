"""The tensor datatypes ringserve serves, by each name they go by.

KServe's name ("FP32") is the one used everywhere inside ringserve; Triton's config.json
says "TYPE_FP32", onnxruntime's NodeArg "tensor(float)", the ONNX graph an element-type
number. BYTES is KServe's string tensor (numpy object arrays of bytes or str).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

import numpy as np
import onnx

from ringserve.common.errors import ConfigError


class _Datatype(NamedTuple):
    kserve: str
    triton: str
    numpy: np.dtype
    ort: str  # what onnxruntime's NodeArg.type says
    onnx: int  # onnx.TensorProto element type, for reading graphs without a session


_DATATYPES = (
    _Datatype("BOOL", "TYPE_BOOL", np.dtype(np.bool_), "tensor(bool)", onnx.TensorProto.BOOL),
    _Datatype("UINT8", "TYPE_UINT8", np.dtype(np.uint8), "tensor(uint8)", onnx.TensorProto.UINT8),
    _Datatype("UINT16", "TYPE_UINT16", np.dtype(np.uint16), "tensor(uint16)", onnx.TensorProto.UINT16),
    _Datatype("UINT32", "TYPE_UINT32", np.dtype(np.uint32), "tensor(uint32)", onnx.TensorProto.UINT32),
    _Datatype("UINT64", "TYPE_UINT64", np.dtype(np.uint64), "tensor(uint64)", onnx.TensorProto.UINT64),
    _Datatype("INT8", "TYPE_INT8", np.dtype(np.int8), "tensor(int8)", onnx.TensorProto.INT8),
    _Datatype("INT16", "TYPE_INT16", np.dtype(np.int16), "tensor(int16)", onnx.TensorProto.INT16),
    _Datatype("INT32", "TYPE_INT32", np.dtype(np.int32), "tensor(int32)", onnx.TensorProto.INT32),
    _Datatype("INT64", "TYPE_INT64", np.dtype(np.int64), "tensor(int64)", onnx.TensorProto.INT64),
    _Datatype("FP16", "TYPE_FP16", np.dtype(np.float16), "tensor(float16)", onnx.TensorProto.FLOAT16),
    _Datatype("FP32", "TYPE_FP32", np.dtype(np.float32), "tensor(float)", onnx.TensorProto.FLOAT),
    _Datatype("FP64", "TYPE_FP64", np.dtype(np.float64), "tensor(double)", onnx.TensorProto.DOUBLE),
    _Datatype("BYTES", "TYPE_STRING", np.dtype(np.object_), "tensor(string)", onnx.TensorProto.STRING),
)
_BY_KSERVE = {d.kserve: d for d in _DATATYPES}
_BY_TRITON = {d.triton: d for d in _DATATYPES}
_BY_ORT = {d.ort: d for d in _DATATYPES}
_BY_ONNX = {d.onnx: d for d in _DATATYPES}

KSERVE_DATATYPES = frozenset(_BY_KSERVE)


def _lookup(table: Mapping[str, _Datatype], key: str, what: str) -> _Datatype:
    try:
        return table[key]
    except KeyError:
        accepted = ", ".join(sorted(table))
        raise ConfigError(None, "datatype", f"unknown {what} datatype {key!r}; accepted: {accepted}") from None


def kserve_from_triton(triton_datatype: str) -> str:
    """KServe datatype name for Triton's config name ("TYPE_FP32" -> "FP32"); ConfigError if unknown."""
    return _lookup(_BY_TRITON, triton_datatype, "Triton").kserve


def triton_from_kserve(kserve_datatype: str) -> str:
    """Triton's config name for a KServe datatype name ("FP32" -> "TYPE_FP32")."""
    return _lookup(_BY_KSERVE, kserve_datatype, "KServe").triton


def kserve_from_onnx(elem_type: int) -> str | None:
    """KServe datatype name for an onnx.TensorProto element type; None for a type ringserve cannot serve."""
    datatype = _BY_ONNX.get(elem_type)
    return None if datatype is None else datatype.kserve


def numpy_dtype(kserve_datatype: str) -> np.dtype:
    """numpy dtype for a KServe datatype name ("FP32" -> float32, "BYTES" -> object)."""
    return _lookup(_BY_KSERVE, kserve_datatype, "KServe").numpy


def kserve_from_numpy(dtype: np.dtype) -> str:
    """KServe datatype name for a numpy dtype of fixed size (float32 -> "FP32"); ConfigError if none."""
    for datatype in _DATATYPES:
        if datatype.numpy == dtype.newbyteorder("="):
            return datatype.kserve
    raise ConfigError(None, "datatype", f"numpy dtype {dtype} has no KServe datatype")


def kserve_datatype_from_ort(ort_type: str) -> str:
    """KServe datatype name for an onnxruntime type string ("tensor(float)" -> "FP32")."""
    return _lookup(_BY_ORT, ort_type, "onnxruntime").kserve
