"""HTTP surface (KServe v2). Inference takes a raw ASGI path; the rest is Starlette.

The infer path is the hot one: it skips Starlette's request/response objects and
routing (measured: they cost more than parsing the 512-float JSON body itself) and
does exactly read body -> parse -> queue -> await -> encode -> send. The headers it
needs (binary extension, encodings) are picked out in one pass over the raw list.

Here: the route table, the infer path and the body reader every endpoint reads through,
health, model metadata/config/ready, and the repository API. Two groups of endpoints live
in their own modules, each a part that Endpoints builds and routes to: the shared-memory
extensions (gateway/shm_routes.py) and the server-wide merged numbers, /metrics,
/admin/status and statistics (gateway/server_routes.py).
"""
from __future__ import annotations

import asyncio
import functools
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import orjson
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ringserve.common import tracing
from ringserve.common.repository.config import ModelConfig
from ringserve.common.version import VERSION

from .access import REQUEST_ID_HEADER, AccessLog, request_id_of
from .binary import COMPRESS_MIN_BYTES, encode_content, header_length_of, inflate, pick_encoding
from .dispatch import Dispatcher
from .encode import encode_response
from .errors import (BadRequest, ClientDisconnected, DecoupledNeedsStream, GatewayError, ModelNotFound,
                     PayloadTooLarge, RequestTimeout, RequestTooLarge, Unavailable, echo, error_body, status_of)
from .metrics import Metrics
from .openapi import openapi_document
from .parse import JsonBudget, parse_infer_request
from .request import InferRequest
from .peers import Peers
from .phrases import say
from .repository import Repository, check_model_name, check_version
from .responses import error_response, json_response, scope_of
from .server_routes import ServerEndpoints
from .shm_regions import RegionRegistry
from .shm_routes import SharedMemoryEndpoints
from .stats import Statistics, record_success
from .triton_metrics import TritonMetrics

JSON_HEADERS = [(b"content-type", b"application/json")]
BINARY_CONTENT_TYPE = (b"content-type", b"application/octet-stream")
FAULT_INJECTION = os.environ.get("RINGSERVE_FAULT_INJECTION") == "1"
UNKNOWN_MODEL_LABEL = "_unknown"
EXTENSIONS = ["binary_tensor_data", "model_configuration", "model_repository", "statistics", "schedule_policy",
              "system_shared_memory"]
SERVER_METADATA = {"name": "ringserve", "version": VERSION, "extensions": EXTENSIONS}
# A body longer than this, of a model with BYTES inputs, is parsed in the parse thread (Endpoints.parse_aside):
# under it there are at most 64 Ki elements (each takes 4 bytes of binary form or 3 of JSON at least), some
# 60 ms of Python steps on the loop.
PARSE_ASIDE_MIN_BYTES = 256 << 10


