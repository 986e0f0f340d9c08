"""Triton's LogSettings and TraceSetting RPCs, over gateway/cluster/runtime_settings.py (as HTTP's /v2/logging
and /v2/trace/setting are: gateway/http/settings_routes.py). The servicer (grpc/server.py) checks the API key
and hands each call here."""

from __future__ import annotations

from typing import Any, cast

from tritonclient.grpc import service_pb2 as pb

from ringserve.gateway.cluster.runtime_settings import (
    SettingsDesk,
    SettingsLink,
    check_log_change,
    check_log_type,
    check_trace_change,
    log_values,
    trace_values,
)
from ringserve.gateway.core.errors import GatewayError
from ringserve.gateway.grpc.codec import grpc_code
from ringserve.gateway.kserve.dataplane import DataPlane

_UNSET = object()  # a value with no parameter set: refused by its type check, with Triton's words


class SettingsRpcs:
    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane
        self.desk = SettingsDesk(cast(SettingsLink, plane.dispatcher), plane.peers)

    async def log_settings(self, request: pb.LogSettingsRequest, context: Any) -> pb.LogSettingsResponse:
        try:
            if request.settings:
                values = {name: _oneof(value) for name, value in request.settings.items()}
                for name, value in values.items():
                    check_log_type(name, value, words="grpc")
                await self.desk.change(log=check_log_change(values, format_word="log_format"))
        except GatewayError as exc:
            await context.abort(grpc_code(exc), str(exc))
        answer = pb.LogSettingsResponse()
        for name, value in log_values().items():
            setting = answer.settings[name]
            if isinstance(value, bool):
                setting.bool_param = value
            elif isinstance(value, int):
                setting.uint32_param = value
            else:
                setting.string_param = value
        return answer

    async def trace_setting(self, request: pb.TraceSettingRequest, context: Any) -> pb.TraceSettingResponse:
        model = request.model_name or None
        try:
            if model is not None:
                self.desk.check_model(self.plane, model)
            if request.settings:  # (an empty value list clears the setting, as in Triton)
                values = {name: (list(value.value) or None) for name, value in request.settings.items()}
                await self.desk.change(trace=check_trace_change(values), model=model or "")
        except GatewayError as exc:
            await context.abort(grpc_code(exc), str(exc))
        answer = pb.TraceSettingResponse()
        for name, value in trace_values(model).items():
            answer.settings[name].value.extend(value if isinstance(value, list) else [value])
        return answer


def _oneof(value: Any) -> Any:
    """A LogSettingsRequest value as the Python value it holds."""
    which = value.WhichOneof("parameter_choice")
    return _UNSET if which is None else getattr(value, which)
