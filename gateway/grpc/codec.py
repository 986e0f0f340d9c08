"""KServe v2 gRPC messages <-> the HTTP codec's request document (gateway/codec/parse.py, encode.py).

A ModelInferRequest becomes the same document a JSON request body is parsed into, and goes
through the same checks (`parse_infer_doc`): one validation, the same error messages, the same
InferRequest, so an HTTP and a gRPC request can share a batch. Where the tensor bytes lie:

  raw_input_contents[i]       the input's `parameters.binary_data_size`, handed out by RawContents
                              exactly as the binary part of an HTTP body is (np.frombuffer views
                              over the message's bytes, no copy until the slot)
  contents.<type>_contents    `data` (the JSON path's numbers), except BYTES: its elements are
                              laid out in KServe's binary BYTES form and handed out like raw ones
  parameters (request, input,  JSON values, passed through as they are, so the shared-memory
  output)                     extension's `shared_memory_region/offset/byte_size` read the same

Answers always carry `raw_output_contents`, one per output, as Triton's gRPC server answers.
"""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import grpc
import numpy as np
from google.protobuf.message import DecodeError
from tritonclient.grpc import service_pb2 as pb

from ringserve.common.repository.config import ModelConfig
from ringserve.common.repository.datatypes import numpy_dtype
from ringserve.gateway.codec.classification import classified
from ringserve.gateway.codec.encode import tensor_bytes
from ringserve.gateway.core.errors import BadRequest, GatewayError, PayloadTooLarge, echo, status_of
from ringserve.gateway.core.phrases import say
from ringserve.gateway.core.regions import WrittenOutput
from ringserve.gateway.core.request import InferRequest

# The typed `contents` field that carries each datatype (Triton's: FP16 and BF16 have none, they
# come as raw contents).
CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
RAW_ONLY = ("FP16", "BF16")
# The datatype each typed field holds (Triton names it when the field does not fit the input's).
FIELD_DATATYPE = {
    "bool_contents": "BOOL",
    "int_contents": "INT32",
    "int64_contents": "INT64",
    "uint_contents": "UINT32",
    "uint64_contents": "UINT64",
    "fp32_contents": "FP32",
    "fp64_contents": "FP64",
    "bytes_contents": "BYTES",
}

# The HTTP status of each GatewayError (gateway/core/errors.py's one table) -> the gRPC code Triton answers
# for that kind of error (triton-inference-server/server src/grpc/grpc_utils.cc: INVALID_ARG ->
# INVALID_ARGUMENT, NOT_FOUND, UNAVAILABLE, INTERNAL, CANCELLED).
GRPC_CODE = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    401: grpc.StatusCode.UNAUTHENTICATED,
    404: grpc.StatusCode.NOT_FOUND,
    405: grpc.StatusCode.UNIMPLEMENTED,
    408: grpc.StatusCode.DEADLINE_EXCEEDED,
    413: grpc.StatusCode.RESOURCE_EXHAUSTED,  # what grpc itself answers past the message size limit
    415: grpc.StatusCode.INVALID_ARGUMENT,
    431: grpc.StatusCode.RESOURCE_EXHAUSTED,
    499: grpc.StatusCode.CANCELLED,
    500: grpc.StatusCode.INTERNAL,
    501: grpc.StatusCode.UNIMPLEMENTED,  # (Triton's UNSUPPORTED)
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}


def grpc_code(exc: GatewayError) -> grpc.StatusCode:
    return GRPC_CODE.get(status_of(exc), grpc.StatusCode.INTERNAL)


class RawContents:
    """Hands out the tensors of a gRPC request that have no JSON numbers, in input order: the
    duck type of binary.BinaryReader that codec.parse_infer_doc reads `binary_data_size` from.
    A chunk may be a function that makes it (bytes_contents' binary form): made when it is taken,
    after the parser has checked the input's shape, so that a shape it refuses costs no element."""

    __slots__ = ("chunks", "index")

    def __init__(self) -> None:
        self.chunks: list[bytes | memoryview | Callable[[], bytes]] = []
        self.index = 0

    def add(self, chunk: bytes | memoryview | Callable[[], bytes]) -> int:
        self.chunks.append(chunk)
        return len(chunk) if not callable(chunk) else 0  # (parse_infer_doc hands the size back to take())

    def take(self, name: str, nbytes: object) -> memoryview:
        chunk = self.chunks[self.index]  # parse_infer_doc takes them in the order add() was called
        self.index += 1
        return memoryview(chunk() if callable(chunk) else chunk)

    def finish(self) -> None:
        pass


