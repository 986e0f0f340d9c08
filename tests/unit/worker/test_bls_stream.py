"""worker/python/bls_stream.py and the output conversion: BLS to a decoupled model, as Triton's bls_decoupled example uses it."""
from __future__ import annotations

import threading

import numpy as np

from ringserve.common.repository.config import ModelConfig, TensorConfig
from ringserve.worker.python import pb_utils
from ringserve.worker.python.bls_stream import ResponseIterator
from ringserve.worker.requests import exactly_as_declared


def test_responses_sent_from_the_models_thread_arrive_in_order_and_a_lone_final_flag_ends_them_empty() -> None:
    responses = ResponseIterator(timeout_us=0)
    sender = pb_utils.InferenceResponseSender(responses.put)

    def send() -> None:
        for k in range(3):
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([k], np.int32))]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)

    threading.Thread(target=send).start()
    got = list(responses)

    assert [r.output_tensors()[0].as_numpy().tolist() for r in got[:3]] == [[0], [1], [2]]
    assert len(got) == 4 and got[3].output_tensors() == [] and not got[3].has_error()


def test_a_stream_whose_next_response_does_not_come_within_the_timeout_ends_with_an_error() -> None:
    responses = ResponseIterator(timeout_us=20_000)

    (only,) = list(responses)

    assert only.has_error() and "timeout" in only.error().message()


def test_cancel_tells_the_models_sender_and_ends_the_iterator_with_a_cancelled_error() -> None:
    responses = ResponseIterator(timeout_us=0)
    sender = pb_utils.InferenceResponseSender(responses.put, lambda: responses.cancelled)
    sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([0], np.int32))]))

    first = next(responses)
    responses.cancel()
    rest = list(responses)

    assert first.output_tensors()[0].as_numpy().tolist() == [0] and sender.is_cancelled()
    assert len(rest) == 1 and rest[0].error().code() == pb_utils.TritonError.CANCELLED


def test_an_output_converts_to_its_declared_dtype_only_when_every_value_stays_the_same() -> None:
    config = ModelConfig(name="m", max_batch_size=0, inputs=(TensorConfig("IN", "INT32", (1,)),),
                         outputs=(TensorConfig("SUM", "INT32", (1,)),), dynamic_batching=None, version=1,
                         model_path="/m/1/model.py", platform="", extra={"backend": "python"})

    exact = exactly_as_declared(config, "SUM", np.array([16], np.int64))
    too_big = np.array([2**40], np.int64)

    assert exact.dtype == np.int32 and exact.tolist() == [16]
    assert exactly_as_declared(config, "SUM", too_big) is too_big
