"""Triton's logging and trace extensions over HTTP: GET/POST /v2/logging, /v2/trace/setting and
/v2/models/{model}/trace/setting, over gateway/cluster/runtime_settings.py (which gRPC's LogSettings and
TraceSetting call too). A POST answers once the change is made here and sent to every process.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, cast

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from ringserve.common import runtime_settings
from ringserve.gateway.cluster.peers import SCOPE_GATEWAY
from ringserve.gateway.cluster.runtime_settings import (
    SettingsDesk,
    SettingsLink,
    check_log_change,
    check_log_type,
    check_trace_change,
    log_values,
    trace_values,
)
from ringserve.gateway.core.errors import BadRequest, GatewayError
from ringserve.gateway.http.responses import error_response, json_response, scope_of
from ringserve.gateway.kserve.dataplane import DataPlane

NOT_STRING = "attempt to access JSON non-string as string"  # (Triton's JSON reader: common triton_json.h)
NOT_ARRAY = "attempt to access JSON non-array as array"


class SettingsEndpoints:
    def __init__(self, plane: DataPlane | None, json_body: Callable[[Request], Awaitable[dict]]) -> None:
        self.plane = plane
        self.desk = SettingsDesk(cast(SettingsLink, plane.dispatcher), plane.peers) if plane is not None else None
        self._json_body = json_body  # an empty body is {} (Triton's EVRequestToJsonAllowsEmpty)

    def routes(self) -> list[Route]:
        methods = ["GET", "POST"]
        return [
            Route("/v2/logging", self.logging, methods=methods),
            Route("/v2/trace/setting", self.trace_setting, methods=methods),
            Route("/v2/models/{model}/trace/setting", self.trace_setting, methods=methods),
        ]

    async def logging(self, request: Request) -> Response:
        try:
            peer = self.plane is not None and scope_of(request, self.plane.peers) == SCOPE_GATEWAY
            if request.method == "POST" and self.desk is not None:
                values = await self._json_body(request)
                for name, value in values.items():
                    check_log_type(name, value)
                await self.desk.change(log=check_log_change(values))
        except GatewayError as exc:
            return error_response(exc)
        if peer:  # (another gateway waiting for this one to have a change: SettingsDesk.until_peers_have)
            return json_response({**log_values(), "revision": runtime_settings.current.revision})
        return json_response(log_values())

    async def trace_setting(self, request: Request) -> Response:
        model = request.path_params.get("model")
        try:
            if model is not None and self.desk is not None:
                self.desk.check_model(self.plane, model)
            if request.method == "POST" and self.desk is not None:
                values = await self._json_body(request)
                change = check_trace_change({name: _strings(name, value) for name, value in values.items()})
                await self.desk.change(trace=change, model=model or "")
        except GatewayError as exc:
            return error_response(exc)
        return json_response(trace_values(model))


def _strings(name: str, value: Any) -> list[str] | None:
    """A trace setting's JSON value as the strings Triton reads: a list for trace_level, one string for the
    others (a number is taken too); None for null."""
    if value is None:
        return None
    if name == "trace_level":
        if not isinstance(value, list):
            raise BadRequest(NOT_ARRAY)
        if not all(isinstance(item, str) for item in value):
            raise BadRequest(NOT_STRING)
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return [str(value)]
    if not isinstance(value, str):
        raise BadRequest(NOT_STRING)
    return [value]
