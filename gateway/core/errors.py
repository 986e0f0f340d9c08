"""Gateway errors and the one table that maps them to HTTP responses.

Messages about a condition Triton reports too start with Triton's phrase for it (gateway/core/phrases.py).

Every message that quotes a client's value quotes it through `echo`: a 1 MiB model name came back
whole, and over gRPC a status that size reset the stream instead of answering.
"""

from __future__ import annotations

import reprlib
from typing import Any

import orjson

from ringserve.gateway.core.phrases import say

ECHO_MAX_CHARS = 200
# reprlib bounds what is made before the cut (a list of a million dims, a dict of long strings).
_ECHO_REPR = reprlib.Repr()  # (Python 3.11's takes no arguments)
_ECHO_REPR.maxtuple = _ECHO_REPR.maxlist = _ECHO_REPR.maxarray = 64
_ECHO_REPR.maxdict = _ECHO_REPR.maxset = _ECHO_REPR.maxfrozenset = _ECHO_REPR.maxdeque = 16
_ECHO_REPR.maxstring = _ECHO_REPR.maxlong = _ECHO_REPR.maxother = ECHO_MAX_CHARS


def echo(value: Any, quoted: bool = True) -> str:
    """A client's value as an error message quotes it: its repr (a str as it is when not `quoted`), of
    at most ECHO_MAX_CHARS of its characters, then "…" where it was cut."""
    if isinstance(value, (str, bytes)):
        cut = value[:ECHO_MAX_CHARS]
        text = repr(cut) if quoted or isinstance(value, bytes) else cut
        return text if len(cut) == len(value) else text + "…"
    text = _ECHO_REPR.repr(value)
    return text if len(text) <= ECHO_MAX_CHARS else text[:ECHO_MAX_CHARS] + "…"


class GatewayError(Exception):
    """Root of errors answered to an HTTP client. `str(exc)` is the message it reads."""

    headers: dict[str, str] = {}


class BadRequest(GatewayError):
    """The request is malformed or does not match the model; says what is accepted."""


class LoadFailed(BadRequest):
    """A repository load request that cannot be carried out; says why."""

    def __init__(self, model: str, why: str) -> None:
        super().__init__(f"cannot load model {echo(model)}: {why}")


class Unauthorized(GatewayError):
    def __init__(self, message: str) -> None:
        super().__init__(f"{message}; send the header 'Authorization: Bearer <key>' with the server's API key")
        self.headers = {"www-authenticate": "Bearer"}


class ModelNotFound(GatewayError):
    def __init__(self, model: str, version: str | None, known: list[str], loading: bool = False) -> None:
        what = f"model {echo(model)}" + (f" version {echo(version, quoted=False)}" if version else "")
        detail = f"{what} is not served here; models: {', '.join(known) or 'none'}"
        condition = "load_not_found" if loading else "unknown_version" if version else "unknown_model"
        super().__init__(
            say(
                condition,
                detail,
                model=echo(model, quoted=False),
                version=None if version is None else echo(version, quoted=False),
            )
        )


class ModelVersionNotFound(ModelNotFound):
    def __init__(self, model: str, version: str, served: str) -> None:
        GatewayError.__init__(
            self,
            say(
                "unknown_version",
                f"model {echo(model)} has no version {echo(version)} here; it serves version {served}",
                model=echo(model, quoted=False),
                version=echo(version, quoted=False),
            ),
        )


class NoRoute(GatewayError):
    def __init__(self, method: str, path: str, hint: str = "") -> None:
        super().__init__(
            f"no route {echo(method, quoted=False)} {echo(path, quoted=False)}{hint}; the routes are listed "
            "in /openapi.json"
        )


class MethodNotAllowed(GatewayError):
    def __init__(self, method: str, path: str, allowed: str) -> None:
        super().__init__(f"{echo(method, quoted=False)} is not allowed on {echo(path, quoted=False)}; use {allowed}")
        self.headers = {"allow": allowed}


class RequestTimeout(GatewayError):
    def __init__(self, received_bytes: int, expected_bytes: int | None, timeout_s: float) -> None:
        of = f" of the {expected_bytes} announced by Content-Length" if expected_bytes is not None else ""
        super().__init__(
            f"the request body stopped arriving: {received_bytes} bytes{of} came, then nothing for "
            f"{timeout_s:g} s; send the whole body without pausing that long"
        )
        self.headers = {"connection": "close"}


