"""worker/calls.py: the KServe v2 binary form a lane's BLS call travels in, read back as the gateway's parser
and encoder read and write it; a stream call's several replies, its cancel, and an abandoned stream's replies."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import orjson
import pytest
import zmq

from ringserve.common import messages, wire
from ringserve.common.repository.config import ModelConfig
from ringserve.gateway.codec.encode import encode_response
from ringserve.gateway.codec.parse import parse_infer_request
from ringserve.gateway.core.request import InferRequest
from ringserve.worker.calls import GatewayCalls, decode_response, encode_request

CONFIG = ModelConfig.from_json(
    "m",
    {
        "max_batch_size": 4,
        "input": [
            {"name": "x", "data_type": "TYPE_FP32", "dims": [3]},
            {"name": "s", "data_type": "TYPE_STRING", "dims": [1]},
        ],
        "output": [
            {"name": "y", "data_type": "TYPE_FP32", "dims": [3]},
            {"name": "t", "data_type": "TYPE_STRING", "dims": [1]},
        ],
    },
    version=1,
    model_path="/m/1/model.onnx",
)


def parsed(body: bytes, header_length: int) -> InferRequest:
    loop = asyncio.new_event_loop()
    try:
        return parse_infer_request(
            CONFIG,
            body,
            capacity_bytes=1 << 20,
            future=loop.create_future(),
            allow_faults=False,
            header_length=str(header_length),
        )
    finally:
        loop.close()


def test_a_calls_tensors_reach_the_gateway_as_a_binary_request_with_every_output_binary() -> None:
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    s = np.array([[b"a"], [b"\xff"]], dtype=object)
    body, header_length = encode_request({"x": x, "s": s}, ["y"], {"k": 1}, "id-1")

    request = parsed(body, header_length)

    np.testing.assert_array_equal(request.inputs["x"], x)
    assert request.inputs["s"].tolist() == s.tolist()
    assert request.requested_outputs == ["y"] and request.binary_outputs == {"y"}
    assert request.kserve_id == "id-1" and request.parameters == {"k": 1}


def test_without_named_outputs_every_output_comes_back_binary_and_decodes_as_it_went() -> None:
    x = np.ones((1, 3), np.float32)
    body, header_length = encode_request({"x": x, "s": np.array([[b"z"]], dtype=object)}, [], None, None)
    request = parsed(body, header_length)
    y, t = np.full((1, 3), 2.5, np.float32), np.array([[b"ok"]], dtype=object)

    payload, json_length = encode_response(request, {"y": y, "t": t})
    outputs = decode_response(payload, json_length)

    assert json_length is not None and orjson.loads(payload[:json_length])["outputs"][0]["parameters"]
    np.testing.assert_array_equal(outputs["y"], y)
    assert outputs["t"].tolist() == [[b"ok"]]


@pytest.fixture
def gateway_and_calls(tmp_path: Path):
    """A ROUTER where a gateway's would be, and a worker's GatewayCalls connected to it."""
    context = zmq.Context()
    router = context.socket(zmq.ROUTER)
    endpoint = f"ipc://{tmp_path}/dispatch.sock"
    router.bind(endpoint)
    calls = GatewayCalls(context, [endpoint], index=3, generation=1, timeout_s=5.0)
    try:
        yield router, calls
    finally:
        calls.close()
        router.close(linger=0)
        context.term()


def reply(router: zmq.Socket, reply: messages.CallReply, body: bytes = b"") -> None:
    router.send_multipart([wire.call_identity(3, 1), *reply.encode(), body])


def test_a_stream_calls_replies_are_read_in_order_beside_another_calls(gateway_and_calls) -> None:
    router, calls = gateway_and_calls
    stream_id, deadline = calls.send("ticker", -1, b"{}", 2, stream=True)
    other_id, _ = calls.send("mlp", -1, b"{}", 2)
    frames = [router.recv_multipart() for _ in range(2)]
    assert [messages.decode(f[1:4]).stream for f in frames] == [True, False]

    reply(router, messages.CallReply(stream_id, 200, header_length=2, final=False), b"r0")
    reply(router, messages.CallReply(other_id, 200, header_length=2), b"u0")
    reply(router, messages.CallReply(stream_id, 504, "late", final=False))
    reply(router, messages.CallReply(stream_id, 200))

    got = [calls.wait(stream_id, deadline) for _ in range(3)]
    assert [(r.status, r.final, body) for r, body in got] == [(200, False, b"r0"), (504, False, b""), (200, True, b"")]
    assert calls.wait(other_id, deadline)[1] == b"u0"


def test_a_cancelled_stream_tells_the_gateway_and_an_abandoned_one_drops_its_replies_up_to_its_final(
    gateway_and_calls,
) -> None:
    router, calls = gateway_and_calls
    call_id, deadline = calls.send("ticker", -1, b"{}", 2, stream=True)
    router.recv_multipart()

    calls.cancel(call_id)
    cancel = router.recv_multipart()
    assert messages.decode(cancel[1:4]) == messages.CallCancel(call_id) and cancel[4] == b""

    reply(router, messages.CallReply(call_id, 200, header_length=2, final=False), b"r0")
    calls.abandon(call_id)
    reply(router, messages.CallReply(call_id, 200, header_length=2, final=False), b"r1")
    reply(router, messages.CallReply(call_id, 499, "cancelled"))
    later_id, later_deadline = calls.send("ticker", -1, b"{}", 2, stream=True)
    reply(router, messages.CallReply(later_id, 200))

    assert calls.wait(later_id, later_deadline)[0].final
    assert calls._replies == {} and calls._abandoned == set()  # (nothing kept for the abandoned call)
