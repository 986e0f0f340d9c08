"""The gateway's ASGI application: the raw infer path in front of Starlette."""
from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass

from starlette.applications import Starlette
from starlette.responses import Response

from common.config import ModelConfig
from shm.segment import Segment

from .dispatch import DispatchSettings, Dispatcher
from .errors import error_body
from .metrics import Metrics
from .routes import Endpoints, match_infer_path


@dataclass(frozen=True)
class GatewaySettings:
    runtime_dir: str
    segment_name: str
    dispatch: DispatchSettings = DispatchSettings()
    max_body_bytes: int = 256 * 1024 * 1024


class GatewayApp:
    """ASGI entry point. POST .../infer goes straight to Endpoints.infer."""

    def __init__(self, configs: dict[str, ModelConfig], settings: GatewaySettings) -> None:
        self.segment = Segment.attach(settings.segment_name)
        self.metrics = Metrics()
        self.dispatcher = Dispatcher(segment=self.segment, configs=configs, runtime_dir=settings.runtime_dir,
                                     metrics=self.metrics, settings=settings.dispatch)
        self.metrics.attach(self.dispatcher)
        self.endpoints = Endpoints(configs, self.dispatcher, self.metrics, settings.max_body_bytes)
        self.starlette = Starlette(routes=self.endpoints.routes(), lifespan=self._lifespan,
                                   exception_handlers={404: _not_found, 405: _method_not_allowed})

    @contextlib.asynccontextmanager
    async def _lifespan(self, app: Starlette):
        self.dispatcher.start(asyncio.get_running_loop())
        try:
            yield
        finally:
            self.dispatcher.draining = True
            self.dispatcher.close()
            self.segment.close()

    async def __call__(self, scope: dict, receive, send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST":
            target = match_infer_path(scope["path"])
            if target is not None:
                await self.endpoints.infer(scope, receive, send, *target)
                return
        await self.starlette(scope, receive, send)


async def _not_found(request, exc) -> Response:
    return Response(error_body(f"no route {request.method} {request.url.path}; see the KServe v2 API under /v2"),
                    404, media_type="application/json")


async def _method_not_allowed(request, exc) -> Response:
    return Response(error_body(f"{request.method} is not allowed on {request.url.path}"), 405,
                    media_type="application/json")
