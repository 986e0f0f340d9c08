"""worker/python/decoupled.py: a decoupled batch's stream and the courier's cancellation flags, on a real segment,
with the courier's thread not started (what it would send is read from its queue)."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import zmq

from ringserve.common import messages
from ringserve.common.repository.config import ModelConfig, TensorConfig
from ringserve.worker.python import pb_utils
from ringserve.worker.python.decoupled import Channel, Courier, Stream

MODEL = SimpleNamespace(config=ModelConfig(
    name="streams", max_batch_size=0, inputs=(TensorConfig("N", "INT32", (1,)),),
    outputs=(TensorConfig("I", "INT32", (1,)),), dynamic_batching=None, version=1,
    model_path="/models/streams/1/model.py", platform="",
    extra={"backend": "python", "model_transaction_policy": {"decoupled": True}}))
FINAL = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL


@pytest.fixture
def courier():
    context = zmq.Context()
    try:
        yield Courier(context, [], index=0, generation=1)
    finally:
        context.term()


def batch(segment, batch_id: int = 1, requests: int = 2) -> messages.Batch:
    return messages.Batch(batch_id, "streams", 1, 0, 0, segment.generation(0), [], 0,
                          requests=tuple(messages.RequestInfo(rows=1) for _ in range(requests)))


def posted(courier: Courier) -> list[messages.Message]:
    found = []
    while not courier._posted.empty():
        _, frames, _ = courier._posted.get_nowait()
        found.append(messages.decode(frames))
    return found


def response(i: int) -> pb_utils.InferenceResponse:
    return pb_utils.InferenceResponse([pb_utils.Tensor("I", np.array([i], np.int32))])


def test_a_cancelled_requests_later_sends_are_dropped_and_result_follows_the_others_final(segment, courier):
    stream = Stream(MODEL, segment, batch(segment), Channel(courier, 0))
    first, second = stream.sender(0), stream.sender(1)
    first.send(response(0))

    courier.cancel(0, messages.Cancel(1, 0, [0]))
    assert first.is_cancelled() and not second.is_cancelled()
    first.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("cancelled", 7)), flags=FINAL)  # dropped
    second.send(flags=FINAL)
    assert [type(m).__name__ for m in posted(courier)] == ["StreamResponse", "StreamResponse"]

    stream.returned(0.01)  # execute returned: every request is final or cancelled
    (result,) = posted(courier)
    assert isinstance(result, messages.Result)
    assert result.answers == [[[], "the request was cancelled", 499], [[], None, 0]]
    assert segment.output_generation(0) == segment.generation(0)  # the gateway reads a vouched slot


def test_a_cancel_that_comes_before_its_batch_runs_is_applied_when_it_runs(segment, courier):
    courier.cancel(0, messages.Cancel(7, 0, [1]))

    watch = courier.watch(0, batch(segment, batch_id=7))
    assert list(watch.cancelled) == [0, 1]


def test_once_its_gateway_is_gone_a_stream_writes_and_sends_nothing(segment, courier):
    stream = Stream(MODEL, segment, batch(segment, requests=1), Channel(courier, 0))

    courier.drop_gateway(0)
    stream.sender(0).send(response(0))
    stream.returned(0.01)
    assert stream.sender(0).is_cancelled() and posted(courier) == []
