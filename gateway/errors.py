"""Gateway errors and the one table that maps them to HTTP responses."""
from __future__ import annotations

import orjson


class GatewayError(Exception):
    """Root of errors answered to an HTTP client. `str(exc)` is the message it reads."""

    headers: dict[str, str] = {}


class BadRequest(GatewayError):
    """The request is malformed or does not match the model; says what is accepted."""


class LoadFailed(BadRequest):
    """A repository load request that cannot be carried out; says why."""

    def __init__(self, model: str, why: str) -> None:
        super().__init__(f"cannot load model {model!r}: {why}")


class Unauthorized(GatewayError):
    def __init__(self, message: str) -> None:
        super().__init__(f"{message}; send the header 'Authorization: Bearer <key>' with the server's API key")
        self.headers = {"www-authenticate": "Bearer"}


class ModelNotFound(GatewayError):
    def __init__(self, model: str, version: str | None, known: list[str]) -> None:
        what = f"model {model!r}" + (f" version {version}" if version else "")
        super().__init__(f"{what} is not served here; models: {', '.join(known) or 'none'}")


class ModelVersionNotFound(ModelNotFound):
    def __init__(self, model: str, version: str, served: str) -> None:
        GatewayError.__init__(self, f"model {model!r} has no version {version!r} here; it serves version {served}")


class NoRoute(GatewayError):
    def __init__(self, method: str, path: str, hint: str = "") -> None:
        super().__init__(f"no route {method} {path}{hint}; the routes are listed in /openapi.json")


class MethodNotAllowed(GatewayError):
    def __init__(self, method: str, path: str, allowed: str) -> None:
        super().__init__(f"{method} is not allowed on {path}; use {allowed}")
        self.headers = {"allow": allowed}


class RequestTimeout(GatewayError):
    def __init__(self, received_bytes: int, expected_bytes: int | None, timeout_s: float) -> None:
        of = f" of the {expected_bytes} announced by Content-Length" if expected_bytes is not None else ""
        super().__init__(f"the request body stopped arriving: {received_bytes} bytes{of} came, then nothing for "
                         f"{timeout_s:g} s; send the whole body without pausing that long")
        self.headers = {"connection": "close"}


class HeadTimeout(GatewayError):
    def __init__(self, timeout_s: float) -> None:
        super().__init__(f"the request line and headers did not all arrive within {timeout_s:g} s "
                         "(--header-timeout-s); send them without pausing")
        self.headers = {"connection": "close"}


class HeadersTooLarge(GatewayError):
    def __init__(self, size_bytes: int, limit_bytes: int) -> None:
        super().__init__(f"the request line and headers are {size_bytes} bytes or more; this server takes at most "
                         f"{limit_bytes} bytes of them (--max-header-bytes)")
        self.headers = {"connection": "close"}


class PayloadTooLarge(GatewayError):
    def __init__(self, needed_bytes: int, capacity_bytes: int) -> None:
        super().__init__(
            f"request needs {needed_bytes} bytes of tensor space; one batch slot holds "
            f"{capacity_bytes} bytes (send fewer rows, or start the server with a larger --slot-mb)"
        )


class RequestTooLarge(GatewayError):
    def __init__(self, size_bytes: int, limit_bytes: int, what: str = "request body") -> None:
        super().__init__(f"{what} is {size_bytes} bytes or more; this server takes at most {limit_bytes} bytes "
                         "per request (--max-request-bytes)")
        self.headers = {"connection": "close"}


class UnsupportedEncoding(GatewayError):
    def __init__(self, encoding: str) -> None:
        super().__init__(f"Content-Encoding {encoding!r} is not supported; accepted: gzip, deflate, identity")