def parameter_value(param: pb.InferParameter | pb.ModelRepositoryParameter) -> Any:
    """The JSON value of one protobuf parameter (a oneof of bool, int64, uint64, double, string, bytes)."""
    kind = param.WhichOneof("parameter_choice")
    return None if kind is None else getattr(param, kind)


def set_parameters(target, values: dict[str, Any]) -> None:
    """A map of InferParameter (a response's `parameters`) set from JSON values, each as Triton types it:
    bool_param, int64_param, double_param, string_param."""
    for name, value in values.items():
        param = target[name]
        if type(value) is bool:
            param.bool_param = value
        elif isinstance(value, int):
            param.int64_param = value
        elif isinstance(value, float):
            param.double_param = value
        else:
            param.string_param = str(value)


def parameters_doc(params) -> dict[str, Any]:
    return {key: parameter_value(value) for key, value in params.items()}


def infer_doc(
    request: pb.ModelInferRequest, raw: Sequence[bytes | memoryview] | None = None, capacity_bytes: int | None = None
) -> tuple[dict[str, Any], RawContents]:
    """The HTTP codec's request document for a ModelInferRequest, and its tensors' bytes (`raw`: the raw
    contents receive_infer_request kept out of the message; None: the message's own). `capacity_bytes`:
    a slot's, which typed contents are checked against before a value is converted (None: unchecked)."""
    if raw is None:
        raw = request.raw_input_contents
    reader = RawContents()
    inputs = []
    next_raw = 0
    for tensor in request.inputs:
        item: dict[str, Any] = {"name": tensor.name, "datatype": tensor.datatype, "shape": list(tensor.shape)}
        params = parameters_doc(tensor.parameters) if tensor.parameters else {}
        params.pop("binary_data_size", None)  # HTTP's; over gRPC the contents say where the bytes are
        if tensor.HasField("contents"):
            if raw:
                raise BadRequest(
                    say(
                        "grpc_contents_and_raw",
                        f"input {echo(tensor.name)}: contents and "
                        "raw_input_contents are both given; send every input's "
                        "data one way",
                        input=echo(tensor.name, quoted=False),
                        model=request.model_name,
                    )
                )
            data = _typed_contents(tensor, request.model_name)
            _check_count(tensor, len(data), capacity_bytes)
            if tensor.datatype == "BYTES":
                params["binary_data_size"] = reader.add(functools.partial(_bytes_form, data))
            else:
                item["data"] = list(data)
        elif raw and "shared_memory_region" not in params:
            if next_raw >= len(raw):
                raise BadRequest(
                    say(
                        "grpc_no_data",
                        f"raw_input_contents has {len(raw)} entries, fewer than the "
                        "inputs that need one; give one per input, in the order of "
                        "'inputs'",
                        input=tensor.name,
                        model=request.model_name,
                    )
                )
            params["binary_data_size"] = reader.add(raw[next_raw])
            next_raw += 1
        elif "shared_memory_region" not in params:
            field = CONTENTS_FIELD.get(tensor.datatype, "<type>_contents")
            raise BadRequest(
                say(
                    "grpc_no_data",
                    f"input {echo(tensor.name)}: no data; give its values in "
                    f"contents.{field} or its bytes in raw_input_contents",
                    input=echo(tensor.name, quoted=False),
                    model=echo(request.model_name, quoted=False),
                )
            )
        if params:
            item["parameters"] = params
        inputs.append(item)
    if next_raw != len(raw):
        raise BadRequest(
            f"raw_input_contents has {len(raw)} entries but {next_raw} input(s) take one; give "
            "one per input, in the order of 'inputs'"
        )
    doc: dict[str, Any] = {"inputs": inputs}
    if request.id:
        doc["id"] = request.id
    if request.parameters:
        doc["parameters"] = parameters_doc(request.parameters)
        doc["parameters"].pop(
            "triton_enable_empty_final_response", None
        )  # (the stream's; Triton's model never sees it)
    if request.outputs:
        doc["outputs"] = [
            {"name": o.name, "parameters": parameters_doc(o.parameters)} if o.parameters else {"name": o.name}
            for o in request.outputs
        ]
    return doc, reader


class ReceivedInfer(NamedTuple):
    """A ModelInferRequest as the server receives it: its raw contents, when large, apart (views)."""

    request: pb.ModelInferRequest
    raw: list[memoryview] | None = None  # None: in request.raw_input_contents
    nbytes: int = 0  # the message's size on the wire
    # Makes the error that refuses the message (not protobuf, or typed contents past a slot); then
    # `request` is empty. A deserializer that raises is answered by grpc itself, as "UNKNOWN: Unexpected
    # <class 'DecodeError'>". (A function, not the error: a raised error held here would be a cycle.)
    refusal: Callable[[], GatewayError] | None = None


