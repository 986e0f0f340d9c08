"""A worker SIGKILLed while streams run: /generate_stream and gRPC streams that had sent responses end with an
error (an `{"error": ...}` event; a response with error_message), never a hang; streams whose model had sent
nothing yet are run again on the next worker and complete; and the requests beside them are all answered."""
from __future__ import annotations

import os
import queue
import signal
import threading
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.support.sse import post_events
from tests.support.stack import Stack, free_port, poll_for
from tests.support.stream_models import build_labelled, build_tokens

pytestmark = pytest.mark.chaos


def started_ids(repo: Path) -> list[str]:
    log = repo / "tokens" / "started.log"
    return log.read_text().split() if log.exists() else []


class GrpcStream:
    """One tritonclient stream of `tokens` requests (empty final responses on); its answers in a queue."""

    def __init__(self, stack: Stack, port: int) -> None:
        self.answers: queue.Queue = queue.Queue()
        self.client = grpcclient.InferenceServerClient(f"127.0.0.1:{port}")
        self.client.start_stream(callback=lambda result, error: self.answers.put((result, error)))

    def send(self, rid: str, n: int, **params: object) -> None:
        tensor = grpcclient.InferInput("N", [1], "INT32")
        tensor.set_data_from_numpy(np.array([n], np.int32))
        self.client.async_stream_infer("tokens", [tensor], request_id=rid, parameters=params,
                                       enable_empty_final_response=True)

    def read(self, requests: int, timeout_s: float = 60) -> tuple[dict[str, list[str]], list[str]]:
        """Until each of `requests` requests ended (its final flag, or an error): texts by id, and errors."""
        texts: dict[str, list[str]] = {}
        errors: list[str] = []
        ended = 0
        while ended < requests:
            result, error = self.answers.get(timeout=timeout_s)
            if error is not None:
                errors.append(str(error))
                ended += 1
                continue
            response = result.get_response()
            if response.outputs:
                texts.setdefault(response.id, []).append(result.as_numpy("TEXT")[0].decode())
            ended += response.parameters["triton_final_response"].bool_param
        return texts, errors

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


def test_a_worker_killed_during_streams_ends_the_sent_ones_with_an_error_and_replays_the_unsent(
    start_stack, tmp_path: Path
) -> None:
    repo = tmp_path / "models"
    build_tokens(repo)
    build_labelled(repo)
    grpc_port = free_port()
    stack = start_stack(repo, "--grpc-port", str(grpc_port), "--slot-count", "16", "--hold-when-unavailable-s", "30")
    path = "/v2/models/tokens/generate_stream"
    results: dict[str, tuple] = {}
    first_events = threading.Semaphore(0)

    def http_stream(rid: str, body: dict) -> None:
        results[rid] = post_events(stack.port, path, {"id": rid, **body}, seen=lambda event: first_events.release())

    # Streams under way: 40 tokens, one each 0.1 s. Streams not yet answered: their first token after 3 s.
    sending = [threading.Thread(target=http_stream, args=(f"sent{k}", {"N": 40, "parameters": {"delay_s": 0.1}}))
               for k in range(3)]
    waiting = [threading.Thread(target=http_stream, args=(f"unsent{k}", {"N": 3, "parameters": {"first_delay_s": 3}}))
               for k in range(2)]
    grpc_sent, grpc_unsent = GrpcStream(stack, grpc_port), GrpcStream(stack, grpc_port)
    answered: list[tuple[float, object]] = []
    pumping = threading.Event()

    def pump() -> None:  # requests beside the streams, before, during and after the kill
        k = 0
        while not pumping.is_set():
            x = float(k)
            status, doc = stack.post("/v2/models/labelled/infer",
                                     {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, 1], "data": [x]}]})
            answered.append((x, doc["outputs"][0]["data"][0] if status == 200 else (status, doc)))
            k += 1

    pumper = threading.Thread(target=pump)
    try:
        pumper.start()
        for thread in sending:
            thread.start()
        grpc_sent.send("grpc-sent0", 40, delay_s=0.1)
        grpc_sent.send("grpc-sent1", 40, delay_s=0.1)
        for _ in sending:  # every HTTP stream under way has had an event
            assert first_events.acquire(timeout=30)
        for thread in waiting:
            thread.start()
        grpc_unsent.send("grpc-unsent0", 3, first_delay_s=3)
        unsent = {"unsent0", "unsent1", "grpc-unsent0"}
        poll_for(lambda: unsent <= set(started_ids(repo)), 30, what="the unsent streams to run in the worker")
        lane = stack.lane("tokens")  # (each model has its own lane: labelled's requests are served by another)
        pid = stack.worker_pid(lane)
        os.kill(pid, signal.SIGKILL)

        for thread in sending + waiting:
            thread.join(timeout=90)
            assert not thread.is_alive(), "a /generate_stream never ended"
        sent_texts, sent_errors = grpc_sent.read(2)
        unsent_texts, unsent_errors = grpc_unsent.read(1)
    finally:
        pumping.set()
        pumper.join(timeout=60)
        grpc_sent.close()
        grpc_unsent.close()

    for k in range(3):  # sent before the kill: those events, then the error, and 200 as the stream began
        status, _, events = results[f"sent{k}"]
        texts = [event.get("TEXT") for _, event in events[:-1]]
        assert status == 200 and 1 <= len(texts) < 40 and texts == [f"tok{i}" for i in range(len(texts))]
        assert "the inference worker died" in events[-1][1]["error"]
    for k in range(2):  # nothing sent before the kill: run again on the next worker, whole
        status, _, events = results[f"unsent{k}"]
        assert status == 200 and [event for _, event in events if "error" in event] == []
        assert [event["TEXT"] for _, event in events] == ["tok0", "tok1", "tok2"]
    assert len(sent_errors) == 2 and all("the inference worker died" in error for error in sent_errors)
    assert all(1 <= len(texts) < 40 for texts in sent_texts.values())
    assert unsent_errors == [] and unsent_texts == {"grpc-unsent0": ["tok0", "tok1", "tok2"]}
    assert sorted(started_ids(repo).count(rid) for rid in unsent) == [2, 2, 2]  # each ran twice: the replay
    # Every request beside the streams was answered, and right.
    assert answered and [(x, y) for x, y in answered if y != x] == []
    assert stack.worker_pid(lane) != pid
