"""The window of one gRPC ModelStreamInfer: its requests read and not yet answered back.

A stream is read only while its window has room (--grpc-stream-max-in-flight): the core reads a
stream's messages ahead while it has credit (gateway/grpc/core.py: RequestStream), and an answer gives its
request's credit back once grpcio has sent it, which waits for the client's HTTP/2 flow-control window.
So a client that writes and never reads its answers is held back by flow control after that many
requests, where it used to have the gateway queue every request it could write (20,000 in 30 s,
+345 MiB). gateway/grpc/server.py: ModelStreamInfer says why back-pressure rather than refusals.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from prometheus_client import Gauge
from tritonclient.grpc import service_pb2 as pb

from ringserve.gateway.core.errors import BadRequest
from ringserve.gateway.grpc.context import RequestMessages

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