RAW_INPUT_FIELD = pb.ModelInferRequest.DESCRIPTOR.fields_by_name["raw_input_contents"].number
INPUTS_FIELD = pb.ModelInferRequest.DESCRIPTOR.fields_by_name["inputs"].number
TENSOR_CONTENTS_FIELD = pb.ModelInferRequest.InferInputTensor.DESCRIPTOR.fields_by_name["contents"].number
ZERO_COPY_MIN_BYTES = 64 * 1024  # below this, protobuf's own parse (C) is cheaper than the scan below
# The most wire bytes a typed value takes per byte it takes in a slot: 1.5 for fp32, fp64 and bytes_contents
# (an element is a tag, a length of up to 5 bytes and its bytes on the wire, a 4-byte length and its bytes in
# the slot; an unpacked number is a tag and its 4 or 8 bytes), 11 for a varint field (a tag and the 10 bytes of
# a negative int32, for the 1 byte of an INT8).
_WIRE_PER_SLOT_BYTE = {
    pb.InferTensorContents.DESCRIPTOR.fields_by_name[name].number: 1.5
    for name in ("fp32_contents", "fp64_contents", "bytes_contents")
}
_VARINT_WIRE_PER_SLOT_BYTE = 11


def receive_infer_request(data: bytes, capacity_bytes: int | None = None) -> ReceivedInfer:
    """The request deserializer of ModelInfer and ModelStreamInfer.

    protobuf copies each raw_input_contents entry into its message, and again into a new bytes
    object when it is read. A large message is scanned field by field instead (top level only): the
    raw contents stay views over the received bytes (np.frombuffer reads them there, so the first
    copy is the one into the slot), and protobuf parses the rest, which is small. A message the
    scan does not understand goes to protobuf whole, which refuses it if it is malformed (`refusal`).

    The scan also bounds the typed contents before protobuf makes an element of each value (16 MB of
    empty bytes_contents took its parse half a second of the loop): a message whose contents cannot
    fit a slot of `capacity_bytes` is refused unparsed."""
    try:
        return _received(data, capacity_bytes)
    except DecodeError as exc:
        return ReceivedInfer(
            pb.ModelInferRequest(),
            nbytes=len(data),
            refusal=functools.partial(
                BadRequest,
                f"the message is not a ModelInferRequest in protobuf's encoding ({exc}): "
                "send one serialized by the KServe v2 gRPC protocol's messages",
            ),
        )


def _received(data: bytes, capacity_bytes: int | None) -> ReceivedInfer:
    if len(data) < ZERO_COPY_MIN_BYTES:
        return ReceivedInfer(pb.ModelInferRequest.FromString(data), nbytes=len(data))
    view = memoryview(data)
    raw: list[memoryview] = []
    rest: list[memoryview] = []
    pos, end = 0, len(data)
    least_bytes = 0  # what the typed contents take in a slot, at least
    try:
        while pos < end:
            start = pos
            key, pos = _varint(data, pos)
            wire = key & 7
            if wire == 2:  # length-delimited: strings, messages, bytes
                length, pos = _varint(data, pos)
                if pos + length > end:
                    raise ValueError("truncated")
                if key >> 3 == RAW_INPUT_FIELD:
                    raw.append(view[pos : pos + length])
                    pos += length
                    continue
                if key >> 3 == INPUTS_FIELD:
                    least_bytes += _contents_slot_bytes(data, pos, pos + length)
                pos += length
            elif wire == 0:
                _, pos = _varint(data, pos)
            elif wire == 1:
                pos += 8
            elif wire == 5:
                pos += 4
            else:
                raise ValueError(f"wire type {wire}")
            rest.append(view[start:pos])
    except (ValueError, IndexError):
        return ReceivedInfer(pb.ModelInferRequest.FromString(data), nbytes=end)
    if pos != end:
        return ReceivedInfer(pb.ModelInferRequest.FromString(data), nbytes=end)
    if capacity_bytes is not None and least_bytes > capacity_bytes:
        return ReceivedInfer(
            pb.ModelInferRequest(),
            nbytes=end,
            refusal=functools.partial(
                PayloadTooLarge, least_bytes, capacity_bytes, "the request's typed contents", at_least=True
            ),
        )
    return ReceivedInfer(pb.ModelInferRequest.FromString(b"".join(rest)), raw, end)


