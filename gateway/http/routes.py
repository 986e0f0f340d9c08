"""HTTP surface (KServe v2). Inference takes a raw ASGI path; the rest is Starlette.

The infer path is the hot one: it skips Starlette's request/response objects and
routing (measured: they cost more than parsing the 512-float JSON body itself) and
does exactly read body -> the data plane's parse, queue, await (gateway/kserve/dataplane.py) ->
encode -> send. The headers it needs (binary extension, encodings) are picked out in one pass over
the raw list.

Here: the route table, the infer path and the body reader every endpoint reads through,
health, model metadata/config/ready, and the repository API. Two groups of endpoints live
in their own modules, each a part that Endpoints builds and routes to: the shared-memory
extensions (gateway/http/shm_routes.py) and the server-wide merged numbers, /metrics,
/admin/status and statistics (gateway/http/server_routes.py).
"""

from __future__ import annotations

import asyncio
import functools
import re
from collections.abc import Callable
from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ringserve.common.repository.config import ModelConfig
from ringserve.gateway.codec.binary import COMPRESS_MIN_BYTES, encode_content, header_length_of, inflate, pick_encoding
from ringserve.gateway.codec.encode import encode_response
from ringserve.gateway.codec.json_body import JsonBudget
from ringserve.gateway.codec.parse import parse_infer_request
from ringserve.gateway.core.errors import (
    BadRequest,
    ClientDisconnected,
    GatewayError,
    PayloadTooLarge,
    RequestTimeout,
    RequestTooLarge,
    echo,
    error_body,
)
from ringserve.gateway.core.phrases import say
from ringserve.gateway.core.region_registry import RegionRegistry
from ringserve.gateway.dispatch.dispatcher import Dispatcher
from ringserve.gateway.http.limits import ARRIVED_NS
from ringserve.gateway.http.openapi import openapi_document
from ringserve.gateway.http.responses import error_response, json_response, scope_of
from ringserve.gateway.http.server_routes import ServerEndpoints
from ringserve.gateway.http.settings_routes import SettingsEndpoints
from ringserve.gateway.http.shm_routes import SharedMemoryEndpoints
from ringserve.gateway.kserve.dataplane import FAULT_INJECTION, SERVER_METADATA, DataPlane
from ringserve.gateway.kserve.infer_call import InferCall
from ringserve.gateway.kserve.shared_memory import SharedMemory
from ringserve.gateway.observe.access import REQUEST_ID_HEADER, request_id_of
from ringserve.gateway.openai.routes import OpenAIEndpoints
from ringserve.gateway.openai.stream import ClientWatch

JSON_HEADERS = [(b"content-type", b"application/json")]
NESTED_READY = re.compile(rb'\s*\{\s*"ready"\s*:\s*[\[{]')  # a repository index body whose 'ready' opens a nest
BINARY_CONTENT_TYPE = (b"content-type", b"application/octet-stream")


# (send, status, headers, body) -> whether the whole response went out in one write
WriteResponse = Callable[[Any, int, list[tuple[bytes, bytes]], bytes], bool]


