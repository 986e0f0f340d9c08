"""KServe v2 gRPC messages <-> the HTTP codec's request document (gateway/parse.py, encode.py).

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

import struct
from collections.abc import Sequence
from typing import Any, NamedTuple

import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as pb

from ringserve.common.model_config import ModelConfig

from .classification import classified
from .encode import tensor_bytes
from .errors import BadRequest, GatewayError, status_of
from .phrases import say
from .request import InferRequest
from .shm_regions import WrittenOutput

# The typed `contents` field that carries each datatype (Triton's: FP16 and BF16 have none, they
# come as raw contents).
CONTENTS_FIELD = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents", "UINT32": "uint_contents",
    "UINT64": "uint64_contents", "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}
RAW_ONLY = ("FP16", "BF16")
# The datatype each typed field holds (Triton names it when the field does not fit the input's).
FIELD_DATATYPE = {"bool_contents": "BOOL", "int_contents": "INT32", "int64_contents": "INT64",
                  "uint_contents": "UINT32", "uint64_contents": "UINT64", "fp32_contents": "FP32",
                  "fp64_contents": "FP64", "bytes_contents": "BYTES"}

# The HTTP status of each GatewayError (gateway/errors.py's one table) -> the gRPC code Triton answers
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
    duck type of binary.BinaryReader that codec.parse_infer_doc reads `binary_data_size` from."""

    __slots__ = ("chunks", "index")

    def __init__(self) -> None:
        self.chunks: list[bytes] = []
        self.index = 0

    def add(self, chunk: bytes) -> int:
        self.chunks.append(chunk)
        return len(chunk)

    def take(self, name: str, nbytes: object) -> memoryview:
        chunk = self.chunks[self.index]  # parse_infer_doc takes them in the order add() was called
        self.index += 1
        return memoryview(chunk)

    def finish(self) -> None:
        pass


def parameter_value(param: pb.InferParameter | pb.ModelRepositoryParameter) -> Any:
    """The JSON value of one protobuf parameter (a oneof of bool, int64, uint64, double, string, bytes)."""
    kind = param.WhichOneof("parameter_choice")
    return None if kind is None else getattr(param, kind)


def parameters_doc(params) -> dict[str, Any]:
    return {key: parameter_value(value) for key, value in params.items()}


def infer_doc(request: pb.ModelInferRequest, raw: Sequence[bytes | memoryview] | None = None
              ) -> tuple[dict[str, Any], RawContents]:
    """The HTTP codec's request document for a ModelInferRequest, and its tensors' bytes (`raw`: the raw
    contents receive_infer_request kept out of the message; None: the message's own)."""
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
                raise BadRequest(say("grpc_contents_and_raw", f"input {tensor.name!r}: contents and "
                                                              "raw_input_contents are both given; send every input's "
                                                              "data one way", input=tensor.name,
                                     model=request.model_name))
            data = _typed_contents(tensor, request.model_name)
            if tensor.datatype == "BYTES":
                params["binary_data_size"] = reader.add(_bytes_form(data))
            else:
                item["data"] = data
        elif raw and "shared_memory_region" not in params:
            if next_raw >= len(raw):
                raise BadRequest(say("grpc_no_data", f"raw_input_contents has {len(raw)} entries, fewer than the "
                                                     "inputs that need one; give one per input, in the order of "
                                                     "'inputs'", input=tensor.name, model=request.model_name))
            params["binary_data_size"] = reader.add(raw[next_raw])
            next_raw += 1
        elif "shared_memory_region" not in params:
            field = CONTENTS_FIELD.get(tensor.datatype, "<type>_contents")
            raise BadRequest(say("grpc_no_data", f"input {tensor.name!r}: no data; give its values in "
                                                 f"contents.{field} or its bytes in raw_input_contents",
                                 input=tensor.name, model=request.model_name))
        if params:
            item["parameters"] = params
        inputs.append(item)
    if next_raw != len(raw):
        raise BadRequest(f"raw_input_contents has {len(raw)} entries but {next_raw} input(s) take one; give "
                         "one per input, in the order of 'inputs'")
    doc: dict[str, Any] = {"inputs": inputs}
    if request.id:
        doc["id"] = request.id
    if request.parameters:
        doc["parameters"] = parameters_doc(request.parameters)
    if request.outputs:
        doc["outputs"] = [{"name": o.name, "parameters": parameters_doc(o.parameters)} if o.parameters
                          else {"name": o.name} for o in request.outputs]
    return doc, reader


