"""Errors as OpenAI's API answers them: `{"error": {"message", "type", "param", "code"}}`, with the status the
gateway's one table gives (gateway/core/errors.py: status_of). The official clients read `message` and raise
by status (400 BadRequestError, 401 AuthenticationError, 404 NotFoundError, ...)."""

from __future__ import annotations

from typing import Any

import orjson

from ringserve.gateway.core.errors import BadRequest, GatewayError, ModelNotFound, Unauthorized, status_of

OPENAI_PREFIX = "/v1/"

# status -> OpenAI's error `type` (its API reference's names; 5xx are the server's).
_TYPES = {400: "invalid_request_error", 401: "invalid_request_error", 404: "invalid_request_error",
          405: "invalid_request_error", 408: "invalid_request_error", 413: "invalid_request_error",
          415: "invalid_request_error", 429: "rate_limit_error", 499: "invalid_request_error"}  # fmt: skip


class InvalidField(BadRequest):
    """A body field OpenAI's API defines, with a value it does not take (400, `param` names the field)."""

    def __init__(self, param: str, message: str) -> None:
        super().__init__(message)
        self.param = param


def is_openai_path(path: str) -> bool:
    return path.startswith(OPENAI_PREFIX)


def error_doc(exc: GatewayError) -> dict[str, Any]:
    """The `error` object of OpenAI's shape for `exc`."""
    status = status_of(exc)
    code: str | None = None
    if isinstance(exc, Unauthorized):
        code = "invalid_api_key"
    elif isinstance(exc, ModelNotFound):
        code = "model_not_found"
    return {
        "message": str(exc),
        "type": _TYPES.get(status, "server_error" if status >= 500 else "invalid_request_error"),
        "param": getattr(exc, "param", None),
        "code": code,
    }


def openai_error_body(exc: GatewayError) -> bytes:
    return orjson.dumps({"error": error_doc(exc)})
