"""Cancellation reaches a Python model's is_cancelled(), and a decoupled stream neither holds its worker nor
outlives its deadline: real processes, tritonclient's gRPC stream API and a raw HTTP client."""
from __future__ import annotations

import json
import queue
import socket
import statistics
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.support.python_models import build_cancellable
from tests.support.stack import Stack, free_port, poll_for, running_stack

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    repo = tmp_path_factory.mktemp("cancellation")
    build_cancellable(repo)
    with running_stack(repo, "--grpc-port", str(free_port()), "--workers", "1") as stack:
        stack.grpc_port = int(stack.args[stack.args.index("--grpc-port") + 1])
        yield stack


def cancelled(stack: Stack) -> list[str]:
    """The lines the models wrote on seeing a request cancelled (each in its own folder)."""
    logs = [Path(stack.repo) / model / "cancelled.log" for model in ("until_cancelled", "polls_cancelled")]
    return [line for log in logs if log.exists() for line in log.read_text().splitlines()]


def batches_held(stack: Stack) -> int:
    return sum(w["in_flight_batches"] for w in stack.status()["workers"])


def n_input(n: int, batched: bool = False) -> grpcclient.InferInput:
    array = np.array([[n]] if batched else [n], np.int32)
    tensor = grpcclient.InferInput("N", list(array.shape), "INT32")
    tensor.set_data_from_numpy(array)
    return tensor


def s_doc(request_id: str, wait_s: float) -> dict:
    return {"id": request_id, "inputs": [{"name": "S", "datatype": "FP32", "shape": [1], "data": [wait_s]}]}


class Streamer:
    """One tritonclient gRPC stream; its answers as (arrival time, result or None, error or None)."""

    def __init__(self, stack: Stack) -> None:
        self.client = grpcclient.InferenceServerClient(f"127.0.0.1:{stack.grpc_port}")
        self.answers: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.answers.put((time.time(), result, error)))

    def next(self, timeout_s: float = 10) -> tuple[float, object, InferenceServerException | None]:
        return self.answers.get(timeout=timeout_s)

    def close(self, cancel: bool) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def test_a_never_final_stream_holds_no_worker_and_its_clients_cancel_frees_its_slot(stack: Stack) -> None:
    first, second = Streamer(stack), Streamer(stack)
    try:
        first.client.async_stream_infer("until_cancelled", [n_input(1, batched=True)], request_id="s-1")
        assert first.next()[1].as_numpy("I").tolist() == [[0]]
        # The stream is open, its final flag never sent: the worker still serves another model and the same one.
        started = time.monotonic()
        assert stack.post("/v2/models/polls_cancelled/infer", s_doc("other", 0.0))[0] == 200
        second.client.async_stream_infer("until_cancelled", [n_input(1, batched=True)], request_id="s-2")
        assert second.next()[1].as_numpy("I").tolist() == [[0]]
        print(f"served beside an open stream in {time.monotonic() - started:.3f} s")
        assert batches_held(stack) == 2 and cancelled(stack) == []

        first.close(cancel=True)
        poll_for(lambda: "s-1 True" in cancelled(stack), 10, what="the model to see its request cancelled")
        poll_for(lambda: batches_held(stack) == 1, 10, what="the cancelled stream's slot to be freed")
        second.close(cancel=True)
        poll_for(lambda: batches_held(stack) == 0, 10, what="every slot freed")
        poll_for(lambda: sorted(cancelled(stack)) == ["s-1 True", "s-2 True"], 10, what="both cancellations seen")
    finally:
        for streamer in (first, second):
            streamer.client.close()


def test_a_stream_cancelled_while_its_batch_waits_in_the_worker_is_cancelled_when_it_runs(stack: Stack) -> None:
    """The worker holds the stream's batch behind a running one (pipelining) when its CANCEL comes."""
    with grpcclient.InferenceServerClient(f"127.0.0.1:{stack.grpc_port}") as client:
        tensor = grpcclient.InferInput("S", [1], "FP32")
        tensor.set_data_from_numpy(np.array([1.0], np.float32))
        answers: queue.Queue = queue.Queue()
        client.async_infer("polls_cancelled", [tensor], lambda result, error: answers.put(error))  # runs 1 s
        poll_for(lambda: batches_held(stack) == 1, 10, what="the first request to run")
        streamer = Streamer(stack)
        streamer.client.async_stream_infer("until_cancelled", [n_input(1, batched=True)], request_id="early")
        poll_for(lambda: batches_held(stack) == 2, 10, what="the stream's batch to be sent")
        streamer.close(cancel=True)
        assert answers.get(timeout=10) is None  # the first request ran to its end
    poll_for(lambda: "early True" in cancelled(stack), 10, what="the model to see its request cancelled")
    poll_for(lambda: batches_held(stack) == 0, 10, what="the stream's slot to be freed")