class ReceivedInfer(NamedTuple):
    """A ModelInferRequest as the server receives it: its raw contents, when large, apart (views)."""

    request: pb.ModelInferRequest
    raw: list[memoryview] | None = None  # None: in request.raw_input_contents


RAW_INPUT_FIELD = pb.ModelInferRequest.DESCRIPTOR.fields_by_name["raw_input_contents"].number
ZERO_COPY_MIN_BYTES = 64 * 1024  # below this, protobuf's own parse (C) is cheaper than the scan below


def receive_infer_request(data: bytes) -> ReceivedInfer:
    """The request deserializer of ModelInfer and ModelStreamInfer.

    protobuf copies each raw_input_contents entry into its message, and again into a new bytes
    object when it is read. A large message is scanned field by field instead (top level only): the
    raw contents stay views over the received bytes (np.frombuffer reads them there, so the first
    copy is the one into the slot), and protobuf parses the rest, which is small. A message the
    scan does not understand goes to protobuf whole, which refuses it if it is malformed."""
    if len(data) < ZERO_COPY_MIN_BYTES:
        return ReceivedInfer(pb.ModelInferRequest.FromString(data))
    view = memoryview(data)
    raw: list[memoryview] = []
    rest: list[memoryview] = []
    pos, end = 0, len(data)
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
                    raw.append(view[pos:pos + length])
                    pos += length
                    continue
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
        return ReceivedInfer(pb.ModelInferRequest.FromString(data))
    if pos != end:
        return ReceivedInfer(pb.ModelInferRequest.FromString(data))
    return ReceivedInfer(pb.ModelInferRequest.FromString(b"".join(rest)), raw)


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
        detail = f"input {tensor.name!r}: datatype {tensor.datatype} takes its values in {takes}; the request set: " \
                 f"{fields}"
        if len(given) != 1:
            raise BadRequest(detail)
        raise BadRequest(say("grpc_contents_type", detail, input=tensor.name, model=model,
                             got=FIELD_DATATYPE[given[0][0].name], expected=tensor.datatype))
    return list(given[0][1])


def _bytes_form(items: list[bytes]) -> bytes:
    """KServe's binary BYTES form: per element a 4-byte little-endian length, then its bytes."""
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


def infer_response(request: InferRequest, outputs: dict[str, np.ndarray]) -> pb.ModelInferResponse:
    """Triton's answer: every output's bytes in raw_output_contents (BYTES in the binary BYTES form)."""
    config: ModelConfig = request.model
    response = pb.ModelInferResponse(model_name=config.name, model_version=str(config.version),
                                     id=request.request_id or "")
    names = request.requested_outputs or [t.name for t in config.outputs]
    classes = request.classes
    if classes is not None:
        outputs = classified(config, classes, outputs)
    for name in names:
        datatype = "BYTES" if classes and name in classes else config.outputs_by_name[name].datatype
        array = outputs[name]
        response.outputs.add(name=name, datatype=datatype, shape=array.shape)
        if type(array) is WrittenOutput:  # already in the client's shared-memory region (gateway/shm_regions.py):
            response.raw_output_contents.append(b"")  # Triton keeps one empty entry per output, and no parameters
            continue
        response.raw_output_contents.append(bytes(tensor_bytes(datatype, array)))
    return response

