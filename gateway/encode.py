"""KServe v2 inference responses out: an answered InferRequest's outputs -> response body.

JSON (orjson serializes the numpy arrays itself), or with the binary tensor extension a JSON
header followed by the raw tensors (the caller sends Inference-Header-Content-Length); an
output written into a shared-memory region is answered with its parameters and no data.
Runs on the gateway's hot path once per request. Requests come in through gateway/parse.py.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import orjson

from ringserve.common.wire import serialize_bytes_tensor

from .binary import little_endian
from .classification import classified
from .errors import BadRequest
from .request import InferRequest

_NUMPY_OPTS = orjson.OPT_SERIALIZE_NUMPY


def encode_infer_response(request: InferRequest, outputs: dict[str, np.ndarray]) -> bytes:
    """The all-JSON response body (no output asked for as binary)."""
    config = request.model
    names = request.requested_outputs or [t.name for t in config.outputs]
    doc: dict[str, Any] = {"model_name": config.name, "model_version": str(config.version)}
    if request.request_id is not None:
        doc["id"] = request.request_id
    classes = request.classes
    if classes is not None:
        outputs = classified(config, classes, outputs)
    entries = []
    for n in names:
        datatype, array = "BYTES" if classes and n in classes else config.outputs_by_name[n].datatype, outputs[n]
        entries.append({"name": n, "datatype": datatype, "shape": list(array.shape),
                        "data": array.reshape(-1) if datatype != "BYTES" else _json_data(n, datatype, array)})
    doc["outputs"] = entries
    return orjson.dumps(doc, option=_NUMPY_OPTS)


def encode_response(request: InferRequest, outputs: dict[str, np.ndarray]) -> tuple[bytes, int | None]:
    """(body, JSON header length) — the length is None when the body is all JSON.

    An output written into a shared-memory region (a shm_regions.WrittenOutput, see write_outputs)
    is answered with its shape and the region's parameters, and no data."""
    if not request.binary_outputs and request.output_regions is None:
        return encode_infer_response(request, outputs), None
    config = request.model
    names = request.requested_outputs or [t.name for t in config.outputs]
    doc: dict[str, Any] = {"model_name": config.name, "model_version": str(config.version)}
    if request.request_id is not None:
        doc["id"] = request.request_id
    entries, chunks = [], []
    written = request.output_regions  # None for almost every request
    classes = request.classes
    if classes is not None:
        outputs = classified(config, classes, outputs)
    for n in names:
        datatype, array = "BYTES" if classes and n in classes else config.output(n).datatype, outputs[n]
        entry: dict[str, Any] = {"name": n, "datatype": datatype, "shape": list(array.shape)}
        if written is not None and n in written:  # a WrittenOutput
            entry["parameters"] = array.parameters
        elif n in request.binary_outputs:
            raw = tensor_bytes(datatype, array)
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = _json_data(n, datatype, array)
        entries.append(entry)
    doc["outputs"] = entries
    header = orjson.dumps(doc, option=_NUMPY_OPTS)
    if not chunks:  # every output in a region or JSON: an all-JSON body
        return header, None
    return b"".join([header, *chunks]), len(header)


def _json_data(name: str, datatype: str, array: np.ndarray) -> Any:
    if datatype != "BYTES":
        return array.reshape(-1)
    try:
        return [item.decode() if isinstance(item, bytes) else str(item) for item in array.reshape(-1)]
    except UnicodeDecodeError:
        raise BadRequest(f"output {name!r} holds bytes that are not UTF-8, which JSON cannot carry; "
                         "ask for it as binary data (parameters.binary_data: true)") from None


def tensor_bytes(datatype: str, array: np.ndarray) -> bytes | memoryview:
    if datatype == "BYTES":
        return serialize_bytes_tensor(array)
    flat = np.ascontiguousarray(array.reshape(-1), dtype=little_endian(array.dtype))
    return memoryview(flat.view(np.uint8))