class Unavailable(GatewayError):
    def __init__(self, message: str, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.headers = {"retry-after": str(retry_after_s)}


class ModelFailed(Unavailable):
    """A model that cannot be served until someone fixes it (its config cannot be built, or its
    file cannot load): 503 without Retry-After, which would invite retries that cannot succeed."""

    def __init__(self, message: str) -> None:
        GatewayError.__init__(self, message)
        self.headers = {}


class TooManyConnections(Unavailable):
    def __init__(self, limit: int, retry_after_s: int = 1) -> None:
        super().__init__(f"this server already has {limit} connections open (--max-connections); "
                         "retry on a new connection", retry_after_s)
        self.headers = {**self.headers, "connection": "close"}


class DeadlineExceeded(GatewayError):
    def __init__(self, waited_s: float) -> None:
        super().__init__(f"request timeout expired: waited {waited_s:.3f} s in the queue without being served")


class ModelExecutionFailed(GatewayError):
    def __init__(self, model: str, detail: str) -> None:
        super().__init__(f"model {model!r} failed on this request: {detail}")


class DecoupledNeedsStream(BadRequest):
    """A decoupled model answers any number of times: only gRPC ModelStreamInfer carries that."""

    def __init__(self, model: str, where: str) -> None:
        super().__init__(f"model {model!r} is decoupled (it may send any number of responses per request): "
                         f"{where} answers once; send its requests over gRPC ModelStreamInfer")


class StreamBroken(GatewayError):
    """The worker died while a decoupled request streamed; what it sent is not sent again (500)."""

    def __init__(self, model: str, sent: int, reason: str) -> None:
        super().__init__(f"model {model!r}: the inference worker died ({reason}) after {sent} response(s) of this "
                         "request were sent; those are not sent again, and the request was not run again")


class ModelInternalError(GatewayError):
    """A Python model's own bug: execute raised (not TritonModelException) or answered INTERNAL (500)."""

    def __init__(self, model: str, detail: str) -> None:
        super().__init__(f"model {model!r} failed on this request: {detail}")


class ModelCancelled(GatewayError):
    """A Python model answered CANCELLED (pb_utils.TritonError.CANCELLED): 499, as a cancelled request."""

    def __init__(self, model: str, detail: str) -> None:
        super().__init__(f"model {model!r} cancelled this request: {detail}")


class WorkerCrashed(GatewayError):
    def __init__(self, reason: str) -> None:
        super().__init__(
            f"the inference worker crashed ({reason}) while running this request; "
            "it was retried alone and crashed again"
        )


class BatchWriteFailed(GatewayError):
    """Writing a batch into its slot raised: a bug, but it must answer its requests, not strand them (500)."""

    def __init__(self, model: str, detail: str) -> None:
        super().__init__(f"model {model!r}: the server could not write this request's batch into shared memory "
                         f"({detail}); this is a bug in the server, please report it")


class ClientDisconnected(GatewayError):
    """The client went away while its request waited; nobody reads this answer (nginx's 499)."""

    def __init__(self) -> None:
        super().__init__("client disconnected before the request was served")


HTTP_STATUS: dict[type[GatewayError], int] = {
    BadRequest: 400,
    ModelExecutionFailed: 400,
    Unauthorized: 401,
    ModelNotFound: 404,
    NoRoute: 404,
    MethodNotAllowed: 405,
    RequestTimeout: 408,
    HeadTimeout: 408,
    PayloadTooLarge: 413,
    RequestTooLarge: 413,
    UnsupportedEncoding: 415,
    HeadersTooLarge: 431,
    Unavailable: 503,
    DeadlineExceeded: 504,
    WorkerCrashed: 500,
    ClientDisconnected: 499,
    ModelInternalError: 500,
    ModelCancelled: 499,
    StreamBroken: 500,
}


def model_answer_error(model: str, detail: str, status: int) -> GatewayError:
    """The error a request gets when its model (a Python model, an ensemble) answered it with one;
    `status` is the worker's reading of the model's error (worker/pb_utils.py: http_status)."""
    if status == 503:
        return Unavailable(f"model {model!r} is unavailable for this request: {detail}")
    if status == 499:
        return ModelCancelled(model, detail)
    if status >= 500:
        return ModelInternalError(model, detail)
    return ModelExecutionFailed(model, detail)


def status_of(exc: GatewayError) -> int:
    for cls in type(exc).__mro__:
        if cls in HTTP_STATUS:
            return HTTP_STATUS[cls]
    return 500


def error_body(message: str, request_id: str | None = None) -> bytes:
    """`{"error": ..., "request_id": ...}`: the id of the request it answers (gateway/access.py)."""
    if request_id is None:
        return orjson.dumps({"error": message})
    return orjson.dumps({"error": message, "request_id": request_id})
