"""A worker's BLS stream call: `exec(decoupled=True)` to a decoupled model of another lane (worker/calls_stream.py
is the caller's end). The model's stream runs on the data plane as a gRPC ModelStreamInfer request's does
(target with streaming, run with a `stream` callback): queued, batched, dispatched to a lane of the model,
cancelled at its deadline (the call's `timeout` parameter, at most --request-timeout-s).

    each response the model sends   one CALL_REPLY (final false), sent as it comes
    the model's final flag          the last response's CALL_REPLY carries final (a flag sent alone: an
                                    empty final CALL_REPLY, an empty response to the caller)
    an error ending the request     a final CALL_REPLY with its status: the target's lane died mid-stream
                                    (500, the responses sent are not sent again), the deadline (504), a
                                    cancel (499), the model unknown (404)
    CALL_CANCEL                     the request is cancelled as a client's is (its model's is_cancelled()
                                    turns true, its slot is freed): answered 499
    the caller's lane exits         (WorkerExited from the supervisor, or a reply that cannot reach it)
                                    the caller's streams are cancelled the same way: a dead caller holds
                                    no slot of the target's lane

The final flag rides on the response that carried it (the request's `response_final`, set by dispatch/replies.py:
on_stream), as Triton's iterator yields it: a final flag sent alone is an empty response, one sent with the
last response is not another.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ringserve.common import wire
from ringserve.common.messages import Call, CallReply
from ringserve.gateway.codec.encode import encode_response
from ringserve.gateway.core.errors import ClientDisconnected, GatewayError, status_of
from ringserve.gateway.core.request import InferRequest
from ringserve.gateway.kserve.dataplane import DataPlane, InferCall


class CallerCancelled(ClientDisconnected):
    """The BLS caller cancelled its stream (ResponseIterator.cancel()), or its lane is gone (499)."""

    def __init__(self, why: str) -> None:
        GatewayError.__init__(self, f"the BLS request was cancelled: {why}")


class StreamCalls:
    """The stream calls one gateway serves, by caller and call id: what a CALL_CANCEL or a caller's exit finds."""

    def __init__(self, plane: DataPlane) -> None:
        self.plane = plane
        self.running: dict[tuple[bytes, int], InferCall] = {}

    def cancel(self, identity: bytes, call_id: int, why: str) -> None:
        api = self.running.get((identity, call_id))
        request = None if api is None else api.request
        if request is not None and not request.done:
            self.plane.dispatcher.cancel(request, CallerCancelled(why))

    def caller_exited(self, index: int, generation: int) -> None:
        """A worker exited: the streams its calls still hold are cancelled."""
        identity = wire.call_identity(index, generation)
        for caller, call_id in [key for key in self.running if key[0] == identity]:
            self.cancel(caller, call_id, "its caller's lane exited")

    async def serve(
        self,
        identity: bytes,
        call: Call,
        api: InferCall,
        parse: Callable[..., InferRequest],
        size: int,
        send: Callable[[CallReply, bytes], bool],
    ) -> int:
        """Run the call's stream, each response sent as it comes; the status it ended with."""
        plane = self.plane
        ended = False  # the final CALL_REPLY is sent

        def streamed(request: InferRequest, outputs: dict[str, Any] | None, error: GatewayError | None) -> None:
            nonlocal ended
            ended = request.response_final
            reply, payload = CallReply(call.call_id, 500, final=ended), b""
            if error is not None:
                reply = CallReply(call.call_id, status_of(error), str(error), final=ended)
            else:
                try:
                    payload, json_length = encode_response(request, outputs or {})
                    reply = CallReply(call.call_id, 200, header_length=json_length or len(payload), final=ended)
                except Exception as exc:  # noqa: BLE001 - (runs inside the dispatcher's reply handling: never raise there)
                    reply = CallReply(call.call_id, 500, f"{type(exc).__name__}: {exc}", final=ended)
            if not send(reply, payload):  # the caller is gone
                self.cancel(identity, call.call_id, "its caller is gone")

        self.running[identity, call.call_id] = api
        try:
            await plane.run(api, parse, size, None, streamed)
            final = CallReply(call.call_id, 200)
        except GatewayError as exc:
            final = CallReply(call.call_id, plane.failed(api, exc), str(exc))
        finally:
            del self.running[identity, call.call_id]
        if not ended:
            send(final, b"")
        return final.status