class HeadTimeout(GatewayError):
    def __init__(self, timeout_s: float) -> None:
        super().__init__(
            f"the request line and headers did not all arrive within {timeout_s:g} s "
            "(--header-timeout-s); send them without pausing"
        )
        self.headers = {"connection": "close"}


class HeadersTooLarge(GatewayError):
    def __init__(self, size_bytes: int, limit_bytes: int) -> None:
        super().__init__(
            f"the request line and headers are {size_bytes} bytes or more; this server takes at most "
            f"{limit_bytes} bytes of them (--max-header-bytes)"
        )
        self.headers = {"connection": "close"}


class InvalidHttpRequest(GatewayError):
    """What httptools refuses to parse (its reason says why); the connection closes after the answer."""

    # llhttp's reasons for a request with both headers (in either order)
    BOTH_LENGTHS = (
        "Content-Length can't be present with Transfer-Encoding",
        "Transfer-Encoding can't be present with Content-Length",
    )

    def __init__(self, reason: str) -> None:
        if reason in self.BOTH_LENGTHS:
            message = (
                "the request has both Transfer-Encoding and Content-Length, which HTTP/1.1 does not allow "
                "(RFC 9112 section 6.1: a sender must not send Content-Length with Transfer-Encoding; "
                "section 6.3: a server may refuse such a request); send the body with Content-Length alone, "
                "or chunked without Content-Length"
            )
        else:
            message = f"invalid HTTP request: {reason}; send an HTTP/1.1 request (RFC 9112)"
        super().__init__(message)
        self.headers = {"connection": "close"}


class PayloadTooLarge(GatewayError):
    def __init__(self, needed_bytes: int, capacity_bytes: int, what: str = "request", at_least: bool = False) -> None:
        super().__init__(
            f"{what} needs {'at least ' if at_least else ''}{needed_bytes} bytes of tensor space; one batch slot holds "
            f"{capacity_bytes} bytes (send fewer rows, or start the server with a larger --slot-mb)"
        )


class TooManyValues(PayloadTooLarge):
    """A JSON text with more values than a slot can hold, refused before it is parsed (gateway/codec/parse.py)."""

    def __init__(self, what: str, values: int, limit: int, capacity_bytes: int) -> None:
        GatewayError.__init__(
            self,
            f"{what} has {values} commas or more, so about as many values; one batch slot holds "
            f"{capacity_bytes} bytes, room for {limit} of them at most (send fewer values, binary tensors, or "
            "start the server with a larger --slot-mb)",
        )


class GenerateBodyTooLarge(PayloadTooLarge):
    """A generate request's body is larger than a slot: each value in it is an input the slot holds, or a
    parameter that travels with the batch (Triton bounds the JSON by --http-max-input-size)."""

    def __init__(self, size_bytes: int, capacity_bytes: int) -> None:
        GatewayError.__init__(
            self,
            say(
                "json_size",
                "a generate body's values go into one batch slot; start the server with a larger --slot-mb",
                size=size_bytes,
                limit=capacity_bytes,
            ),
        )


class RequestTooLarge(GatewayError):
    def __init__(self, size_bytes: int, limit_bytes: int, what: str = "request body") -> None:
        super().__init__(
            say(
                "json_size",
                f"{what} is {size_bytes} bytes or more; this server takes at most "
                f"{limit_bytes} bytes per request (--max-request-bytes)",
                size=size_bytes,
                limit=limit_bytes,
            )
        )
        self.headers = {"connection": "close"}


class UnsupportedEncoding(GatewayError):
    def __init__(self, encoding: str) -> None:
        super().__init__(f"Content-Encoding {echo(encoding)} is not supported; accepted: gzip, deflate, identity")


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


class ModelControlDisabled(Unavailable):
    """A repository load or unload in a model control mode that takes none (Triton's UNAVAILABLE, no retry)."""

    def __init__(self, mode: str) -> None:
        GatewayError.__init__(
            self,
            say(
                "model_control_disabled",
                f"the model control mode is {mode}: start the server with --model-control-mode explicit to load "
                "and unload models through the repository API",
            ),
        )
        self.headers = {}


class TooManyConnections(Unavailable):
    def __init__(self, limit: int, retry_after_s: int = 1) -> None:
        super().__init__(
            f"this server already has {limit} connections open (--max-connections); retry on a new connection",
            retry_after_s,
        )
        self.headers = {**self.headers, "connection": "close"}


class DeadlineExceeded(GatewayError):
    def __init__(self, waited_s: float) -> None:
        super().__init__(say("queue_timeout", f"waited {waited_s:.3f} s in the queue without being served"))