def messages_only(send: Any, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> bool:
    """The public engine's WriteResponse: nothing written; the infer path sends ASGI's two messages."""
    return False


class Endpoints:
    """Every HTTP route handler of one gateway, over its data plane (gateway/kserve/dataplane.py)."""

    def __init__(
        self,
        plane: DataPlane | None,
        max_request_bytes: int,
        *,
        body_timeout_s: float = 30.0,
        write_response: WriteResponse | None = None,
        dispatcher: Dispatcher | None = None,
    ) -> None:
        self.plane = plane  # None: only routes() is called (the OpenAPI check and the body reader's tests)
        # The HTTP engine's one-write answer (gateway/http/engine.py); None: the ASGI messages, always.
        self.write_response = write_response or messages_only
        self.max_request_bytes = max_request_bytes
        self.body_timeout_s = body_timeout_s
        # The parts that hold the other endpoints:
        shared_memory = plane.shared_memory if plane is not None else SharedMemory(RegionRegistry(), None)
        self.shared_memory = SharedMemoryEndpoints(shared_memory, self._json_body)
        self.server_wide = ServerEndpoints(plane, dispatcher)  # (/admin/status reads the dispatcher's state)
        self.openai = OpenAIEndpoints(plane, self._read_body, ClientWatch(disconnect_probe, on_disconnect))  # /v1
        self.runtime_settings = SettingsEndpoints(plane, self._json_body)  # Triton's logging and trace extensions

    # -- infer: raw ASGI ----------------------------------------------------------
    async def infer(self, scope: dict, receive, send, model: str, version: str | None) -> None:
        plane = self.plane
        length = header_length = content_encoding = accept_encoding = request_id = None
        for name, value in scope["headers"]:
            if name == b"content-length":
                length = value
            elif name == b"inference-header-content-length":
                header_length = value
            elif name == b"content-encoding":
                content_encoding = value
            elif name == b"accept-encoding":
                accept_encoding = value
            elif name == REQUEST_ID_HEADER:
                request_id = value
        # The client's request id, or one made here (gateway/observe/access.py)
        with plane.call(
            model, request_id_of(request_id), scope["headers"], "http", "POST", scope["path"], scope.get(ARRIVED_NS)
        ) as call:
            try:
                config = call.target(version, "HTTP's /infer")
                body = await self._read_body(receive, length)
                encodings = (header_length, accept_encoding, content_encoding)
                raw = None  # the raw-request index of a response-cached model (gateway/cache/raw.py)
                if plane.cache is not None:
                    raw = plane.cache.raw_lookup(config, scope["path"], body, encodings, call.span)
                if raw is not None and raw.payload is not None:
                    headers, payload, call.cache = raw.headers, raw.payload, plane.cache.raw_hit(raw)
                else:
                    headers, payload = await self._answer(call, config, receive, body, encodings)
                    if raw is not None:
                        plane.cache.raw_store(raw, call.cache, headers, payload)
                status = 200
            except GatewayError as exc:
                status, payload = call.failed(exc), error_body(str(exc), call.request_id)
                headers = JSON_HEADERS + [(k.encode(), v.encode()) for k, v in exc.headers.items()]
            headers = headers + [(REQUEST_ID_HEADER, call.request_id.encode())]
            if not self.write_response(send, status, headers, payload):
                headers.append((b"content-length", str(len(payload)).encode()))
                await send({"type": "http.response.start", "status": status, "headers": headers})
                await send({"type": "http.response.body", "body": payload})
            call.answered(len(payload), status)

    async def _answer(
        self, call: InferCall, config: ModelConfig, receive, body: bytes, encodings: tuple[bytes | None, ...]
    ) -> tuple[list[tuple[bytes, bytes]], bytes]:
        """An infer request the whole way: decoded, parsed, run, encoded; its headers (but X-Request-ID) and body.
        `encodings`: its Inference-Header-Content-Length, Accept-Encoding and Content-Encoding."""
        plane, headers = self.plane, JSON_HEADERS
        header_length, accept_encoding, content_encoding = encodings
        json_counted = content_encoding is not None
        if json_counted:
            body = await self._decode_body(body, content_encoding.decode("latin-1"), config, header_length)
        parse = functools.partial(
            parse_infer_request,
            config,
            body,
            capacity_bytes=plane.capacity_bytes,
            allow_faults=FAULT_INJECTION,
            header_length=header_length,
            regions=plane.regions,
            json_counted=json_counted,
            max_tensor_bytes=plane.max_tensor_bytes,
        )
        if config.kind == "python":  # a model that may poll request.is_cancelled() while it runs
            on_disconnect(receive, functools.partial(plane.cancel, call))
        outputs = await call.run(parse, len(body), disconnect_probe(receive))
        payload, json_length = encode_response(call.request, outputs)
        if json_length is not None:
            headers = [BINARY_CONTENT_TYPE, (b"inference-header-content-length", str(json_length).encode())]
        if accept_encoding is not None and len(payload) >= COMPRESS_MIN_BYTES:
            encoding = pick_encoding(accept_encoding.decode("latin-1"))
            if encoding is not None:
                payload = encode_content(payload, encoding)
                headers = headers + [(b"content-encoding", encoding.encode()), (b"vary", b"accept-encoding")]
        return headers, payload

    async def _decode_body(self, body: bytes, encoding: str, config: ModelConfig, header_length: bytes | None) -> bytes:
        """An infer body's Content-Encoding undone a chunk at a time, under every limit it has: the
        request's (--max-request-bytes), the slot's for the binary part (each of its bytes goes into
        the slot), and the JSON's values (parse.JsonBudget), so that a bomb stops a few MiB in; the
        loop serves others between chunks."""
        capacity = self.plane.capacity_bytes
        json_bytes = None if header_length is None else header_length_of(header_length)
        budget = JsonBudget(config, capacity, json_bytes)
        binary_limit = None if json_bytes is None else json_bytes + capacity
        what = f"the {encoding.strip().lower()}-decoded request body"
        chunks: list[bytes] = []
        size = 0
        for chunk in inflate(body, encoding):
            size += len(chunk)
            if size > self.max_request_bytes:
                raise RequestTooLarge(size, self.max_request_bytes, what=what)
            if binary_limit is not None and size > binary_limit:
                raise PayloadTooLarge(size - json_bytes, capacity, f"the binary part of {what}", at_least=True)
            budget.count(chunk)
            chunks.append(chunk)
            if len(chunks) > 1:
                await asyncio.sleep(0)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def _read_body(self, receive, length: bytes | None) -> bytes:
        """The whole body; 413 before reading a byte when Content-Length is over the limit; 408 when it stalls.

        Every endpoint that reads a body reads it here. The usual body came with the head and
        costs no timer; one still to come is awaited under --body-timeout-s from its first byte.
        """
        announced = None
        if length is not None:
            announced = int(length)  # the HTTP parser has already refused a malformed one
            if announced > self.max_request_bytes:
                raise RequestTooLarge(announced, self.max_request_bytes)
        if body_pending(receive):  # not a byte of it yet: the first receive() could wait forever
            return await self._read_rest(receive, [], announced)
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected()
        body = message.get("body", b"")
        if not message.get("more_body", False) and len(body) <= self.max_request_bytes:
            return body  # the usual case: the whole body in one message
        return await self._read_rest(receive, [body], announced)

    read_body = _read_body  # (for the route groups outside this module: gateway/http/generate.py)

    async def _read_rest(self, receive, chunks: list[bytes], announced: int | None) -> bytes:
        """The rest of a body that came in several messages; 408 when it pauses for body_timeout_s."""
        loop = asyncio.get_running_loop()
        size = sum(map(len, chunks))
        try:
            async with asyncio.timeout(self.body_timeout_s) as pause:  # one timer, moved on at each chunk
                while True:
                    if size > self.max_request_bytes:
                        raise RequestTooLarge(size, self.max_request_bytes)
                    message = await receive()
                    pause.reschedule(loop.time() + self.body_timeout_s)
                    if message["type"] == "http.disconnect":
                        raise ClientDisconnected()
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        break
        except TimeoutError:
            raise RequestTimeout(size, announced, self.body_timeout_s) from None
        if size > self.max_request_bytes:
            raise RequestTooLarge(size, self.max_request_bytes)
        return b"".join(chunks)

    async def _json_body(self, request: Request, nested_ready: bool = False) -> dict:
        """Optional JSON object body of the repository endpoints (empty body = {}), under the infer path's limits.

        `nested_ready`: a body whose 'ready' nests past orjson's depth is refused as Triton refuses it (its
        parser reads the whole body, then 'ready' is no boolean: qa/L0_http's 250000 nested arrays)."""
        length = next((value for name, value in request.scope["headers"] if name == b"content-length"), None)
        body = await self._read_body(request.receive, length)
        if not body.strip():
            return {}
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            if nested_ready and "depth" in str(exc) and NESTED_READY.match(body):
                raise BadRequest(
                    say("ready_flag", f"'ready' must be true or false; it nests past 1024 ({exc})")
                ) from None
            raise BadRequest(say("json", f"request body is not valid JSON: {exc}", error=exc)) from None
        if not isinstance(doc, dict):
            raise BadRequest("request body must be a JSON object")
        return doc

    # -- everything else: Starlette ------------------------------------------------
    async def live(self, request: Request) -> Response:
        return json_response({"live": True})

    async def ready(self, request: Request) -> Response:
        if not self.plane.server_ready():
            return json_response({"ready": False}, 503, {"retry-after": "1"})
        return json_response({"ready": True})

    async def server_metadata(self, request: Request) -> Response:
        return json_response(SERVER_METADATA)

    def _config_of(self, request: Request) -> ModelConfig:
        return self.plane.lookup(request.path_params["model"], request.path_params.get("version"))

    async def model_metadata(self, request: Request) -> Response:
        try:
            config = self._config_of(request)
        except GatewayError as exc:
            return error_response(exc)
        return json_response(self.plane.metadata_doc(config))

    async def model_ready(self, request: Request) -> Response:
        try:
            config = self._config_of(request)
            self.plane.check_serving(config)
        except GatewayError as exc:
            return error_response(exc)
        return json_response({"name": config.name, "ready": True})

    async def model_config(self, request: Request) -> Response:
        """The config in force: config.json plus what was auto-completed from the ONNX graph."""
        try:
            config = self._config_of(request)
        except GatewayError as exc:
            return error_response(exc)
        return json_response(config.to_json())

    async def model_stats(self, request: Request) -> Response:
        """Triton's statistics for the whole server (every gateway's summed, gateway/cluster/merge.py), or with
        ?scope=gateway this gateway's own. With several gateways, `gateways` says which answered."""
        try:
            scope = scope_of(request, self.plane.peers)
            configs = self.plane.statistics_configs(
                request.path_params.get("model"), request.path_params.get("version")
            )
        except GatewayError as exc:
            return error_response(exc)
        return json_response(await self.plane.statistics_doc(configs, request.url.path, scope))

    async def repository_index(self, request: Request) -> Response:
        try:
            doc = await self._json_body(request, nested_ready=True)
            ready = doc.get("ready", False)
            if type(ready) is not bool:
                raise BadRequest(say("ready_flag", f"'ready' must be true or false, got {echo(ready)}"))
        except GatewayError as exc:
            return error_response(exc)
        return json_response(self.plane.repository.index(ready))

    async def repository_load(self, request: Request) -> Response:
        try:
            params = _parameters(await self._json_body(request))
            await self.plane.repository.load(request.path_params["model"], params)
        except GatewayError as exc:
            return error_response(exc)
        return json_response({})

    async def repository_unload(self, request: Request) -> Response:
        try:
            params = _parameters(await self._json_body(request))
            await self.plane.repository.unload_request(request.path_params["model"], params)
        except GatewayError as exc:
            return error_response(exc)
        return json_response({})

    async def openapi(self, request: Request) -> Response:
        return json_response(openapi_document())

    def routes(self) -> list[Route]:
        """Starlette's routes. POST .../infer never reaches Starlette (GatewayApp takes it first);
        its routes are here so that other methods get 405 and /openapi.json can be checked against them."""
        shm, server = self.shared_memory, self.server_wide
        return [
            Route("/v2/health/live", self.live),
            Route("/v2/health/ready", self.ready),
            Route("/v2", self.server_metadata),
            Route("/v2/models/stats", self.model_stats),  # before /v2/models/{model}
            Route("/v2/models/{model}", self.model_metadata),
            Route("/v2/models/{model}/versions/{version}", self.model_metadata),
            Route("/v2/models/{model}/ready", self.model_ready),
            Route("/v2/models/{model}/versions/{version}/ready", self.model_ready),
            Route("/v2/models/{model}/config", self.model_config),
            Route("/v2/models/{model}/versions/{version}/config", self.model_config),
            Route("/v2/models/{model}/stats", self.model_stats),
            Route("/v2/models/{model}/versions/{version}/stats", self.model_stats),
            Route("/v2/models/{model}/infer", _infer_not_here, methods=["POST"]),
            Route("/v2/models/{model}/versions/{version}/infer", _infer_not_here, methods=["POST"]),
            Route("/v2/repository/index", self.repository_index, methods=["POST"]),
            Route("/v2/repository/models/{model}/load", self.repository_load, methods=["POST"]),
            Route("/v2/repository/models/{model}/unload", self.repository_unload, methods=["POST"]),
            Route("/v2/systemsharedmemory/status", shm.shm_status),
            Route("/v2/systemsharedmemory/region/{name}/status", shm.shm_status),
            Route("/v2/systemsharedmemory/region/{name}/register", shm.shm_register, methods=["POST"]),
            Route("/v2/systemsharedmemory/unregister", shm.shm_unregister, methods=["POST"]),
            Route("/v2/systemsharedmemory/region/{name}/unregister", shm.shm_unregister, methods=["POST"]),
            Route("/v2/cudasharedmemory/status", shm.cuda_shm_status),
            Route("/v2/cudasharedmemory/region/{name}/status", shm.cuda_shm_status),
            Route("/v2/cudasharedmemory/region/{name}/register", shm.cuda_shm_register, methods=["POST"]),
            Route("/v2/cudasharedmemory/unregister", shm.cuda_shm_unregister, methods=["POST"]),
            Route("/v2/cudasharedmemory/region/{name}/unregister", shm.cuda_shm_unregister, methods=["POST"]),
            Route("/metrics", server.metrics_text),
            Route("/admin/status", server.admin_status),
            Route("/openapi.json", self.openapi),
            *self.openai.routes(),
            *self.runtime_settings.routes(),
        ]


async def _infer_not_here(request: Request) -> Response:
    raise AssertionError("POST .../infer is served by GatewayApp before Starlette")  # pragma: no cover


def _parameters(doc: dict) -> dict:
    params = doc.get("parameters") or {}
    if not isinstance(params, dict):
        raise BadRequest(say("json_field", "'parameters' must be an object", field="parameters"))
    return params


def disconnect_probe(receive):
    """A cheap `() -> bool` for "has this client gone away?", or None when the server can't tell.

    uvicorn's per-request cycle (h11 and httptools) sets `disconnected` when the connection
    drops; reading that flag costs nothing, where a watcher task per request would not.
    """
    cycle = getattr(receive, "__self__", None)
    if cycle is None or not hasattr(cycle, "disconnected"):
        return None
    return lambda: cycle.disconnected


def on_disconnect(receive, callback) -> None:
    """Run `callback` when this request's connection drops before its answer is complete (uvicorn's cycle,
    told by GatewayHttpProtocol.connection_lost); nothing where the server can't tell."""
    cycle = getattr(receive, "__self__", None)
    if cycle is not None and hasattr(cycle, "disconnected"):
        cycle.on_disconnect = callback


def body_pending(receive) -> bool:
    """True when uvicorn's cycle has had none of the request's body yet (so receive() would wait for it)."""
    cycle = getattr(receive, "__self__", None)
    return getattr(cycle, "more_body", False) and not cycle.body


def match_infer_path(path: str) -> tuple[str, str | None] | None:
    """'/v2/models/m/infer' -> ('m', None); '/v2/models/m/versions/2/infer' -> ('m', '2')."""
    if not (path.startswith("/v2/models/") and path.endswith("/infer")):
        return None
    parts = path[len("/v2/models/") : -len("/infer")].split("/")
    if len(parts) == 1 and parts[0]:
        return parts[0], None
    if len(parts) == 3 and parts[1] == "versions" and parts[0] and parts[2]:
        return parts[0], parts[2]
    return None
