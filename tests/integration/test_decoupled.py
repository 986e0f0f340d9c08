"""Decoupled Python models over gRPC ModelStreamInfer: each response as the model sends it."""
from __future__ import annotations

import queue
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.support.python_models import build_streamer
from tests.support.stack import Stack, free_port, poll_for, running_stack

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def stream_stack(tmp_path_factory: pytest.TempPathFactory):
    repo = tmp_path_factory.mktemp("decoupled")
    build_streamer(repo)
    with running_stack(repo, "--grpc-port", str(free_port())) as stack:
        stack.grpc_port = int(stack.args[stack.args.index("--grpc-port") + 1])
        yield stack


def stream(stack: Stack, counts: list[int], timeout_s: float = 60) -> list[tuple[float, str, object]]:
    """Send one request per count on one stream; (arrival time, request id, I or the error) of every
    answer until each request has had |count| answers or an error."""
    answers: queue.Queue = queue.Queue()
    wanted = sum(abs(n) for n in counts)
    got: list[tuple[float, str, object]] = []
    with grpcclient.InferenceServerClient(f"127.0.0.1:{stack.grpc_port}") as client:
        client.start_stream(callback=lambda result, error: answers.put((time.monotonic(), result, error)))
        for i, n in enumerate(counts):
            tensor = grpcclient.InferInput("N", [1], "INT32")
            tensor.set_data_from_numpy(np.array([n], np.int32))
            client.async_stream_infer("streamer", [tensor], request_id=str(i))
        deadline = time.monotonic() + timeout_s
        while len([g for g in got if not isinstance(g[2], InferenceServerException)]) < wanted:
            at, result, error = answers.get(timeout=max(0.1, deadline - time.monotonic()))
            if error is not None:
                got.append((at, "", error))
                if len([g for g in got if isinstance(g[2], InferenceServerException)]) == sum(n < 0 for n in counts):
                    break
                continue
            got.append((at, result.get_response().id, int(result.as_numpy("I")[0])))
        client.stop_stream()
    return got


def test_each_response_arrives_as_the_model_sends_it(stream_stack: Stack) -> None:
    got = stream(stream_stack, [3])

    assert [(rid, i) for _, rid, i in got] == [("0", 0), ("0", 1), ("0", 2)]
    # The model sleeps 0.3 s after each send: the first answer came long before the last was sent.
    assert got[2][0] - got[0][0] > 0.45


def test_a_worker_death_mid_stream_ends_that_stream_with_an_error_after_what_was_sent(stream_stack: Stack) -> None:
    pid = stream_stack.worker_pid()

    got = stream(stream_stack, [-3])

    assert [i for _, _, i in got[:2]] == [0, 1]  # sent before the crash, and not sent again
    error = got[2][2]
    assert isinstance(error, InferenceServerException)
    assert "died (SIGSEGV) after 2 response(s)" in error.message() and len(got) == 3
    assert stream_stack.status()["workers"][0]["restarts"] == {"SIGSEGV": 1}
    poll_for(lambda: stream_stack.status()["ready"] and stream_stack.worker_pid() != pid, 30, what="a new worker")
    assert [(rid, i) for _, rid, i in stream(stream_stack, [2])] == [("0", 0), ("0", 1)]


def test_http_and_unary_grpc_refuse_a_decoupled_model_saying_where_it_streams(stream_stack: Stack) -> None:
    status, doc = stream_stack.post("/v2/models/streamer/infer",
                                    {"inputs": [{"name": "N", "datatype": "INT32", "shape": [1], "data": [2]}]})
    assert status == 501 and "decoupled" in doc["error"] and "ModelStreamInfer" in doc["error"]  # Triton's UNSUPPORTED
    with grpcclient.InferenceServerClient(f"127.0.0.1:{stream_stack.grpc_port}") as client:
        tensor = grpcclient.InferInput("N", [1], "INT32")
        tensor.set_data_from_numpy(np.array([2], np.int32))
        with pytest.raises(InferenceServerException) as info:
            client.infer("streamer", [tensor])
    assert info.value.status() == "StatusCode.UNIMPLEMENTED" and "ModelStreamInfer" in info.value.message()
