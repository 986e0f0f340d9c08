"""Triton's generate extension: POST /v2/models/{m}[/versions/{v}]/generate and /generate_stream.

The reference is Triton's docs/protocol/extension_generate.md and http_server.cc (HandleGenerate,
GenerateRequestClass). A body is one flat JSON object; each top-level key, and each key of its `parameters`
object, is the input tensor of that name when the model has one (its value a scalar or an array, shaped to
the input's dims: the innermost variable dim takes what the fixed ones leave, any other is 1), or else a
request parameter (a string, number or boolean). `id` is the request's id. The body becomes a KServe
request document and is checked by the same parser as /infer's (gateway/kserve/parse.py), then goes the
same way: the model's queue, a batch, a slot, a worker; so it is requeued when its worker dies, and batched
with /infer's requests.

An answer is one JSON object: `id`, `model_name`, `model_version`, each parameter the model set on its
response, and each output (its values as a list, or the one value of a one-element output), keys in
Triton's order (sorted). /generate answers one response: a model that sent none or several gets 500
(Triton's words). /generate_stream answers `text/event-stream; charset=utf-8`, one `data: {...}\\n\\n` event
per response as the worker sends it (gateway/http/streams.py), written at once, so a client reads the first
token while the model makes the second; its status is the first response's (an error's status when the
model's first response is one). A failure after an event went out is an event too: `data: {"error": ...}`.
A failure before any response (a bad body, an unknown model, a full queue) is a plain JSON error.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import orjson

from ringserve.common.repository.config import ModelConfig, TensorConfig
from ringserve.gateway.core.errors import (
    BadRequest,
    GatewayError,
    GenerateBodyTooLarge,
    ResponseCountWrong,
    error_body,
)
from ringserve.gateway.core.phrases import say
from ringserve.gateway.http.limits import ARRIVED_NS
from ringserve.gateway.http.routes import disconnect_probe, on_disconnect
from ringserve.gateway.http.streams import Response, ResponseStream
from ringserve.gateway.kserve.dataplane import FAULT_INJECTION, PARSE_ASIDE_MIN_BYTES, DataPlane, InferCall
from ringserve.gateway.observe.access import REQUEST_ID_HEADER, request_id_of

JSON_HEADERS = [(b"content-type", b"application/json")]
EVENT_STREAM_HEADERS = [(b"content-type", b"text/event-stream; charset=utf-8"), (b"cache-control", b"no-cache")]
GENERATE, GENERATE_STREAM = "generate", "generate_stream"
RESERVED_KEYS = ("id", "model_name", "model_version")  # an answer's own keys: a same-named output never hides them

ReadBody = Callable[[Any, bytes | None], Awaitable[bytes]]


class Members(dict):
    """A JSON object that also keeps its members in order with their repeats (Triton refuses an input twice)."""

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        super().__init__(pairs)
        self.pairs = pairs


def match_generate_path(path: str) -> tuple[str, str | None, str] | None:
    """'/v2/models/m/generate_stream' -> ('m', None, 'generate_stream'); with /versions/{v}: ('m', 'v', ...)."""
    if not path.startswith("/v2/models/"):
        return None
    head, _, route = path.rpartition("/")
    if route not in (GENERATE, GENERATE_STREAM):
        return None
    parts = head[len("/v2/models/") :].split("/")
    if len(parts) == 1 and parts[0]:
        return parts[0], None, route
    if len(parts) == 3 and parts[1] == "versions" and parts[0] and parts[2]:
        return parts[0], parts[2], route
    return None


class GenerateEndpoints:
    """/generate and /generate_stream over the data plane; `read_body` is the infer path's body reader (its
    limits: --max-request-bytes, --body-timeout-s)."""

    def __init__(self, plane: DataPlane, read_body: ReadBody) -> None:
        self.plane = plane
        self.read_body = read_body

    async def serve(self, scope: dict, receive: Any, send: Any, model: str, version: str | None, route: str) -> None:
        plane = self.plane
        headers = dict(scope["headers"])
        call = plane.begin(
            model, request_id_of(headers.get(REQUEST_ID_HEADER)), scope["headers"], "http", scope.get(ARRIVED_NS)
        )
        answer = _Answer(send, call.request_id)
        stream = ResponseStream()
        try:
            config = plane.target(call, model, version, f"HTTP's /{route}", streaming=True)
            encoding = headers.get(b"content-encoding", b"identity").strip().lower()
            if encoding != b"identity":
                raise BadRequest(say("generate_encoding"))
            body = await self.read_body(receive, headers.get(b"content-length"))
            if len(body) > plane.capacity_bytes:
                raise GenerateBodyTooLarge(len(body), plane.capacity_bytes)
            if len(body) > PARSE_ASIDE_MIN_BYTES:  # (a big body's JSON decoded off the loop)
                loop = asyncio.get_running_loop()
                doc = await loop.run_in_executor(plane.parse_thread, infer_doc_of, config, body)
            else:
                doc = infer_doc_of(config, body)
            parse = plane.doc_parser(config, doc, FAULT_INJECTION)
            on_disconnect(receive, stream.cancel)  # (a Python model sees is_cancelled(); the slot is let go)
            stream.follow(plane.run(call, parse, len(body), disconnect_probe(receive), stream.push), call)
            if route == GENERATE_STREAM:
                status = await self._stream(answer, call, config, stream)
            else:
                status = await self._one(answer, call, config, stream)
        except GatewayError as exc:
            status = plane.failed(call, exc)
            await answer.error(exc, status)
        plane.finish(call, status, "POST", scope["path"], answer.nbytes, status)

    async def _one(self, answer: _Answer, call: InferCall, config: ModelConfig, stream: ResponseStream) -> int:
        """/generate: the model's one response, or 500 when it sent none or several."""
        responses = [response async for response in stream]
        failures = [r for r in responses if not r.streamed]
        sent = [r for r in responses if r.streamed]
        if len(sent) != 1:
            raise failures[0].error if failures and failures[0].error else ResponseCountWrong(len(sent))
        if sent[0].error is not None:
            raise sent[0].error
        await answer.whole(200, JSON_HEADERS, response_json(call, config, sent[0]))
        return 200

    async def _stream(self, answer: _Answer, call: InferCall, config: ModelConfig, stream: ResponseStream) -> int:
        """/generate_stream: an event per response as it comes; the status is the first response's."""
        status = 200
        async for response in stream:
            if not answer.started:
                if not response.streamed and response.error is not None:  # (nothing sent: a plain error)
                    raise response.error
                status = 200 if response.error is None else self.plane.failed(call, response.error)
                await answer.start(status, EVENT_STREAM_HEADERS)
            elif response.error is not None and not response.streamed:
                self.plane.failed(call, response.error)
            await answer.event(response_json(call, config, response))
        if not answer.started:  # (the model ended without a response: an empty stream, as Triton's)
            await answer.start(status, EVENT_STREAM_HEADERS)
        await answer.end()
        return status


