"""HTTP surface (KServe v2). Inference takes a raw ASGI path; the rest is Starlette.

The infer path is the hot one: it skips Starlette's request/response objects and
routing (measured: they cost more than parsing the 512-float JSON body itself) and
does exactly read body -> parse -> queue -> await -> encode -> send.
"""
from __future__ import annotations

import asyncio
import os
from typing import Any

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from common.config import ModelConfig

from .codec import encode_infer_response, parse_infer_request
from .dispatch import Dispatcher
from .errors import BadRequest, GatewayError, ModelNotFound, PayloadTooLarge, error_body, status_of
from .metrics import Metrics

JSON_HEADERS = [(b"content-type", b"application/json")]
FAULT_INJECTION = os.environ.get("RINGSERVE_FAULT_INJECTION") == "1"
UNKNOWN_MODEL_LABEL = "_unknown"  # 404s share one label so random names can't grow the metrics


def json_response(doc: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(doc), status, headers=headers, media_type="application/json")


def error_response(exc: GatewayError) -> Response:
    return Response(error_body(str(exc)), status_of(exc), headers=exc.headers, media_type="application/json")


class Endpoints:
    """Every route handler, bound to the dispatcher and metrics of one gateway."""

    def __init__(self, configs: dict[str, ModelConfig], dispatcher: Dispatcher, metrics: Metrics,
                 max_body_bytes: int) -> None:
        self.configs = configs
        self.dispatcher = dispatcher
        self.metrics = metrics
        self.max_body_bytes = max_body_bytes

    def lookup(self, model: str, version: str | None) -> ModelConfig:
        config = self.configs.get(model)
        if config is None or (version is not None and version != str(config.version)):
            raise ModelNotFound(model, version, sorted(self.configs))
        return config

    # -- infer: raw ASGI ----------------------------------------------------------
    async def infer(self, scope: dict, receive, send, model: str, version: str | None) -> None:
        headers = JSON_HEADERS
        label = model
        try:
            try:
                config = self.lookup(model, version)
            except ModelNotFound:
                label = UNKNOWN_MODEL_LABEL
                raise
            body = await self._read_body(receive)
            future = asyncio.get_running_loop().create_future()
            request = parse_infer_request(config, body, capacity_bytes=self.dispatcher.segment.data_capacity,
                                          future=future, allow_faults=FAULT_INJECTION)
            request.disconnected = disconnect_probe(receive)
            self.dispatcher.submit(request)
            payload = encode_infer_response(request, await future)
            status = 200
        except GatewayError as exc:
            status, payload = status_of(exc), error_body(str(exc))
            headers = JSON_HEADERS + [(k.encode(), v.encode()) for k, v in exc.headers.items()]
        self.metrics.count_request(label, status)
        await send({"type": "http.response.start", "status": status,
                    "headers": headers + [(b"content-length", str(len(payload)).encode())]})
        await send({"type": "http.response.body", "body": payload})

    async def _read_body(self, receive) -> bytes:
        chunks = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise BadRequest("client disconnected before sending the whole body")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                raise PayloadTooLarge(size, self.max_body_bytes)
            chunks.append(chunk)
            if not message.get("more_body", False):
                return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    # -- everything else: Starlette ------------------------------------------------
    async def live(self, request: Request) -> Response:
        return json_response({"live": True})

    async def ready(self, request: Request) -> Response:
        if self.dispatcher.draining or not self.dispatcher.ready_workers():
            return json_response({"ready": False}, 503, {"retry-after": "1"})
        return json_response({"ready": True})

    async def server_metadata(self, request: Request) -> Response:
        return json_response({"name": "ringserve", "version": "0.1.0", "extensions": []})

    async def model_metadata(self, request: Request) -> Response:
        try:
            config = self.lookup(request.path_params["model"], request.path_params.get("version"))
        except GatewayError as exc:
            return error_response(exc)
        batch = [-1] if config.max_batch_size > 0 else []
        describe = lambda ts: [{"name": t.name, "datatype": t.datatype, "shape": batch + list(t.dims)} for t in ts]
        return json_response({"name": config.name, "versions": [str(config.version)],
                              "platform": config.platform, "inputs": describe(config.inputs),
                              "outputs": describe(config.outputs)})

    async def model_ready(self, request: Request) -> Response:
        try:
            config = self.lookup(request.path_params["model"], request.path_params.get("version"))
            self.dispatcher.check_available(config.name)
        except GatewayError as exc:
            return error_response(exc)
        return json_response({"name": config.name, "ready": True})

    async def metrics_text(self, request: Request) -> Response:
        return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    async def admin_status(self, request: Request) -> Response:
        d = self.dispatcher
        workers = [{"index": w.index, "pid": w.pid, "generation": w.generation, "state": w.state,
                    "restarts": w.restarts, "restarts_total": sum(w.restarts.values()),
                    "last_exit": w.last_exit, "in_flight_batches": len(w.in_flight),
                    "batches_done": w.batches_done, "models": w.models, "failed_models": w.failed_models}
                   for w in sorted(d.workers.values(), key=lambda w: w.index)]
        models = {name: {"queue_depth": q.depth, "requeued_batches": len(q.requeued),
                         "ready": bool(d.ready_workers(name)) and name not in d.quarantined,
                         "quarantined": d.quarantined.get(name)} for name, q in d.queues.items()}
        return json_response({"ready": bool(d.ready_workers()) and not d.draining, "draining": d.draining,
                              "workers": workers, "models": models,
                              "slots": {"total": d.ring.slot_count, "free": d.ring.free_count}})

    def routes(self) -> list[Route]:
        return [
            Route("/v2/health/live", self.live),
            Route("/v2/health/ready", self.ready),
            Route("/v2", self.server_metadata),
            Route("/v2/models/{model}", self.model_metadata),
            Route("/v2/models/{model}/versions/{version}", self.model_metadata),
            Route("/v2/models/{model}/ready", self.model_ready),
            Route("/v2/models/{model}/versions/{version}/ready", self.model_ready),
            Route("/metrics", self.metrics_text),
            Route("/admin/status", self.admin_status),
        ]


def disconnect_probe(receive):
    """A cheap `() -> bool` for "has this client gone away?", or None when the server can't tell.

    uvicorn's per-request cycle (h11 and httptools) sets `disconnected` when the connection
    drops; reading that flag costs nothing, where a watcher task per request would not.
    """
    cycle = getattr(receive, "__self__", None)
    if cycle is None or not hasattr(cycle, "disconnected"):
        return None
    return lambda: cycle.disconnected


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
