"""BYTES (string) tensors through the real stack: batched in the ring, answered as ONNX Runtime answers.

The `textops` model (tests/support/protocol_models.py) takes text [b, 2] BYTES and scale [b, 1] FP32 and
answers shout = text + "!" (BYTES), is_empty = text == "" (BOOL) and doubled = 2 * scale (FP32).
Slots are 1 MiB here, so that a request too large for one is cheap to build.
"""
from __future__ import annotations

import asyncio
import json
import random
import struct

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from ringserve.common.wire import deserialize_bytes_tensor

from tests.support.protocol_models import textops_model
from tests.support.stack import Stack, running_stack

pytestmark = pytest.mark.integration

MODEL = "textops"
INFER = f"/v2/models/{MODEL}/infer"
SLOT_MB = 1
# Non-ASCII UTF-8 of 2, 3 and 4 bytes per character, an empty string, a NUL, a long one.
DTYPES = {"BYTES": object, "BOOL": bool, "FP32": np.float32}
PIECES = ["", "a", "héllo", "日本語", "✓ ok", "🎉", "a\x00b", "Grüße, мир", "x" * 300]


@pytest.fixture(scope="module")
def textops_stack(tmp_path_factory: pytest.TempPathFactory):
    repo = tmp_path_factory.mktemp("bytes-models")
    path = textops_model(repo)
    with running_stack(repo, "--slot-mb", str(SLOT_MB)) as stack:
        yield stack, path


def bytes_wire(items: list[str]) -> bytes:
    return b"".join(struct.pack("<I", len(b)) + b for b in (s.encode() for s in items))


def request_body(text: list[list[str]], scale: np.ndarray, binary: bool) -> tuple[bytes, dict[str, str]]:
    """JSON strings and JSON outputs, or the binary tensor extension both ways (BOOL stays JSON)."""
    flat = [s for row in text for s in row]
    scale_entry = {"name": "scale", "shape": list(scale.shape), "datatype": "FP32", "data": scale.ravel().tolist()}
    if not binary:
        doc = {"inputs": [{"name": "text", "shape": [len(text), 2], "datatype": "BYTES", "data": flat}, scale_entry]}
        return json.dumps(doc).encode(), {"content-type": "application/json"}
    data = bytes_wire(flat)
    doc = {"inputs": [{"name": "text", "shape": [len(text), 2], "datatype": "BYTES",
                       "parameters": {"binary_data_size": len(data)}}, scale_entry],
           "outputs": [{"name": "shout", "parameters": {"binary_data": True}}, {"name": "is_empty"},
                       {"name": "doubled", "parameters": {"binary_data": True}}]}
    header = json.dumps(doc).encode()
    return header + data, {"inference-header-content-length": str(len(header))}


def answer(response: httpx.Response) -> dict[str, np.ndarray]:
    """The outputs of a JSON or binary response: BYTES as str, the others as numpy."""
    assert response.status_code == 200, response.text
    length = response.headers.get("inference-header-content-length")
    header = json.loads(response.content if length is None else response.content[:int(length)])
    rest = b"" if length is None else response.content[int(length):]
    outputs = {}
    for out in header["outputs"]:
        if "data" in out:
            outputs[out["name"]] = np.asarray(out["data"], DTYPES[out["datatype"]]).reshape(out["shape"])
            continue
        size = out["parameters"]["binary_data_size"]
        chunk, rest = rest[:size], rest[size:]
        if out["datatype"] == "BYTES":
            outputs[out["name"]] = deserialize_bytes_tensor(chunk, tuple(out["shape"]), text=True)
        else:
            outputs[out["name"]] = np.frombuffer(chunk, DTYPES[out["datatype"]]).reshape(out["shape"])
    assert rest == b""
    return outputs


async def post_all(url: str, bodies: list[tuple[bytes, dict[str, str]]], clients: int = 16) -> list[httpx.Response]:
    semaphore = asyncio.Semaphore(clients)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=httpx.Limits(max_connections=clients)) as http:
        async def one(body: bytes, headers: dict[str, str]) -> httpx.Response:
            async with semaphore:
                return await http.post(INFER, content=body, headers=headers)
        return await asyncio.gather(*(one(body, headers) for body, headers in bodies))


