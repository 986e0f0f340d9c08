"""One infer request on its way through the data plane, and the context the front end that carried it holds
it in: `with plane.call(...) as call:` (gateway/kserve/dataplane.py: DataPlane.call). HTTP's infer route, gRPC's
servicer and the workers' calls each write the same few lines around it:

    with plane.call(model, request_id, span_headers, protocol, method, path) as call:
        config = call.target(version, where)            # 404, 503, a decoupled model off a stream
        outputs = await call.run(parse, size, disconnected)
        ...the answer encoded and sent...                # call.failed(exc) where a GatewayError is answered
        call.answered(nbytes)

Leaving the context finishes the call once, however it ended: the request counter, Triton's statistics,
the access line and the span's end. An error that leaves it unanswered by the front end sets the status on
the way out: a GatewayError's (counted as the model's failure), a cancelled await's 499, anything else 500.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from ringserve.common.repository.config import ModelConfig
from ringserve.gateway.cache.responses import CacheCall
from ringserve.gateway.core.errors import ClientDisconnected, GatewayError, status_of
from ringserve.gateway.core.request import InferRequest


class InferSteps(Protocol):
    """What a call asks of the data plane (DataPlane's methods of these names)."""

    def target(
        self, call: InferCall, model: str, version: str | None, where: str, streaming: bool = False
    ) -> ModelConfig: ...
    def run(
        self,
        call: InferCall,
        parse: Callable[[asyncio.Future], InferRequest],
        size: int,
        disconnected: Callable[[], bool] | None,
        stream: Callable[..., None] | None = None,
    ) -> Awaitable[Any]: ...
    def failed(self, call: InferCall, exc: GatewayError) -> int: ...
    def finish(self, call: InferCall, status: int, method: str, path: str, nbytes: int, status_code: int) -> None: ...


def _same_code(status: int) -> int:
    return status


class InferCall:
    """One infer request through the data plane: what `finish` counts and logs, and its context."""

    __slots__ = (
        "started_ns",
        "request_id",
        "span",
        "model",
        "label",
        "label_version",
        "config",
        "request",
        "plane",
        "method",
        "path",
        "status",
        "nbytes",
        "code_of",
        "failure_counted",
        "cache",
    )

    def __init__(self, started_ns: int, request_id: str, span: Any, model: str) -> None:
        self.started_ns = started_ns
        self.model = model  # as the client named it (the access line's)
        self.request_id = request_id
        self.span = span
        self.label = model  # the model's name, or UNKNOWN_MODEL_LABEL: unknown names can't grow the metrics
        self.label_version = 0
        self.config: ModelConfig | None = None
        self.request: InferRequest | None = None
        # (set by DataPlane.call) the plane, and what finishing the call writes
        self.plane: InferSteps | None = None
        self.method = self.path = ""  # the access line's
        self.status = 200
        self.nbytes = 0  # the answer's bytes (the access line's)
        self.code_of: Callable[[int], int] = _same_code  # the span's status code of a status (gRPC's own)
        self.failure_counted = False
        self.cache: CacheCall | None = None  # a response-cached model's request (gateway/cache/)

    def target(self, version: str | None, where: str, streaming: bool = False) -> ModelConfig:
        """The model version the call names (DataPlane.target)."""
        assert self.plane is not None
        return self.plane.target(self, self.model, version, where, streaming)

    def run(
        self,
        parse: Callable[[asyncio.Future], InferRequest],
        size: int,
        disconnected: Callable[[], bool] | None,
        stream: Callable[..., None] | None = None,
    ) -> Awaitable[Any]:
        """The request parsed, submitted and awaited (DataPlane.run)."""
        assert self.plane is not None
        return self.plane.run(self, parse, size, disconnected, stream)

    def failed(self, exc: GatewayError) -> int:
        """The status that answers `exc`, the call's from now on; the model's failure counted once."""
        assert self.plane is not None
        self.status = self.plane.failed(self, exc)
        self.failure_counted = True
        return self.status

    def answered(self, nbytes: int, status: int | None = None) -> None:
        """The answer took `nbytes` (and carried `status`, where given)."""
        self.nbytes = nbytes
        if status is not None:
            self.status = status

    def __enter__(self) -> InferCall:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, traceback: Any) -> None:
        assert self.plane is not None
        if exc is not None:  # (an error the front end did not answer: the call ends with it)
            if isinstance(exc, GatewayError):
                if not self.failure_counted:
                    self.failed(exc)
            elif isinstance(exc, asyncio.CancelledError):  # the client cancelled, or went away
                self.status = status_of(ClientDisconnected())
            else:
                self.status = 500
            self.nbytes = 0
        self.plane.finish(self, self.status, self.method, self.path, self.nbytes, self.code_of(self.status))
