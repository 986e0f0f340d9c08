"""One gRPC ModelStreamInfer served: its window (requests read and not yet answered back), its answers in
order, and the reading that serves each request as it arrives (serve_stream).

A stream is read only while its window has room (--grpc-stream-max-in-flight): the core reads a
stream's messages ahead while it has credit (gateway/grpc/core_call.py: RequestStream), and an answer gives its
request's credit back once grpcio has sent it, which waits for the client's HTTP/2 flow-control window.
So a client that writes and never reads its answers is held back by flow control after that many
requests, where it used to have the gateway queue every request it could write (20,000 in 30 s,
+345 MiB). gateway/grpc/server.py: ModelStreamInfer says why back-pressure rather than refusals.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import Gauge
from tritonclient.grpc import service_pb2 as pb

from ringserve.gateway.core.errors import BadRequest, GatewayError
from ringserve.gateway.core.request import InferRequest
from ringserve.gateway.grpc.codec import ReceivedInfer, infer_response
from ringserve.gateway.grpc.connections import ConnectionLedger
from ringserve.gateway.grpc.context import CallContext, RequestMessages

MODEL_STREAM_INFER_PATH = "/inference.GRPCInferenceService/ModelStreamInfer"  # (the access log's path)
# The servicer's one request through the data plane (gateway/grpc/server.py: InferenceService.infer).
InferOne = Callable[..., Awaitable[pb.ModelInferResponse | None]]

# Triton's stream_infer_handler.cc: every response on a stream says whether it is its request's last, and a
# request that asks for it gets an empty response for a final flag that came alone (a decoupled model's
# sender.send(flags=FINAL) with no response), so that a client can tell the end without a timeout.
FINAL_RESPONSE = "triton_final_response"
ENABLE_EMPTY_FINAL = "triton_enable_empty_final_response"


class StreamWindow:
    """One stream's requests read and not yet answered back: at most `cap`, counted in the gauge
    ringserve_grpc_stream_requests_in_flight (every stream of the gateway together)."""

    def __init__(self, requests: RequestMessages, cap: int, gauge: Gauge) -> None:
        self.requests = requests
        self.gauge = gauge
        self.held = 0
        self.closed = False
        self.lock = threading.Lock()  # (answered_back runs on the poller thread: gateway/grpc/core.py)
        requests.open_window(cap)

    def read_one(self) -> None:
        """A request was read."""
        with self.lock:
            self.held += 1
        self.gauge.inc()

    def answered_back(self, events: list | None = None) -> None:
        """A request's last answer was sent: its room goes to the next request (on the loop, or on the
        poller thread with its events: RequestMessages.grant)."""
        with self.lock:
            if self.closed:  # (a request that ended after its stream did)
                return
            self.held -= 1
        self.gauge.dec()
        self.requests.grant(1, events)

    def close(self) -> None:
        """The stream is over: what it still held (answers never sent, the client gone) is let go."""
        with self.lock:
            held, self.held, self.closed = self.held, 0, True
        self.gauge.dec(held)


class AnswersInOrder:
    """A stream's requests answered in the order they were read, as Triton's stream handler writes a
    non-decoupled model's responses (its QA checks it: SequenceBatcherPreserveOrderingTest); a decoupled
    model's responses still go as they come, and only its request's end takes its turn here."""

    def __init__(self, send: Callable[[Any, bool], None]) -> None:
        self.send = send
        self.read = 0  # tickets handed out
        self.sent = 0  # the next ticket to answer
        self.finished: dict[int, Any] = {}  # ticket -> its last answer (None: none to send), waiting its turn

    def ticket(self) -> int:
        """A request was read: its place in the answers."""
        self.read += 1
        return self.read - 1

    def finish(self, ticket: int, response: Any) -> None:
        """The request's last answer (None: it has none to send): it goes once every earlier one has."""
        self.finished[ticket] = response
        while self.sent in self.finished:
            self.send(self.finished.pop(self.sent), True)
            self.sent += 1


async def serve_stream(
    request_iterator: RequestMessages,
    context: CallContext,
    peer: str,
    window: StreamWindow,
    infer: InferOne,
    connections: ConnectionLedger,
) -> None:
    """Serve one ModelStreamInfer stream (gateway/grpc/server.py: ModelStreamInfer says how): read it within
    its window, each request through `infer` (the servicer's), its answers sent back in order."""

    def answer(response: pb.ModelStreamInferResponse | None, ends_request: bool) -> None:
        """Send an answer (None: none, the request ended with its last streamed one); a request's last
        answer gives its room back once sent (on the poller thread: no loop turn for it)."""
        if response is not None:
            context.send(response, on_poller=window.answered_back if ends_request else None)
        elif ends_request:
            window.answered_back()

    in_order = AnswersInOrder(answer)
    reader = asyncio.get_running_loop().create_task(
        _read_stream(request_iterator, context, peer, window, answer, in_order, infer, connections)
    )
    # A cancelled stream (the client's cancel, or it went away) cancels the requests still running on it: a
    # Python model sees is_cancelled(), and a decoupled stream frees its worker's slot (worker/python/decoupled.py).
    on_cancelled = getattr(context, "on_cancelled", None)  # (CoreCall's; another engine's context may lack it)
    if on_cancelled is not None:
        on_cancelled(reader.cancel)
    try:
        # (an answer that could not be sent: the client went away)
        await asyncio.wait((reader, context.send_failed()), return_when=asyncio.FIRST_COMPLETED)
        if reader.done() and not reader.cancelled():
            reader.result()  # (re-raises what broke the reading)
    finally:
        if on_cancelled is not None:
            on_cancelled(None)  # (the call held the reader: a cycle otherwise)
        reader.cancel()
        window.close()


