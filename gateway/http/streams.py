"""One request's responses as an async iterator, for the routes that stream them to their client.

The data plane hands a request's outcome over in two ways (gateway/kserve/dataplane.py: DataPlane.run): a
decoupled model's responses one by one as the worker sends them (the `stream` callback, on the loop, each
within a millisecond or so of the model's `sender.send`), then the request's end (its future: None); any
other model's one answer through the future alone. ResponseStream puts both behind one `async for`, so a
route (Triton's /generate_stream here, OpenAI's streamed completions beside it) writes each response as it
comes and never learns which kind of model answered:

    stream = ResponseStream()
    stream.follow(plane.run(call, parse, size, probe, stream.push), call)
    async for response in stream:      # a Response each: outputs and parameters, or an error
        ...

A failure of the request (the worker died after it had sent responses: StreamBroken; its deadline passed:
StreamTimedOut; the client cancelled) comes as a last Response whose `streamed` is False: a route that has
sent nothing yet may still answer with a plain error status, one that has must say it in its stream.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ringserve.gateway.core.errors import GatewayError
from ringserve.gateway.kserve.dataplane import InferCall


@dataclass(frozen=True, slots=True)
class Response:
    """One response of a request: its outputs (name -> array) and the parameters the model set on it, or an
    error. `streamed`: a response the model sent (False: the request's own end, a failure of the request);
    `final`: the model said it was the request's last."""

    outputs: dict[str, np.ndarray] | None
    parameters: dict[str, Any] | None
    error: GatewayError | None
    streamed: bool = True
    final: bool = False


class ResponseStream:
    """The responses of one request in the order they came; the iteration ends with the request."""

    def __init__(self) -> None:
        self._ready: deque[Response] = deque()
        self._waiter: asyncio.Future | None = None
        self._ended = False
        self._outcome: asyncio.Future | None = None

    def push(self, request: Any, outputs: dict[str, np.ndarray] | None, error: GatewayError | None) -> None:
        """The data plane's `stream` callback: one response of a decoupled model, as it comes."""
        self._put(Response(outputs, request.response_parameters, error, True, request.response_final))

    def follow(self, outcome: Awaitable[Any], call: InferCall) -> None:
        """The request's outcome (what DataPlane.run handed back): the one answer of a model that is not
        decoupled, or the end of a decoupled one's responses, or the request's failure."""
        self._outcome = asyncio.ensure_future(outcome)
        self._outcome.add_done_callback(lambda done: self._ended_with(done, call))

    def cancel(self) -> None:
        """The route is done with it (its client went away): the request's await is cancelled."""
        if self._outcome is not None:
            self._outcome.cancel()

    def _ended_with(self, done: asyncio.Future, call: InferCall) -> None:
        if not done.cancelled():
            error = done.exception()
            if isinstance(error, GatewayError):
                self._ready.append(Response(None, None, error, streamed=False, final=True))
            elif error is None and done.result() is not None:  # (a model that answers once)
                parameters = call.request.response_parameters if call.request is not None else None
                self._ready.append(Response(done.result(), parameters, None, final=True))
        self._ended = True  # (any other exception is a bug: __anext__ raises it to the route)
        self._wake()

    def _put(self, response: Response) -> None:
        self._ready.append(response)
        self._wake()

    def _wake(self) -> None:
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def __aiter__(self) -> ResponseStream:
        return self

    async def __anext__(self) -> Response:
        while not self._ready:
            if self._ended:
                outcome = self._outcome
                if outcome is not None and not outcome.cancelled() and outcome.exception() is not None:
                    error = outcome.exception()
                    if not isinstance(error, GatewayError):
                        raise error  # type: ignore[misc]
                raise StopAsyncIteration
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        return self._ready.popleft()