def test_concurrent_string_requests_share_batches_and_answer_as_onnx_runtime_does(textops_stack) -> None:
    stack, path = textops_stack
    rng = random.Random(7)
    cases = []
    for i in range(48):
        rows = rng.randint(1, 3)
        text = [[rng.choice(PIECES) + rng.choice(PIECES) for _ in range(2)] for _ in range(rows)]
        scale = np.asarray([[rng.uniform(-5, 5)] for _ in range(rows)], np.float32)
        cases.append((text, scale, i % 2 == 1))
    cases[0] = ([["", ""]], np.zeros((1, 1), np.float32), False)  # every element empty, JSON
    cases[1] = ([["", "é"]], np.ones((1, 1), np.float32), True)  # and binary
    batches_before = stack.metric("ringserve_batch_size_count", model=MODEL)

    bodies = [request_body(text, scale, binary) for text, scale, binary in cases]
    responses = stack.send_while_stopped(lambda: asyncio.run(post_all(stack.url, bodies)))

    alone = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    for (text, scale, binary), response in zip(cases, responses):
        got = answer(response)
        shout, is_empty, doubled = alone.run(None, {"text": np.array(text, dtype=object), "scale": scale})
        assert got["shout"].tolist() == shout.tolist(), (text, binary)
        assert got["is_empty"].tolist() == is_empty.tolist(), (text, binary)
        np.testing.assert_array_equal(got["doubled"], doubled)
    batches = stack.metric("ringserve_batch_size_count", model=MODEL) - batches_before
    assert 0 < batches < len(cases)  # requests shared batches: at least one batch was larger than one request


def test_a_string_input_too_large_for_a_slot_is_a_413_before_any_worker_sees_it(textops_stack) -> None:
    stack, _ = textops_stack
    before = stack.status()["workers"][0]["batches_done"]
    # Two 600 kB strings: 16 bytes as numpy pointers, 1.2 MB serialized; a slot holds 1 MiB.
    body, headers = request_body([["é" * 300_000, "x" * 600_000]], np.ones((1, 1), np.float32), binary=False)

    response = httpx.post(stack.url + INFER, content=body, headers=headers, timeout=60)

    assert response.status_code == 413, response.text
    assert "one batch slot holds" in response.json()["error"]
    assert stack.status()["workers"][0]["batches_done"] == before


def test_string_outputs_that_overflow_the_slot_fail_only_their_request(textops_stack) -> None:
    stack, _ = textops_stack
    big = request_body([["x" * 300_000, "y" * 300_000]], np.ones((1, 1), np.float32), binary=True)
    small = request_body([["ok", ""]], np.ones((1, 1), np.float32), binary=False)

    big_response, small_response = asyncio.run(post_all(stack.url, [big, small]))

    # The inputs fit (600 kB), their outputs (600 kB more) do not: the worker refuses to write them.
    assert big_response.status_code == 400, big_response.text
    assert "outputs need" in big_response.json()["error"]
    assert answer(small_response)["shout"].tolist() == [["ok!", "!"]]


def test_a_binary_string_that_is_not_utf8_is_a_400(textops_stack) -> None:
    stack, _ = textops_stack
    data = struct.pack("<I", 4) + b"caf\xe9" + struct.pack("<I", 0)
    header = json.dumps({"inputs": [
        {"name": "text", "shape": [1, 2], "datatype": "BYTES", "parameters": {"binary_data_size": len(data)}},
        {"name": "scale", "shape": [1, 1], "datatype": "FP32", "data": [1.0]}]}).encode()

    response = httpx.post(stack.url + INFER, content=header + data,
                          headers={"inference-header-content-length": str(len(header))}, timeout=30)

    assert response.status_code == 400
    assert "BYTES element 0 is not UTF-8" in response.json()["error"]


def test_the_model_says_it_takes_and_gives_bytes(textops_stack) -> None:
    stack, _ = textops_stack
    status, meta = stack.get(f"/v2/models/{MODEL}")
    assert status == 200
    assert {t["name"]: t["datatype"] for t in meta["inputs"] + meta["outputs"]} == {
        "text": "BYTES", "scale": "FP32", "shout": "BYTES", "is_empty": "BOOL", "doubled": "FP32"}