async def _read_stream(
    requests: RequestMessages,
    context: CallContext,
    peer: str,
    window: StreamWindow,
    answer: Callable[[pb.ModelStreamInferResponse | None, bool], None],
    in_order: AnswersInOrder,
    infer: InferOne,
    connections: ConnectionLedger,
) -> None:
    """Read the stream (as far as its window lets the core read it), serving each request in a task of
    its own; returns once every request read is answered."""
    metadata = context.invocation_metadata()
    running: set[asyncio.Task] = set()

    def failure(received: ReceivedInfer, exc: GatewayError, final: bool = True) -> pb.ModelStreamInferResponse:
        message = received.request
        return marked_final(
            pb.ModelStreamInferResponse(
                error_message=str(exc),
                infer_response=pb.ModelInferResponse(
                    model_name=message.model_name, model_version=message.model_version, id=message.id
                ),
            ),
            final,
        )

    async def serve(received: ReceivedInfer, arrived_ns: int, ticket: int) -> None:
        final_sent = False  # (a final flag that came with a response: no empty final after it)

        def streamed(request: InferRequest, outputs: Any, error: GatewayError | None) -> None:
            # A decoupled model's response, as it comes (worker/python/decoupled.py): it holds the request's room
            # until the request ends.
            nonlocal final_sent
            final_sent = request.response_final
            answer(
                failure(received, error, final_sent)
                if error is not None
                else marked_final(
                    pb.ModelStreamInferResponse(infer_response=infer_response(request, outputs)), final_sent
                ),
                False,
            )

        def respond(response: pb.ModelInferResponse) -> None:  # (inside the request's span, as ModelInfer's)
            in_order.finish(ticket, marked_final(pb.ModelStreamInferResponse(infer_response=response), True))

        try:
            empty_final_wanted = wants_empty_final(received.request)  # (before the charge: a refusal holds none)
            connections.charge(peer, received.nbytes)
        except GatewayError as exc:
            in_order.finish(ticket, failure(received, exc))
            return
        try:
            response = await infer(
                received,
                context.cancelled,
                metadata,
                MODEL_STREAM_INFER_PATH,
                stream=streamed,
                arrived_ns=arrived_ns,
                respond=respond,
            )
        except GatewayError as exc:
            in_order.finish(ticket, failure(received, exc))
            return
        finally:
            connections.release(peer, received.nbytes, calls=0)
        if response is None:  # a decoupled model: its last answer was streamed, this ends the request
            in_order.finish(ticket, empty_final(received.request) if empty_final_wanted and not final_sent else None)

    try:
        async for message in requests:
            window.read_one()
            task = asyncio.get_running_loop().create_task(serve(message, requests.arrived_ns, in_order.ticket()))
            running.add(task)
            task.add_done_callback(running.discard)
        if running:
            await asyncio.gather(*running)
    except asyncio.CancelledError:  # the stream is over: so are its requests
        for task in list(running):
            task.cancel()
        raise


def marked_final(response: pb.ModelStreamInferResponse, final: bool) -> pb.ModelStreamInferResponse:
    """`response` with Triton's triton_final_response parameter set."""
    response.infer_response.parameters[FINAL_RESPONSE].bool_param = final
    return response


def wants_empty_final(request: pb.ModelInferRequest) -> bool:
    """Whether the request set triton_enable_empty_final_response (a bool, as Triton requires)."""
    if ENABLE_EMPTY_FINAL not in request.parameters:
        return False
    param = request.parameters[ENABLE_EMPTY_FINAL]
    if param.WhichOneof("parameter_choice") != "bool_param":
        raise BadRequest(f"invalid value type for '{ENABLE_EMPTY_FINAL}' parameter, expected bool_param.")
    return param.bool_param


def empty_final(request: pb.ModelInferRequest) -> pb.ModelStreamInferResponse:
    """The empty response that carries a final flag which came alone: the request's id, model and version."""
    answer = pb.ModelInferResponse(model_name=request.model_name, model_version=request.model_version, id=request.id)
    return marked_final(pb.ModelStreamInferResponse(infer_response=answer), True)
