"""A worker's request to a model it does not hold: a BLS call or an ensemble's step whose model runs in
another lane (worker/calls.py sends it). It is served here as an HTTP request is, without the HTTP:

    CALL + body    the body is the KServe v2 binary tensor form (a JSON header, then the tensors), what an
                   HTTP client would POST; parse_infer_request checks it as it checks any (400, 404, 413)
    data plane     target, run: queued, batched with the clients' requests, dispatched to a lane of the
                   model, requeued after that lane's death, bisected, quarantined, 504 at its deadline;
                   while the model has no ready lane it is held (up to --request-timeout-s), not refused
    CALL_REPLY     the status and error, or the outputs in the same binary form (every output binary)

Counted in the request metrics and statistics like any request, with the access line's path
`call:<worker identity>`. Nothing here waits for the caller: a caller that died meanwhile gets nothing.
A stream call to a decoupled model (exec(decoupled=True)) is answered response by response
(gateway/calls/stream.py); CALL_CANCEL cancels one.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from typing import Any

from ringserve.common.messages import Call, CallCancel, CallReply, Message
from ringserve.gateway.calls.stream import StreamCalls
from ringserve.gateway.codec.encode import encode_response
from ringserve.gateway.codec.parse import parse_infer_request
from ringserve.gateway.core.errors import GatewayError
from ringserve.gateway.core.request import InferRequest
from ringserve.gateway.dispatch.link import Link
from ringserve.gateway.kserve.dataplane import DataPlane
from ringserve.gateway.observe.access import request_id_of

log = logging.getLogger(__name__)


def _parse_call(*args: Any, hold_s: float, **kwargs: Any) -> InferRequest:
    """The call's request, held while its model's lanes restart (its caller's batch is running meanwhile)."""
    request = parse_infer_request(*args, **kwargs)
    request.hold_s = hold_s
    return request


class WorkerCalls:
    """Serves the workers' CALLs on one gateway's data plane."""

    def __init__(self, plane: DataPlane, allow_faults: bool) -> None:
        self.plane = plane
        self.allow_faults = allow_faults  # RINGSERVE_FAULT_INJECTION (tests only): a call's ringserve_fault
        self._running: set[asyncio.Task] = set()
        self.streams = StreamCalls(plane)  # exec(decoupled=True) calls (gateway/calls/stream.py)

    def on_call(self, identity: bytes, call: Message, body: bytes) -> None:
        if isinstance(call, CallCancel):
            self.streams.cancel(identity, call.call_id, "its caller cancelled it")
            return
        if not isinstance(call, Call):
            log.warning("ignoring %s with a body from %s", call.KIND, identity.decode(errors="replace"))
            return
        task = asyncio.get_running_loop().create_task(self.serve(identity, call, bytes(body)))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def serve(self, identity: bytes, call: Call, body: bytes) -> None:
        plane = self.plane
        caller = identity.decode(errors="replace")
        request_id = request_id_of(None)
        version = None if call.version == -1 else str(call.version)
        link = plane.dispatcher.link
        with plane.call(call.model, request_id, (), "call", "CALL", f"call:{caller}") as api:
            try:
                config = api.target(version, "a BLS call", streaming=call.stream)
                parse = functools.partial(
                    _parse_call,
                    config,
                    body,
                    capacity_bytes=plane.capacity_bytes,
                    allow_faults=self.allow_faults,
                    header_length=str(call.header_length),
                    max_tensor_bytes=plane.max_tensor_bytes,
                    hold_s=plane.dispatcher.settings.request_timeout_s,
                )
                if call.stream and config.decoupled:
                    send = functools.partial(self._reply, link, identity)
                    api.answered(0, await self.streams.serve(identity, call, api, parse, len(body), send))
                    return
                outputs = await api.run(parse, len(body), None)
                assert api.request is not None  # (run set it)
                payload, json_length = encode_response(api.request, outputs)
                reply = CallReply(call_id=call.call_id, status=200, header_length=json_length or len(payload))
            except GatewayError as exc:
                status = api.failed(exc)
                reply, payload = CallReply(call_id=call.call_id, status=status, error=str(exc)), b""
            except Exception as exc:  # noqa: BLE001 - a bug here must still answer the caller, whose batch waits
                log.exception("a call from %s for model %s failed", caller, call.model)
                reply, payload = CallReply(call_id=call.call_id, status=500, error=f"{type(exc).__name__}: {exc}"), b""
            self._reply(link, identity, reply, payload)
            api.answered(len(payload), reply.status)

    @staticmethod
    def _reply(link: Link | None, identity: bytes, reply: CallReply, payload: bytes) -> bool:
        return link is not None and link.send_call_reply(identity, reply, payload)