def test_a_stream_past_its_timeout_ends_with_an_error_and_its_model_sees_it_cancelled(stack: Stack) -> None:
    streamer = Streamer(stack)
    try:
        started = time.monotonic()
        # Triton's `timeout` parameter (µs); the model's queue policy lets a request set it.
        streamer.client.async_stream_infer("until_cancelled", [n_input(1, batched=True)], request_id="t-1", timeout=1_500_000)
        assert streamer.next()[1].as_numpy("I").tolist() == [[0]]
        _, result, error = streamer.next(timeout_s=15)
        ended_s = time.monotonic() - started
        print(f"the stream ended after {ended_s:.3f} s (timeout 1.5 s)")
        assert result is None and "not finished within 1.5" in error.message()
        assert 1.4 < ended_s < 6
        poll_for(lambda: "t-1 True" in cancelled(stack), 10, what="the model to see its request cancelled")
        poll_for(lambda: batches_held(stack) == 0, 10, what="the slot to be freed")
    finally:
        streamer.close(cancel=True)


def test_an_http_client_that_disconnects_cancels_its_request_in_the_model(stack: Stack) -> None:
    body = json.dumps(s_doc("http-1", 60.0)).encode()
    client = socket.create_connection(("127.0.0.1", stack.port))
    try:
        client.sendall(b"POST /v2/models/polls_cancelled/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                       + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        poll_for(lambda: batches_held(stack) == 1, 10, what="the request to run")
    finally:
        client.close()
    poll_for(lambda: "http-1" in cancelled(stack), 10, what="the model to see its request cancelled")
    poll_for(lambda: batches_held(stack) == 0, 10, what="the batch to end")
    assert stack.post("/v2/models/polls_cancelled/infer", s_doc("after", 0.0))[0] == 200


def test_a_cancelled_grpc_call_cancels_its_request_in_the_model(stack: Stack) -> None:
    tensor = grpcclient.InferInput("S", [1], "FP32")
    tensor.set_data_from_numpy(np.array([60.0], np.float32))
    answers: queue.Queue = queue.Queue()
    with grpcclient.InferenceServerClient(f"127.0.0.1:{stack.grpc_port}") as client:
        call = client.async_infer("polls_cancelled", [tensor], lambda result, error: answers.put(error),
                                  request_id="grpc-1")
        poll_for(lambda: batches_held(stack) == 1, 10, what="the request to run")
        call.cancel()
        poll_for(lambda: "grpc-1" in cancelled(stack), 10, what="the model to see its request cancelled")
        assert "CANCELLED" in str(answers.get(timeout=10))
    poll_for(lambda: batches_held(stack) == 0, 10, what="the batch to end")


def test_responses_sent_from_a_models_thread_leave_as_they_are_sent(stack: Stack) -> None:
    """Each response's delay from the model's send to the client's callback, whether execute returned at
    once or waits for the thread that sends (they used to leave in 50 ms steps, or once execute returned)."""
    delays: dict[str, list[float]] = {}
    for label, n in (("execute returned", 20), ("execute waits", -20)):
        streamer = Streamer(stack)
        try:
            streamer.client.async_stream_infer("paced", [n_input(n)])
            got = []
            while len(got) < abs(n):
                at, result, error = streamer.next()
                assert error is None
                got.append(at - float(result.as_numpy("T")[0]))
            delays[label] = got
        finally:
            streamer.close(cancel=False)
    for label, got in delays.items():
        print(f"{label}: send -> client median {statistics.median(got) * 1e3:.1f} ms, max {max(got) * 1e3:.1f} ms")
    assert statistics.median(delays["execute returned"]) < 0.015
    assert statistics.median(delays["execute waits"]) < 0.015


def test_a_worker_death_while_a_models_thread_streams_ends_that_stream_after_what_was_sent(stack: Stack) -> None:
    pid = stack.worker_pid()
    streamer = Streamer(stack)
    try:
        streamer.client.async_stream_infer("paced", [n_input(1003)])  # (execute has returned when it dies)
        got = [streamer.next() for _ in range(3)]
    finally:
        streamer.close(cancel=True)
    assert [int(result.as_numpy("I")[0]) for _, result, _ in got[:2]] == [0, 1]  # sent once, not again
    error = got[2][2]
    assert got[2][1] is None and "died (SIGSEGV) after 2 response(s)" in error.message()
    poll_for(lambda: stack.status()["ready"] and stack.worker_pid() != pid, 30, what="a new worker")
    poll_for(lambda: batches_held(stack) == 0, 10, what="no batch held")
