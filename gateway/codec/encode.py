"""KServe v2 inference responses out: an answered InferRequest's outputs -> response body.

JSON (orjson serializes the numpy arrays itself), or with the binary tensor extension a JSON
header followed by the raw tensors (the caller sends Inference-Header-Content-Length); an
output written into a shared-memory region is answered with its name, datatype and shape
only, as Triton answers it (its C++ client reads `binary_data_size` from any `parameters`).
Runs on the gateway's hot path once per request. Requests come in through gateway/codec/parse.py.

Where JSON cannot say what a tensor holds, the answer is Triton's (its rapidjson writer):
NaN, Infinity and -Infinity for non-finite floats (orjson writes null, and a body without `null`
has none: the common case is orjson's one call and one search of its bytes), and a BYTES element
that is not UTF-8 as its bytes, unchanged, inside the JSON string.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import orjson

from ringserve.common.wire import serialize_bytes_tensor
from ringserve.gateway.codec.binary import little_endian
from ringserve.gateway.codec.classification import classified
from ringserve.gateway.core.request import InferRequest

_NUMPY_OPTS = orjson.OPT_SERIALIZE_NUMPY


def encode_infer_response(request: InferRequest, outputs: dict[str, np.ndarray]) -> bytes:
    """The all-JSON response body (no output asked for as binary)."""
    config = request.model
    names = request.requested_outputs or [t.name for t in config.outputs]
    doc: dict[str, Any] = {"model_name": config.name, "model_version": str(config.version)}
    if request.kserve_id is not None:
        doc["id"] = request.kserve_id
    if request.response_parameters is not None:  # what the model set on its response (Triton's "parameters")
        doc["parameters"] = request.response_parameters
    classes = request.classes
    if classes is not None:
        outputs = classified(config, classes, outputs)
    entries = []
    for n in names:
        datatype, array = "BYTES" if classes and n in classes else config.outputs_by_name[n].datatype, outputs[n]
        entries.append(
            {
                "name": n,
                "datatype": datatype,
                "shape": list(array.shape),
                "data": array.reshape(-1) if datatype != "BYTES" else _json_data(datatype, array),
            }
        )
    doc["outputs"] = entries
    return _dumps(doc)


def encode_response(request: InferRequest, outputs: dict[str, np.ndarray]) -> tuple[bytes, int | None]:
    """(body, JSON header length) — the length is None when the body is all JSON.

    An output written into a shared-memory region (a shm_regions.WrittenOutput, see write_outputs)
    is answered with its name, datatype and shape, and no data."""
    if not request.binary_outputs and request.output_regions is None:
        return encode_infer_response(request, outputs), None
    config = request.model
    names = request.requested_outputs or [t.name for t in config.outputs]
    doc: dict[str, Any] = {"model_name": config.name, "model_version": str(config.version)}
    if request.kserve_id is not None:
        doc["id"] = request.kserve_id
    if request.response_parameters is not None:
        doc["parameters"] = request.response_parameters
    entries, chunks = [], []
    written = request.output_regions  # None for almost every request
    classes = request.classes
    if classes is not None:
        outputs = classified(config, classes, outputs)
    for n in names:
        datatype, array = "BYTES" if classes and n in classes else config.output(n).datatype, outputs[n]
        entry: dict[str, Any] = {"name": n, "datatype": datatype, "shape": list(array.shape)}
        if written is not None and n in written:  # a WrittenOutput: Triton says no more of it
            pass
        elif n in request.binary_outputs:
            raw = tensor_bytes(datatype, array)
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = _json_data(datatype, array)
        entries.append(entry)
    doc["outputs"] = entries
    header = _dumps(doc)
    if not chunks:  # every output in a region or JSON: an all-JSON body
        return header, None
    return b"".join([header, *chunks]), len(header)


def _dumps(doc: dict[str, Any]) -> bytes:
    """orjson's JSON of a response, with Triton's literals for NaN and ±Infinity. orjson writes each as
    null, which no finite number is: a body without `null` is the answer as it is (a search of its bytes,
    0.1-0.4 µs). One with it (a non-finite float, or a name, id or string that holds "null") is made again,
    each float output checked. This replaced a per-batch np.isfinite scan of every output in the slot:
    ~15 µs of the gateway's CPU per request at one client (its cold numpy code path), for every protocol,
    where only JSON answers need it."""
    body = orjson.dumps(doc, option=_NUMPY_OPTS)
    return body if b"null" not in body else _dumps_non_finite(doc)


def _dumps_non_finite(doc: dict[str, Any]) -> bytes:
    """The JSON of a response that may hold NaN or ±Infinity: each float output that does, as orjson
    writes it, with Triton's literals where orjson would write null."""
    for entry in doc["outputs"]:
        data = entry.get("data")
        if _has_non_finite(data):
            entry["data"] = orjson.Fragment(_non_finite_json(data))
    return orjson.dumps(doc, option=_NUMPY_OPTS)


def _has_non_finite(data: Any) -> bool:
    return isinstance(data, np.ndarray) and data.dtype.kind == "f" and not np.isfinite(data).all()


def _non_finite_json(flat: np.ndarray) -> bytes:
    """orjson's list with each null (a NaN or ±Infinity, in order) written as rapidjson writes it."""
    pieces = orjson.dumps(flat, option=_NUMPY_OPTS).split(b"null")
    literals = [b"NaN" if v != v else b"Infinity" if v > 0 else b"-Infinity" for v in flat[~np.isfinite(flat)]]
    return pieces[0] + b"".join(literal + piece for literal, piece in zip(literals, pieces[1:]))


def _json_data(datatype: str, array: np.ndarray) -> Any:
    if datatype != "BYTES":
        return array.reshape(-1)
    items = array.reshape(-1)
    try:
        return [item.decode() if isinstance(item, bytes) else str(item) for item in items]
    except UnicodeDecodeError:
        return orjson.Fragment(_raw_json_strings(items))


# What rapidjson's writer escapes in a string (its `escape` table): '"', '\\' and control bytes.
_JSON_ESCAPED = re.compile(rb'["\\\x00-\x1f]')
_SHORT_ESCAPES = {0x08: b"\\b", 0x09: b"\\t", 0x0A: b"\\n", 0x0C: b"\\f", 0x0D: b"\\r", 0x22: b'\\"', 0x5C: b"\\\\"}


def _escape(match: re.Match) -> bytes:
    byte = match[0][0]
    return _SHORT_ESCAPES.get(byte) or b"\\u%04X" % byte


def _raw_json_strings(items: np.ndarray) -> bytes:
    """A JSON list of BYTES elements that are not all UTF-8, as Triton writes them: each element's bytes
    inside quotes, unchanged but for rapidjson's escapes (its UTF-8 to UTF-8 writer copies every other
    byte). JSON strings are UTF-8, so such a body is not strictly JSON; binary output carries any bytes."""
    strings = [
        b'"' + _JSON_ESCAPED.sub(_escape, item if isinstance(item, bytes) else str(item).encode()) + b'"'
        for item in items
    ]
    return b"[" + b",".join(strings) + b"]"


def tensor_bytes(datatype: str, array: np.ndarray) -> bytes | memoryview:
    if datatype == "BYTES":
        return serialize_bytes_tensor(array)
    flat = np.ascontiguousarray(array.reshape(-1), dtype=little_endian(array.dtype))
    return memoryview(flat.view(np.uint8))
