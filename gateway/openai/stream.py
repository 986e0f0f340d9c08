"""One OpenAI request's inference through the data plane, its responses as they come, and the
server-sent events that carry them.

The request goes in as any /infer request does (DataPlane.run: batcher, lane, slot, worker); a decoupled model's
responses come back through the stream callback as the worker sends them (dispatch/replies.py: on_stream), on the
gateway's loop, into a queue that the route reads. The request's end (its future) closes the queue: with the
model's one answer (a model that is not decoupled), nothing more (a decoupled one sent its final flag), or the
GatewayError that ended it, such as StreamBroken when the worker died after responses were sent (a worker death
before any response replays the request: the client sees nothing of it).
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
from starlette.responses import Response

from ringserve.common.repository.config import ModelConfig
from ringserve.gateway.core.errors import GatewayError, status_of
from ringserve.gateway.kserve.dataplane import DataPlane, InferCall
from ringserve.gateway.openai.errors import error_doc

_END = object()
DONE_EVENT = b"data: [DONE]\n\n"


@dataclass(frozen=True)
class ClientWatch:
    """How a request learns that its client went away: gateway/http/routes.py's disconnect_probe and
    on_disconnect, handed in by the HTTP layer (it sits above this package)."""

    probe: Callable[[Any], Callable[[], bool] | None]
    on_disconnect: Callable[[Any, Callable[[], None]], None]


class Responses:
    """A started inference request; `async for outputs in responses` yields each response's outputs and then
    raises the GatewayError that ended the request, if one did. `close` answers the call's end (counted once)."""

    def __init__(
        self,
        plane: DataPlane,
        call: InferCall,
        config: ModelConfig,
        doc: dict,
        size: int,
        receive: Any,
        watch: ClientWatch,
    ) -> None:
        self.plane, self.call, self.config = plane, call, config
        self.queue: asyncio.Queue = asyncio.Queue()
        self.status = 200
        self.closed = False
        parse = plane.doc_parser(config, doc)
        if config.kind == "python":  # a model that may poll request.is_cancelled(): a client gone cancels it
            watch.on_disconnect(receive, functools.partial(plane.cancel, call))
        outcome = plane.run(call, parse, size, watch.probe(receive), self._streamed)  # (400 raises here)
        self.outcome: asyncio.Future = asyncio.ensure_future(outcome)
        self.outcome.add_done_callback(lambda _: self.queue.put_nowait(_END))

    def _streamed(self, request: Any, outputs: dict[str, np.ndarray] | None, error: GatewayError | None) -> None:
        # On the loop, as the worker's response is read (its tensors are copied out of the slot here).
        if error is None and outputs is not None:
            self.queue.put_nowait({name: np.array(array, copy=True) for name, array in outputs.items()})
        elif error is not None:
            self.queue.put_nowait(error)

    def __aiter__(self) -> AsyncIterator[dict[str, np.ndarray]]:
        return self._each()

    async def _each(self) -> AsyncIterator[dict[str, np.ndarray]]:
        while True:
            item = await self.queue.get()
            if item is _END:
                break
            if isinstance(item, GatewayError):  # the model answered this response with an error: the request's end
                raise item
            yield item
        answer = self.outcome.result()  # (raises the request's error)
        if answer is not None:  # a model that is not decoupled: its one answer
            yield answer

    async def collect(self) -> list[dict[str, np.ndarray]]:
        return [outputs async for outputs in self]

    def close(self, exc: GatewayError | None, path: str, nbytes: int) -> None:
        """The call is over (`exc`: how it failed): counted, its statistics and span; a request still running
        (the client went away) is cancelled."""
        if self.closed:
            return
        self.closed = True
        if not self.outcome.done():
            self.plane.cancel(self.call)
        status = 200 if exc is None else self.plane.failed(self.call, exc)
        self.plane.finish(self.call, status, "POST", path, nbytes, status)


class EventStream(Response):
    """An answer of server-sent events (text/event-stream): each `data:` event is sent as it is made, not
    buffered; the client's disconnect ends it (uvicorn: the send raises or the probe says so)."""

    def __init__(self, events: AsyncIterator[bytes]) -> None:  # (no Content-Length: Response's __init__ would set one)
        self.status_code, self.background, self.events = 200, None, events
        self.raw_headers = [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            (b"cache-control", b"no-cache"),
            (b"x-accel-buffering", b"no"),  # (nginx: pass each event on as it comes)
        ]

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        try:
            async for event in self.events:
                await send({"type": "http.response.body", "body": event, "more_body": True})
        finally:
            await _close(self.events)
        await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _close(events: AsyncIterator[bytes]) -> None:
    aclose = getattr(events, "aclose", None)
    if aclose is not None:
        await aclose()


def event(doc: Any) -> bytes:
    return b"data: " + orjson.dumps(doc) + b"\n\n"


def error_event(exc: GatewayError) -> bytes:
    """The event that ends a stream its request's error ended (the status it would have had goes in `code`)."""
    doc = error_doc(exc)
    doc["code"] = doc["code"] or status_of(exc)
    return event({"error": doc})