class _Answer:
    """The HTTP answer of one generate request: a whole body, or a stream of events."""

    def __init__(self, send: Any, request_id: str) -> None:
        self.send = send
        self.request_id = request_id
        self.started = False
        self.nbytes = 0

    async def start(self, status: int, headers: list[tuple[bytes, bytes]]) -> None:
        self.started = True
        headers = [*headers, (REQUEST_ID_HEADER, self.request_id.encode())]
        await self.send({"type": "http.response.start", "status": status, "headers": headers})

    async def event(self, data: bytes) -> None:
        chunk = b"data: " + data + b"\n\n"
        self.nbytes += len(chunk)
        await self.send({"type": "http.response.body", "body": chunk, "more_body": True})

    async def end(self) -> None:
        await self.send({"type": "http.response.body", "body": b""})

    async def whole(self, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
        headers = [*headers, (b"content-length", str(len(body)).encode())]
        await self.start(status, headers)
        self.nbytes = len(body)
        await self.send({"type": "http.response.body", "body": body})

    async def error(self, exc: GatewayError, status: int) -> None:
        if self.started:  # (a stream under way: its error is its last event)
            await self.event(orjson.dumps({"error": str(exc)}))
            await self.end()
            return
        headers = JSON_HEADERS + [(k.encode(), v.encode()) for k, v in exc.headers.items()]
        await self.whole(status, headers, error_body(str(exc), self.request_id))


# -- the request ------------------------------------------------------------------------------------------
def infer_doc_of(config: ModelConfig, body: bytes) -> dict[str, Any]:
    """The KServe request document of a generate body (BadRequest with Triton's reasons)."""
    try:
        doc = json.loads(body or b"{}", object_pairs_hook=Members)
    except ValueError as exc:
        raise BadRequest(say("json", f"request body is not valid JSON: {exc}", error=exc)) from None
    if not isinstance(doc, Members):
        raise BadRequest("a generate request's body must be a JSON object")
    inputs: dict[str, dict[str, Any]] = {}
    parameters: dict[str, Any] = {}
    request: dict[str, Any] = {"parameters": parameters}
    for key, value in doc.pairs:
        if key == "id":
            if not isinstance(value, str):
                raise BadRequest(say("json_field", "'id' must be a string", field="id"))
            if value:
                request["id"] = value
        elif key == "parameters":
            if key in config.inputs_by_name:
                raise BadRequest("Keyword 'parameters' for nested schema also given as input tensor name")
            if not isinstance(value, Members):
                raise BadRequest(say("generate_nested", key=key))
            try:
                for name, item in value.pairs:
                    _take(config, name, item, inputs, parameters)
            except BadRequest as exc:
                raise BadRequest(f"Converting keyword: '{key}': {exc}") from None
        else:
            _take(config, key, value, inputs, parameters)
    request["inputs"] = list(inputs.values())
    return request


def _take(config: ModelConfig, name: str, value: Any, inputs: dict, parameters: dict) -> None:
    """One member: the input tensor of that name, or else a request parameter."""
    tensor = config.inputs_by_name.get(name)
    if tensor is None:
        if isinstance(value, (Members, list)) or value is None:
            raise BadRequest(say("generate_parameter_type", name=name))
        parameters[name] = value
        return
    if name in inputs:
        raise BadRequest(say("input_twice", input=name))
    data = _flat(value)
    _check_types(tensor, data)
    inputs[name] = {"name": name, "datatype": tensor.datatype, "shape": _shape(config, tensor, len(data)), "data": data}


def _flat(value: Any) -> list:
    if not isinstance(value, list):
        return [value]
    flat: list = []
    for item in value:
        flat.extend(_flat(item) if isinstance(item, list) else [item])
    return flat


def _json_kind(datatype: str) -> tuple[tuple[type, ...], str]:
    """The JSON values an input of `datatype` reads, and TritonJson's name for them."""
    if datatype == "BYTES":
        return (str,), "string"
    if datatype == "BOOL":
        return (bool,), "boolean"
    if datatype.startswith("INT"):
        return (int,), "signed-integer"
    if datatype.startswith("UINT"):
        return (int,), "unsigned-integer"
    return (int, float), "number"


def _check_types(tensor: TensorConfig, data: list) -> None:
    """Each value of the JSON kind the input's datatype reads (TritonJson's words for one that is not)."""
    types, kind = _json_kind(tensor.datatype)
    for item in data:
        if not isinstance(item, types) or (isinstance(item, bool) and tensor.datatype != "BOOL"):
            raise BadRequest(say("generate_json_type", f"input {tensor.name!r} is {tensor.datatype}", kind=kind))


def _shape(config: ModelConfig, tensor: TensorConfig, count: int) -> list[int]:
    """Triton's two passes: the fixed dims divide the element count; the innermost variable dim takes what is
    left, any other variable dim (the batch dim among them) is 1."""
    shape = ([-1] if config.max_batch_size > 0 else []) + list(tensor.dims)
    left = count
    for dim in reversed(shape):
        if dim != -1:
            if dim == 0 or left % dim:
                if dim == 0 and left == 0:
                    continue
                raise BadRequest(say("generate_shape", input=tensor.name))
            left //= dim
    for k in range(len(shape) - 1, -1, -1):
        if shape[k] == -1:
            shape[k], left = left, 1
    if left != 1 and count != 0:
        raise BadRequest(say("generate_shape", input=tensor.name))
    return shape


# -- the answer -------------------------------------------------------------------------------------------
def response_json(call: InferCall, config: ModelConfig, response: Response) -> bytes:
    """One response as the generate extension answers it (an error: {"error": ...})."""
    if response.error is not None:  # (a model's error in its own words, as Triton's event carries it)
        return orjson.dumps({"error": getattr(response.error, "detail", None) or str(response.error)})
    request = call.request
    doc: dict[str, Any] = {"model_name": config.name, "model_version": str(config.version)}
    if request is not None and request.kserve_id:
        doc["id"] = request.kserve_id
    for name, value in (response.parameters or {}).items():
        doc.setdefault(name, value)
    for name, array in (response.outputs or {}).items():
        doc.setdefault(name, _json_value(array))
    return orjson.dumps({key: doc[key] for key in sorted(doc)}, option=orjson.OPT_SERIALIZE_NUMPY)


def _json_value(array: np.ndarray) -> Any:
    """An output's values as a list, or the one value of a one-element output (Triton strips that array)."""
    flat = array.reshape(-1)
    if flat.dtype == object:
        values: list[Any] = [item.decode("utf-8", "replace") if isinstance(item, bytes) else item for item in flat]
    else:
        values = flat.tolist()
    return values[0] if len(values) == 1 else values