class Endpoints:
    """Every route handler, bound to the dispatcher and metrics of one gateway."""

    def __init__(self, configs: dict[str, ModelConfig], dispatcher: Dispatcher, metrics: Metrics,
                 max_body_bytes: int, *, model_repository: str = "", body_timeout_s: float = 30.0,
                 peers: Peers | None = None, access_log: AccessLog | None = None, max_tensor_bytes: int = 0) -> None:
        self.configs = configs
        self.max_tensor_bytes = max_tensor_bytes  # --max-tensor-bytes (0: only the slot bounds a tensor)
        self.access_log = access_log  # None: --access-log is off, and costs one test per request
        # False while --grpc-port is on and its listener not yet up (it starts once a worker serves this
        # gateway): not ready until then, so that a client told "ready" finds both protocols listening.
        self.grpc_listening = True
        self.dispatcher = dispatcher
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes
        self.body_timeout_s = body_timeout_s
        self.repository = Repository(model_repository, configs, dispatcher)
        self.parse_thread = ThreadPoolExecutor(1, thread_name_prefix="ringserve-parse")  # (started at its first use)
        self.regions = dispatcher.regions if dispatcher is not None else RegionRegistry()
        self.statistics = Statistics()
        if dispatcher is not None:  # (the OpenAPI check builds routes without one)
            dispatcher.scheduler.statistics = self.statistics
            metrics.registry.register(TritonMetrics(self.statistics, dispatcher.catalog))  # nv_inference_*
        # The parts that hold the other endpoints (gRPC calls their operations too):
        self.shared_memory = SharedMemoryEndpoints(self.regions, peers, self._json_body)
        self.server_wide = ServerEndpoints(dispatcher, metrics, self.statistics, self.repository, peers,
                                           self.server_ready)

    def lookup(self, model: str, version: str | None) -> ModelConfig:
        config = self.configs.get(model)
        if config is None:
            check_model_name(model)
            self.dispatcher.catalog.check_failed(model)  # 503 with the reason when its config is broken
            raise ModelNotFound(model, version, sorted(self.configs))
        if version is not None and version != str(config.version):
            check_version(version)
            return self.dispatcher.catalog.version(config, version)  # another served version, or 404
        return config

    def check_serving(self, config: ModelConfig) -> None:
        """503 when the model is unloaded, quarantined or has no ready worker."""
        why = self.repository.unloaded.get(config.name)
        if why is not None:
            raise Unavailable(say("no_available_versions", f"model {config.name!r} is not loaded: {why}",
                                  model=config.name), self.dispatcher.settings.retry_after_s)
        self.dispatcher.check_available(config.key)  # the key names one version: 'm' or 'm/2'

    # -- infer: raw ASGI ----------------------------------------------------------
    async def infer(self, scope: dict, receive, send, model: str, version: str | None) -> None:
        started_ns = time.perf_counter_ns()
        span = None if tracing.active is None else tracing.active.start_request(scope["headers"], model, "http")
        headers = JSON_HEADERS
        label, label_version = model, 0
        config = request = None
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
        request_id = request_id_of(request_id)  # the client's, or one made here (gateway/access.py)
        try:
            try:
                config = self.lookup(model, version)
            except GatewayError:  # unknown or invalid names share one label: they can't grow the metrics
                label = UNKNOWN_MODEL_LABEL
                raise
            label_version = config.version
            if config.name in self.repository.unloaded:
                self.check_serving(config)
            if config.decoupled:
                raise DecoupledNeedsStream(config.name, "HTTP's /infer")
            body = await self._read_body(receive, length)
            json_counted = content_encoding is not None
            if json_counted:
                body = await self._decode_body(body, content_encoding.decode("latin-1"), config, header_length)
            future = asyncio.get_running_loop().create_future()
            if config.bytes_inputs and len(body) > PARSE_ASIDE_MIN_BYTES:
                request = await self.parse_aside(functools.partial(
                    parse_infer_request, config, body, capacity_bytes=self.dispatcher.segment.data_capacity,
                    future=future, allow_faults=FAULT_INJECTION, header_length=header_length, regions=self.regions,
                    json_counted=json_counted, max_tensor_bytes=self.max_tensor_bytes))
            else:
                request = parse_infer_request(config, body, capacity_bytes=self.dispatcher.segment.data_capacity,
                                              future=future, allow_faults=FAULT_INJECTION, header_length=header_length,
                                              regions=self.regions, json_counted=json_counted,
                                              max_tensor_bytes=self.max_tensor_bytes)
            request.disconnected = disconnect_probe(receive)
            request.x_request_id = request_id
            request.arrived_ns = started_ns
            request.span = span
            self.dispatcher.submit(request)
            payload, json_length = encode_response(request, await future)
            if json_length is not None:
                headers = [BINARY_CONTENT_TYPE, (b"inference-header-content-length", str(json_length).encode())]
            if accept_encoding is not None and len(payload) >= COMPRESS_MIN_BYTES:
                encoding = pick_encoding(accept_encoding.decode("latin-1"))
                if encoding is not None:
                    payload = encode_content(payload, encoding)
                    headers = headers + [(b"content-encoding", encoding.encode()), (b"vary", b"accept-encoding")]
            status = 200
        except GatewayError as exc:
            status, payload = status_of(exc), error_body(str(exc), request_id)
            headers = JSON_HEADERS + [(k.encode(), v.encode()) for k, v in exc.headers.items()]
            if config is not None:  # (a success is counted once its answer is written, below)
                self.statistics.record_failure(config.name, config.version, time.perf_counter_ns() - started_ns,
                                               exc)
        self.metrics.count_request(label, label_version, status)
        await send({"type": "http.response.start", "status": status,
                    "headers": headers + [(REQUEST_ID_HEADER, request_id.encode()),
                                          (b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})
        if status == 200 and request.stages is not None:  # (Triton's statistics: gateway/stats.py)
            record_success(request, time.perf_counter_ns())
        if self.access_log is not None:
            batch_size = None if request is None else request.batch_size or None  # 0: it ran in no batch
            self.access_log.write("POST", scope["path"], status, len(payload), started_ns, request_id, model,
                                  batch_size)
        if span is not None:
            tracing.finish_request(span, status)

    async def _decode_body(self, body: bytes, encoding: str, config: ModelConfig, header_length: bytes | None) -> bytes:
        """An infer body's Content-Encoding undone a chunk at a time, under every limit it has: the
        request's (--max-request-bytes), the slot's for the binary part (each of its bytes goes into
        the slot), and the JSON's values (parse.JsonBudget), so that a bomb stops a few MiB in; the
        loop serves others between chunks."""
        capacity = self.dispatcher.segment.data_capacity
        json_bytes = None if header_length is None else header_length_of(header_length)
        budget = JsonBudget(config, capacity, json_bytes)
        binary_limit = None if json_bytes is None else json_bytes + capacity
        what = f"the {encoding.strip().lower()}-decoded request body"
        chunks: list[bytes] = []
        size = 0
        for chunk in inflate(body, encoding):
            size += len(chunk)
            if size > self.max_body_bytes:
                raise RequestTooLarge(size, self.max_body_bytes, what=what)
            if binary_limit is not None and size > binary_limit:
                raise PayloadTooLarge(size - json_bytes, capacity, f"the binary part of {what}", at_least=True)
            budget.count(chunk)
            chunks.append(chunk)
            if len(chunks) > 1:
                await asyncio.sleep(0)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    async def parse_aside(self, parse: Callable[[], InferRequest]) -> InferRequest:
        """parse() in the gateway's parse thread. A request with many BYTES elements costs a Python step
        each (lengths, objects, UTF-8); there the interpreter hands the loop the GIL within the switch
        interval (1 ms in the gateway: gateway/__main__.py), so health checks and other requests go on
        meanwhile. One thread: the loop shares the GIL with it alone."""
        return await asyncio.get_running_loop().run_in_executor(self.parse_thread, parse)

    async def _read_body(self, receive, length: bytes | None) -> bytes:
        """The whole body; 413 before reading a byte when Content-Length is over the limit; 408 when it stalls.

        Every endpoint that reads a body reads it here. The usual body came with the head and
        costs no timer; one still to come is awaited under --body-timeout-s from its first byte.
        """
        announced = None
        if length is not None:
            announced = int(length)  # the HTTP parser has already refused a malformed one
            if announced > self.max_body_bytes:
                raise RequestTooLarge(announced, self.max_body_bytes)
        if body_pending(receive):  # not a byte of it yet: the first receive() could wait forever
            return await self._read_rest(receive, [], announced)
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientDisconnected()
        body = message.get("body", b"")
        if not message.get("more_body", False) and len(body) <= self.max_body_bytes:
            return body  # the usual case: the whole body in one message
        return await self._read_rest(receive, [body], announced)

    async def _read_rest(self, receive, chunks: list[bytes], announced: int | None) -> bytes:
        """The rest of a body that came in several messages; 408 when it pauses for body_timeout_s."""
        loop = asyncio.get_running_loop()
        size = sum(map(len, chunks))
        try:
            async with asyncio.timeout(self.body_timeout_s) as pause:  # one timer, moved on at each chunk
                while True:
                    if size > self.max_body_bytes:
                        raise RequestTooLarge(size, self.max_body_bytes)
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
        if size > self.max_body_bytes:
            raise RequestTooLarge(size, self.max_body_bytes)
        return b"".join(chunks)

    async def _json_body(self, request: Request) -> dict:
        """Optional JSON object body of the repository endpoints (empty body = {}), under the infer path's limits."""
        length = next((value for name, value in request.scope["headers"] if name == b"content-length"), None)
        body = await self._read_body(request.receive, length)
        if not body.strip():
            return {}
        try:
            doc = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise BadRequest(say("json", f"request body is not valid JSON: {exc}", error=exc)) from None
        if not isinstance(doc, dict):
            raise BadRequest("request body must be a JSON object")
        return doc

    # -- everything else: Starlette ------------------------------------------------
    async def live(self, request: Request) -> Response:
        return json_response({"live": True})

    def server_ready(self) -> bool:
        """/v2/health/ready and /admin/status's `ready`: serving no model at all is never ready;
        with --strict-readiness every model must serve."""
        d = self.dispatcher
        return not (d.draining or not self.grpc_listening or not d.ready_workers() or not self.configs or (
            d.settings.strict_readiness and d.models.unservable()))

    async def ready(self, request: Request) -> Response:
        if not self.server_ready():
            return json_response({"ready": False}, 503, {"retry-after": "1"})
        return json_response({"ready": True})

    async def server_metadata(self, request: Request) -> Response:
        return json_response(SERVER_METADATA)

    def _config_of(self, request: Request) -> ModelConfig:
        return self.lookup(request.path_params["model"], request.path_params.get("version"))

    async def model_metadata(self, request: Request) -> Response:
        try:
            config = self._config_of(request)
        except GatewayError as exc:
            return error_response(exc)
        return json_response(self.metadata_doc(config))

    def metadata_doc(self, config: ModelConfig) -> dict:
        """A model's metadata (HTTP and gRPC)."""
        batch = [-1] if config.max_batch_size > 0 else []
        describe = lambda ts: [{"name": t.name, "datatype": t.datatype, "shape": batch + list(t.dims)} for t in ts]
        versions = [str(c.version) for c in self.dispatcher.catalog.served_versions(config.name)]
        platform = config.platform or str(config.extra.get("backend", ""))  # Triton's: "python" for a model.py
        return {"name": config.name, "versions": versions or [str(config.version)], "platform": platform,
                "inputs": describe(config.inputs), "outputs": describe(config.outputs)}

    async def model_ready(self, request: Request) -> Response:
        try:
            config = self._config_of(request)
            self.check_serving(config)
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
        """Triton's statistics for the whole server (every gateway's summed, gateway/merge.py), or with
        ?scope=gateway this gateway's own. With several gateways, `gateways` says which answered."""
        try:
            scope = scope_of(request, self.server_wide.peers)
            configs = self.statistics_configs(request.path_params.get("model"), request.path_params.get("version"))
        except GatewayError as exc:
            return error_response(exc)
        return json_response(await self.server_wide.statistics_doc(configs, request.url.path, scope))

    def statistics_configs(self, model: str | None, version: str | None) -> list[ModelConfig]:
        """The model versions a statistics request names (HTTP and gRPC): as Triton, every served version
        of the model when no version is named, of every model when no model is."""
        if model is not None and version is not None:
            return [self.lookup(model, version)]
        served = self.dispatcher.catalog.served_versions
        if model is not None:
            return served(self.lookup(model, None).name)
        return [config for name in sorted(self.configs) for config in served(name)]

    async def repository_index(self, request: Request) -> Response:
        try:
            doc = await self._json_body(request)
            ready = doc.get("ready", False)
            if type(ready) is not bool:
                raise BadRequest(say("ready_flag", f"'ready' must be true or false, got {echo(ready)}"))
        except GatewayError as exc:
            return error_response(exc)
        return json_response(self.repository.index(ready))

    async def repository_load(self, request: Request) -> Response:
        try:
            params = _parameters(await self._json_body(request))
            await self.repository.load(request.path_params["model"], params)
        except GatewayError as exc:
            return error_response(exc)
        return json_response({})

    async def repository_unload(self, request: Request) -> Response:
        try:
            _parameters(await self._json_body(request))
            self.repository.unload(request.path_params["model"])
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


def body_pending(receive) -> bool:
    """True when uvicorn's cycle has had none of the request's body yet (so receive() would wait for it)."""
    cycle = getattr(receive, "__self__", None)
    return getattr(cycle, "more_body", False) and not cycle.body


def match_infer_path(path: str) -> tuple[str, str | None] | None:
    """'/v2/models/m/infer' -> ('m', None); '/v2/models/m/versions/2/infer' -> ('m', '2')."""
    if not (path.startswith("/v2/models/") and path.endswith("/infer")):
        return None
    parts = path[len("/v2/models/"):-len("/infer")].split("/")
    if len(parts) == 1 and parts[0]:
        return parts[0], None
    if len(parts) == 3 and parts[1] == "versions" and parts[0] and parts[2]:
        return parts[0], parts[2]
    return None
