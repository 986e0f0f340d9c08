"""Gateway errors and the one table that maps them to HTTP responses."""
from __future__ import annotations

import orjson


class GatewayError(Exception):
    """Root of errors answered to an HTTP client. `str(exc)` is the message it reads."""

    headers: dict[str, str] = {}


class BadRequest(GatewayError):
    """The request is malformed or does not match the model; says what is accepted."""


class ModelNotFound(GatewayError):
    def __init__(self, model: str, version: str | None, known: list[str]) -> None:
        what = f"model {model!r}" + (f" version {version}" if version else "")
        super().__init__(f"{what} is not served here; models: {', '.join(known) or 'none'}")


class PayloadTooLarge(GatewayError):
    def __init__(self, needed_bytes: int, capacity_bytes: int) -> None:
        super().__init__(
            f"request needs {needed_bytes} bytes of tensor space; one batch slot holds "
            f"{capacity_bytes} bytes (send fewer rows, or start the server with a larger --slot-mb)"
        )


class Unavailable(GatewayError):
    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.headers = {"retry-after": str(retry_after_s)}


class DeadlineExceeded(GatewayError):
    def __init__(self, waited_s: float) -> None:
        super().__init__(f"request timeout expired: waited {waited_s:.3f} s in the queue without being served")


class ModelExecutionFailed(GatewayError):
    def __init__(self, model: str, detail: str) -> None:
        super().__init__(f"model {model!r} failed on this request: {detail}")


class WorkerCrashed(GatewayError):
    def __init__(self, reason: str) -> None:
        super().__init__(
            f"the inference worker crashed ({reason}) while running this request; "
            "it was retried alone and crashed again"
        )


HTTP_STATUS: dict[type[GatewayError], int] = {
    BadRequest: 400,
    ModelExecutionFailed: 400,
    ModelNotFound: 404,
    PayloadTooLarge: 413,
    Unavailable: 503,
    DeadlineExceeded: 504,
    WorkerCrashed: 500,
}


def status_of(exc: GatewayError) -> int:
    for cls in type(exc).__mro__:
        if cls in HTTP_STATUS:
            return HTTP_STATUS[cls]
    return 500


def error_body(message: str) -> bytes:
    return orjson.dumps({"error": message})
