"""Triton's shared-memory extensions over HTTP: the routes, over gateway/kserve/shared_memory.py's
operations (which gRPC's SystemSharedMemory* RPCs call too).

CUDA shared memory: answered as Triton built without GPUs answers; nothing can be registered.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response

from ringserve.gateway.core.errors import GatewayError, echo, error_body
from ringserve.gateway.core.region_errors import (
    NO_CUDA_SHM,
    ClientShmDisabled,
    CudaSharedMemoryUnsupported,
    RegionNotFound,
)
from ringserve.gateway.http.responses import error_response, json_response, scope_of
from ringserve.gateway.kserve.shared_memory import SharedMemory
from ringserve.gateway.observe.access import current_request_id

log = logging.getLogger(__name__)


class SharedMemoryEndpoints:
    """The shared-memory routes of one gateway, over its RegionRegistry (the one the infer path
    reads a request's regions from) and the other gateways, which must hold the same regions."""

    def __init__(self, shared_memory: SharedMemory, json_body: Callable[[Request], Awaitable[dict]]) -> None:
        self.shared_memory = shared_memory
        self.regions = shared_memory.regions
        self.peers = shared_memory.peers
        self._json_body = json_body  # a register's JSON, read as the infer path reads a body (its limits)

    async def shm_status(self, request: Request) -> Response:
        try:
            scope = scope_of(request, self.peers)
            return json_response(await self.shared_memory.region_status(request.path_params.get("name"), scope))
        except RegionNotFound as exc:
            return _error_with_status(str(exc), 404)  # (Triton's NOT_FOUND)
        except GatewayError as exc:
            return error_response(exc)

    async def shm_register(self, request: Request) -> Response:
        try:
            scope = scope_of(request, self.peers)
            await self.shared_memory.register_region(request.path_params["name"], await self._json_body(request), scope)
        except GatewayError as exc:
            return error_response(exc)
        return json_response({})

    async def shm_unregister(self, request: Request) -> Response:
        try:
            await self.shared_memory.unregister_region(request.path_params.get("name"), scope_of(request, self.peers))
        except GatewayError as exc:
            return error_response(exc)
        return json_response({})

    async def cuda_shm_status(self, request: Request) -> Response:
        name = request.path_params.get("name")
        if name is None:
            return json_response([])  # (Triton built without GPUs answers the same)
        return _error_with_status(f"Unable to find cuda shared memory region: {echo(name)}; {NO_CUDA_SHM}", 404)

    async def cuda_shm_register(self, request: Request) -> Response:
        if not self.regions.allowed:  # (Triton answers this before it looks at GPUs)
            return error_response(ClientShmDisabled())
        name = request.path_params["name"]
        return error_response(CudaSharedMemoryUnsupported(name))

    async def cuda_shm_unregister(self, request: Request) -> Response:
        if not self.regions.allowed:
            return error_response(ClientShmDisabled())
        return json_response({})  # nothing can be registered, so nothing is left to unregister


def _error_with_status(message: str, status: int) -> Response:
    """An error answer whose status is not the error table's (Triton's 404 for a region's status)."""
    return Response(error_body(message, current_request_id.get()), status, media_type="application/json")