def _contents_slot_bytes(data: bytes, pos: int, end: int) -> int:
    """The fewest slot bytes of the typed contents in data[pos:end], an InferInputTensor: its contents'
    size on the wire over what its kind of field takes there per slot byte (its first field tells)."""
    while pos < end:
        key, pos = _varint(data, pos)
        wire = key & 7
        if wire == 2:
            length, pos = _varint(data, pos)
            if key >> 3 == TENSOR_CONTENTS_FIELD:
                field = _varint(data, pos)[0] >> 3 if length else 0
                return int(length / _WIRE_PER_SLOT_BYTE.get(field, _VARINT_WIRE_PER_SLOT_BYTE))
            pos += length
        elif wire == 0:
            _, pos = _varint(data, pos)
        elif wire in (1, 5):
            pos += 8 if wire == 1 else 4
        else:
            raise ValueError(f"wire type {wire}")
    return 0


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _typed_contents(tensor: pb.ModelInferRequest.InferInputTensor, model: str = "") -> list:
    given = tensor.contents.ListFields()
    expected = CONTENTS_FIELD.get(tensor.datatype)
    if not given and expected is not None and 0 in tensor.shape:  # a zero-sized tensor's empty list is unset
        return []
    # (a datatype KServe lacks is left to the parser, which names the model's)
    raw_only = expected is None and tensor.datatype in RAW_ONLY
    if len(given) != 1 or raw_only or (expected is not None and given[0][0].name != expected):
        fields = ", ".join(f.name for f, _ in given) or "none"
        takes = f"contents.{expected}" if expected else "raw_input_contents (it has no typed contents field)"
        detail = (
            f"input {echo(tensor.name)}: datatype {echo(tensor.datatype, quoted=False)} takes its values in "
            f"{takes}; the request set: {fields}"
        )
        if len(given) != 1:
            raise BadRequest(detail)
        raise BadRequest(
            say(
                "grpc_contents_type",
                detail,
                input=echo(tensor.name, quoted=False),
                model=echo(model, quoted=False),
                got=FIELD_DATATYPE[given[0][0].name],
                expected=tensor.datatype,
            )
        )
    return given[0][1]


# Longer shapes are left to the parser, which refuses them (and whose product could be a huge number).
_COUNTED_DIMS = 64


def _check_count(tensor: pb.ModelInferRequest.InferInputTensor, count: int, capacity_bytes: int | None) -> None:
    """Typed contents refused by their number alone, before each value becomes a Python object (16 Mi
    fp32_contents for a [1, 512] input took the loop seconds before its 400): more values than the
    shape has elements, or than a slot holds (a value takes its itemsize there, a BYTES element at least
    its 4-byte length)."""
    datatype = tensor.datatype
    if capacity_bytes is not None and datatype in CONTENTS_FIELD:
        least = count * (4 if datatype == "BYTES" else numpy_dtype(datatype).itemsize)
        if least > capacity_bytes:
            raise PayloadTooLarge(
                least,
                capacity_bytes,
                f"input {echo(tensor.name)} ({count} values of {datatype})",
                at_least=datatype == "BYTES",
            )
    shape = tensor.shape
    if len(shape) <= _COUNTED_DIMS and all(d >= 0 for d in shape) and math.prod(shape) != count:
        raise BadRequest(
            f"input {echo(tensor.name)}: shape {list(shape)} needs {math.prod(shape)} values, data has {count}"
        )


def _bytes_form(items: Sequence[bytes]) -> bytes:
    """KServe's binary BYTES form: per element a 4-byte little-endian length, then its bytes."""
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


def infer_response(request: InferRequest, outputs: dict[str, np.ndarray]) -> pb.ModelInferResponse:
    """Triton's answer: every output's bytes in raw_output_contents (BYTES in the binary BYTES form)."""
    config: ModelConfig = request.model
    response = pb.ModelInferResponse(
        model_name=config.name, model_version=str(config.version), id=request.kserve_id or ""
    )
    if request.response_parameters is not None:  # what the model set on its response, each of its type
        set_parameters(response.parameters, request.response_parameters)
    names = request.requested_outputs or [t.name for t in config.outputs]
    classes = request.classes
    if classes is not None:
        outputs = classified(config, classes, outputs)
    for name in names:
        datatype = "BYTES" if classes and name in classes else config.outputs_by_name[name].datatype
        array = outputs[name]
        response.outputs.add(name=name, datatype=datatype, shape=array.shape)
        if type(array) is WrittenOutput:  # already in the client's shared-memory region (gateway/core/regions.py):
            response.raw_output_contents.append(b"")  # Triton keeps one empty entry per output, and no parameters
            continue
        response.raw_output_contents.append(bytes(tensor_bytes(datatype, array)))
    return response
