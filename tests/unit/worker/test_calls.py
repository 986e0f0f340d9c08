"""worker/calls.py's body: the KServe v2 binary form a lane's BLS call travels in, read back as the gateway's
parser and encoder read and write it."""
from __future__ import annotations

import asyncio

import numpy as np
import orjson

from ringserve.common.repository.config import ModelConfig
from ringserve.gateway.core.request import InferRequest
from ringserve.gateway.codec.encode import encode_response
from ringserve.gateway.codec.parse import parse_infer_request
from ringserve.worker.calls import decode_response, encode_request

CONFIG = ModelConfig.from_json("m", {
    "max_batch_size": 4,
    "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [3]}, {"name": "s", "data_type": "TYPE_STRING",
                                                                      "dims": [1]}],
    "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [3]}, {"name": "t", "data_type": "TYPE_STRING",
                                                                       "dims": [1]}],
}, version=1, model_path="/m/1/model.onnx")


def parsed(body: bytes, header_length: int) -> InferRequest:
    loop = asyncio.new_event_loop()
    try:
        return parse_infer_request(CONFIG, body, capacity_bytes=1 << 20, future=loop.create_future(),
                                   allow_faults=False, header_length=str(header_length))
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