class ModelExecutionFailed(GatewayError):
    def __init__(self, model: str, detail: str) -> None:
        super().__init__(f"model {model!r} failed on this request: {detail}")
        self.detail = detail  # the model's own words (the generate extension answers with them)


class StreamBroken(GatewayError):
    """The worker died while a decoupled request streamed; what it sent is not sent again (500)."""

    def __init__(self, model: str, sent: int, reason: str) -> None:
        super().__init__(
            f"model {model!r}: the inference worker died ({reason}) after {sent} response(s) of this "
            "request were sent; those are not sent again, and the request was not run again"
        )


class StreamTimedOut(GatewayError):
    """A decoupled request's stream was still open at its deadline (its `timeout` parameter, the model's
    default_timeout_microseconds, or --request-timeout-s): ended there, its model told to stop (504)."""

    def __init__(self, model: str, timeout_s: float, sent: int) -> None:
        super().__init__(
            f"model {model!r}: this request's stream was not finished within {timeout_s:.3f} s of its arrival "
            f"({sent} response(s) sent); the model was told it is cancelled. Give a longer 'timeout' "
            "parameter (microseconds) or --request-timeout-s"
        )


class ModelInternalError(GatewayError):
    """A Python model's own bug: execute raised (not TritonModelException) or answered INTERNAL (500)."""

    def __init__(self, model: str, detail: str) -> None:
        super().__init__(f"model {model!r} failed on this request: {detail}")
        self.detail = detail  # the model's own words (the generate extension answers with them)


class ModelCancelled(GatewayError):
    """A Python model answered CANCELLED (pb_utils.TritonError.CANCELLED): 499, as a cancelled request."""

    def __init__(self, model: str, detail: str) -> None:
        super().__init__(f"model {model!r} cancelled this request: {detail}")
        self.detail = detail


class WorkerCrashed(GatewayError):
    def __init__(self, reason: str) -> None:
        super().__init__(
            f"the inference worker crashed ({reason}) while running this request; "
            "it was retried alone and crashed again"
        )


class BatchWriteFailed(GatewayError):
    """Writing a batch into its slot raised: a bug, but it must answer its requests, not strand them (500)."""

    def __init__(self, model: str, detail: str) -> None:
        super().__init__(
            f"model {model!r}: the server could not write this request's batch into shared memory "
            f"({detail}); this is a bug in the server, please report it"
        )


class Unsupported(GatewayError):
    """Something this server is configured not to do (Triton's UNSUPPORTED: HTTP 501, gRPC UNIMPLEMENTED)."""


class ResponseCountWrong(GatewayError):
    """/generate answers with exactly one response; the model sent none or several (500: Triton's INTERNAL)."""

    def __init__(self, count: int) -> None:
        super().__init__(say("generate_one_response", f"the model sent {count}"))


class DecoupledNeedsStream(Unsupported):
    """A decoupled model answers any number of times: only gRPC ModelStreamInfer and /generate_stream carry that.
    Triton's UNSUPPORTED, as Triton refuses it: HTTP 501, gRPC UNIMPLEMENTED."""

    def __init__(self, model: str, where: str) -> None:
        condition = "decoupled_grpc" if where.startswith("gRPC") else "decoupled_http"  # (Triton's words)
        super().__init__(
            say(
                condition,
                f"model {model!r} is decoupled (it may send any number of responses per request): {where} answers "
                "once; send its requests over gRPC ModelStreamInfer or HTTP's /generate_stream",
            )
        )


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
    InvalidHttpRequest: 400,
    RequestTimeout: 408,
    HeadTimeout: 408,
    PayloadTooLarge: 413,  # (TooManyValues too)
    RequestTooLarge: 413,
    UnsupportedEncoding: 415,
    HeadersTooLarge: 431,
    Unavailable: 503,
    DeadlineExceeded: 504,
    WorkerCrashed: 500,
    ClientDisconnected: 499,
    Unsupported: 501,
    ModelInternalError: 500,
    ModelCancelled: 499,
    StreamBroken: 500,
    StreamTimedOut: 504,
    ResponseCountWrong: 500,
}


def model_answer_error(model: str, detail: str, status: int) -> GatewayError:
    """The error a request gets when its model (a Python model, an ensemble) answered it with one;
    `status` is the worker's reading of the model's error (worker/python/pb_utils.py: http_status)."""
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
    """`{"error": ..., "request_id": ...}`: the id of the request it answers (gateway/observe/access.py)."""
    if request_id is None:
        return orjson.dumps({"error": message})
    return orjson.dumps({"error": message, "request_id": request_id})
