"""BYTES tensors through the ring: slot form, size rules, batches, splits, and the worker's side.

A BYTES tensor lies in a slot in KServe's binary BYTES form (per element a 4-byte little-endian
length, then the bytes); its TensorRef carries that length as a fifth element on the wire.
"""
from __future__ import annotations

import functools
import itertools
import json
import re
import struct
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnxruntime as ort
import pytest

from ringserve.common import messages
from ringserve.common.errors import ConfigError
from ringserve.common.repository.batching import DynamicBatching, Padding
from ringserve.common.repository.config import ModelConfig, TensorConfig
from ringserve.common.repository.scan import scan_repository
from ringserve.common.wire import (BytesFormatError, BytesTensorRef, NotUtf8, TensorRef, deserialize_bytes_tensor,
                                   serialize_bytes_tensor)
from ringserve.gateway.batching.queues import ModelQueue
from ringserve.gateway.batching.slot_outputs import split_outputs
from ringserve.gateway.batching.slots import SlotBatch, SlotUse, write_batch
from ringserve.gateway.codec.parse import parse_infer_request
from ringserve.gateway.core.request import InferRequest
from ringserve.gateway.core.errors import PayloadTooLarge
from ringserve.shm.layout import ALIGN_BYTES, pack_offsets
from ringserve.shm.ring import Ring
from ringserve.worker.errors import NotText, OutputOverflow
from ringserve.worker.onnx_model import run_on_slot
from ringserve.worker.session import CPU, ModelSession
from ringserve.worker.slots import write_outputs

from tests.support.models import session_settings

from tests.support.protocol_models import textops_model
from .conftest import written_batches

CAPACITY_BYTES = 1 << 20


def wire_form(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(i)) + i for i in items)


def strings_model(max_batch_size: int = 8, **batching) -> ModelConfig:
    """text [b, 2] BYTES and scale [b, 1] FP32 in; shout [b, 2] BYTES and doubled [b, 1] FP32 out."""
    return ModelConfig(
        name="strings", max_batch_size=max_batch_size,
        inputs=(TensorConfig("text", "BYTES", (2,)), TensorConfig("scale", "FP32", (1,))),
        outputs=(TensorConfig("shout", "BYTES", (2,)), TensorConfig("doubled", "FP32", (1,))),
        dynamic_batching=DynamicBatching(**batching) if max_batch_size else None,
        version=1, model_path="/models/strings/1/model.onnx")


def json_body(rows: list[list[str]], scale: float = 1.0) -> bytes:
    return json.dumps({"inputs": [
        {"name": "text", "shape": [len(rows), 2], "datatype": "BYTES", "data": [s for row in rows for s in row]},
        {"name": "scale", "shape": [len(rows), 1], "datatype": "FP32", "data": [scale] * len(rows)}]}).encode()


def binary_body(rows: list[list[bytes]], scale: float = 1.0) -> tuple[bytes, str]:
    text = wire_form(*[s for row in rows for s in row])
    header = json.dumps({"inputs": [
        {"name": "text", "shape": [len(rows), 2], "datatype": "BYTES", "parameters": {"binary_data_size": len(text)}},
        {"name": "scale", "shape": [len(rows), 1], "datatype": "FP32", "data": [scale] * len(rows)}]}).encode()
    return header + text, str(len(header))


def parse(loop, config: ModelConfig, body: bytes, header_length: str | None = None,
          capacity_bytes: int = CAPACITY_BYTES) -> InferRequest:
    return parse_infer_request(config, body, capacity_bytes=capacity_bytes, future=loop.create_future(),
                               allow_faults=False, header_length=header_length)


def text_of(request: InferRequest) -> list[list[str]]:
    return [[s.decode() for s in row] for row in request.inputs["text"].tolist()]


# -- wire: the ref and the slot form ----------------------------------------------------------
def test_a_fixed_size_ref_keeps_four_elements_and_a_bytes_ref_adds_its_length():
    fixed = TensorRef("x", "FP32", (2, 3), 64)
    strings = BytesTensorRef("s", "BYTES", (2, 2), 128, 37)

    assert fixed.to_wire() == ["x", "FP32", [2, 3], 64]
    assert strings.to_wire() == ["s", "BYTES", [2, 2], 128, 37]
    assert type(TensorRef.from_wire(fixed.to_wire())) is TensorRef
    assert TensorRef.from_wire(fixed.to_wire()) == fixed
    assert TensorRef.from_wire(strings.to_wire()) == strings


def test_slot_form_round_trips_empty_non_ascii_and_nul_elements():
    items = ["", "héllo", "日本語 ✓", "a\x00b", "x" * 300]
    data = serialize_bytes_tensor(np.array(items, dtype=np.object_))

    assert data == wire_form(*(s.encode() for s in items))
    assert deserialize_bytes_tensor(data, (5,)).tolist() == [s.encode() for s in items]
    assert deserialize_bytes_tensor(data, (5,), text=True).tolist() == items  # what ORT takes: str
    assert deserialize_bytes_tensor(wire_form(b"a", b"b", b"c", b"d"), (2, 2)).tolist() == [[b"a", b"b"], [b"c", b"d"]]


@pytest.mark.parametrize("data, shape, says", [
    (b"\x02\x00", (1,), "2 bytes cannot hold 1 elements"),  # (a length cut short)
    (wire_form(b"ab"), (2,), "holds 1 elements; its shape needs 2"),  # whole elements, too few: Triton's count
    (struct.pack("<I", 4) + b"ab", (2,), "holds 1 elements; its shape needs 2"),  # (the last one cut: as Triton)
    (wire_form(b"ab") + b"\0" * 3, (2,), "ends inside the length of element 1 of 2"),
    (wire_form(b"abc", b"d") + b"\0" * 3, (3,), "ends inside the length of element 2 of 3"),
    (struct.pack("<I", 9) + b"abc", (1,), "says 9 bytes but only 3 remain"),
    (wire_form(b"a", b"b"), (1,), "holds more than 1 elements; its shape needs 1"),
    (wire_form(b"a") + b"\0" * 3, (1,), "3 bytes after its 1 elements"),
])
def test_slot_data_that_does_not_hold_the_shape_is_refused(data, shape, says):
    with pytest.raises(BytesFormatError, match=says):
        deserialize_bytes_tensor(data, shape)


def test_decoding_for_the_model_is_strict_utf8_and_names_the_element():
    with pytest.raises(NotUtf8, match=r"BYTES element 1 is not UTF-8 \(invalid start byte at byte 0\)"):
        deserialize_bytes_tensor(wire_form(b"ok", b"\xff"), (2,), text=True)


# -- codec: the slot form and the 413 rule ----------------------------------------------------
def test_json_and_binary_bytes_inputs_carry_the_same_slot_form(loop):
    config = strings_model()
    rows = [["héllo", ""], ["日本", "a\x00b"]]

    from_json = parse(loop, config, json_body(rows))
    from_binary = parse(loop, config, *binary_body([[s.encode() for s in row] for row in rows]))

    expected = wire_form(*(s.encode() for row in rows for s in row))
    assert from_json.serialized == {"text": expected}
    assert bytes(from_binary.serialized["text"]) == expected
    assert text_of(from_json) == text_of(from_binary) == rows


def test_models_without_bytes_inputs_carry_no_slot_form(loop):
    config = ModelConfig(name="m", max_batch_size=4, inputs=(TensorConfig("x", "FP32", (2,)),),
                         outputs=(TensorConfig("s", "BYTES", (1,)),), dynamic_batching=DynamicBatching(),
                         version=1, model_path="/m")
    body = json.dumps({"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]}).encode()

    assert parse(loop, config, body).serialized is None


def test_the_413_rule_counts_serialized_bytes_not_pointers(loop):
    config = strings_model()
    text = "x" * 3000  # 2 elements: 16 bytes of pointers, 6008 bytes serialized
    slack = ALIGN_BYTES * 4
    needed = slack + config.fixed_row_bytes + 2 * (4 + 3000) + 4  # + one FP32 scale

    request = parse(loop, config, json_body([[text, text]]), capacity_bytes=needed)
    assert len(request.serialized["text"]) == 6008
    with pytest.raises(PayloadTooLarge, match=f"request needs {needed} bytes of tensor space"):
        parse(loop, config, json_body([[text, text]]), capacity_bytes=needed - 1)


# -- batcher: size rules, writes, splits --------------------------------------------------------
def test_max_rows_uses_the_serialized_size_of_the_sample(loop):
    config = strings_model(max_batch_size=64)
    sample = parse(loop, config, json_body([["x" * 96, "y" * 96]]))  # 200 bytes of text per row
    row_bytes = config.fixed_row_bytes + 200 + 4
    capacity = 10 * row_bytes + ALIGN_BYTES * 4

    assert ModelQueue(config, capacity).max_rows(sample) == 10  # 8-byte pointers would allow 56


def test_a_batch_never_takes_more_bytes_than_the_slot_holds(loop, segment):
    config = strings_model(max_batch_size=8)
    short = [parse(loop, config, json_body([["a", "b"]], scale=i)) for i in range(2)]
    long = [parse(loop, config, json_body([["x" * 2000, "y" * 2000]], scale=10 + i)) for i in range(3)]
    queue = ModelQueue(config, segment.data_capacity)
    for request in short + long:  # max_rows, from the short head, would allow all five
        queue.submit(request)

    batches = []
    for batch, _, _, output_offset in written_batches(queue, segment):
        assert output_offset + sum(r.rows for r in batch) * config.fixed_row_bytes <= segment.data_capacity
        batches.append(batch)

    assert [len(b) for b in batches] == [3, 1, 1]  # a long request's 4 KB fill half the 8 KB slot
    assert [r for b in batches for r in b] == short + long


def test_write_batch_concatenates_each_requests_serialized_rows_in_order(loop, segment):
    config = strings_model()
    reqs = [parse(loop, config, json_body([["a", "héllo"]], scale=1)),
            parse(loop, config, json_body([["", "日本"], ["b", "c" * 70]], scale=2)),
            parse(loop, config, *binary_body([[b"last", b"\x00"]], scale=3))]
    lease = Ring(segment).acquire()

    refs, output_offset = write_batch(segment, lease, reqs)

    text, scale = refs
    expected = b"".join(bytes(r.serialized["text"]) for r in reqs)
    assert isinstance(text, BytesTensorRef) and type(scale) is TensorRef
    assert (text.shape, text.offset, text.nbytes) == ((4, 2), 0, len(expected))
    assert bytes(segment.tensor(lease.index, 0, np.uint8, (text.nbytes,))) == expected
    assert scale.offset == -(-len(expected) // ALIGN_BYTES) * ALIGN_BYTES  # right after, aligned
    assert segment.tensor(lease.index, scale.offset, np.float32, (4, 1)).ravel().tolist() == [1, 2, 2, 3]
    assert output_offset >= scale.offset + 16 and output_offset % ALIGN_BYTES == 0
    assert TensorRef.from_wire(text.to_wire()) == text


def test_an_unbatched_bytes_model_writes_its_tensor_as_sent(loop, segment):
    config = strings_model(max_batch_size=0)
    body = json.dumps({"inputs": [
        {"name": "text", "shape": [2], "datatype": "BYTES", "data": ["ü", ""]},
        {"name": "scale", "shape": [1], "datatype": "FP32", "data": [4]}]}).encode()
    request = parse(loop, config, body)

    (text, _), _ = write_batch(segment, Ring(segment).acquire(), [request])

    assert (text.shape, text.nbytes) == ((2,), len(wire_form("ü".encode(), b"")))


def test_split_halves_point_at_their_own_requests_serialized_rows(loop, segment):
    config = strings_model()
    rows = [[["r0", "é"]], [["r1a", ""], ["r1b", "x" * 40]], [["r2", "日本"]], [["r3", "z"]]]
    reqs = [parse(loop, config, json_body(r, scale=i)) for i, r in enumerate(rows)]
    lease = Ring(segment).acquire()
    refs, output_offset = write_batch(segment, lease, reqs)
    batch = SlotBatch(1, config, reqs, SlotUse(lease), refs, output_offset)
    ids = itertools.count(2)

    first, second = batch.split(ids)
    third, fourth = second.split(ids)

    for half, expected in ((first, rows[0] + rows[1]), (third, rows[2]), (fourth, rows[3])):
        text, scale = half.inputs
        slot_text = deserialize_bytes_tensor(segment.tensor(lease.index, text.offset, np.uint8, (text.nbytes,)),
                                             text.shape, text=True)
        assert slot_text.tolist() == expected
        assert scale.shape == (len(expected), 1)


def write_output_strings(segment, lease, start: int, shout: np.ndarray, doubled: np.ndarray) -> list[TensorRef]:
    """What a worker does with its outputs (worker/slots.py: write_outputs), by hand."""
    data = serialize_bytes_tensor(shout)
    (shout_at, doubled_at), _ = pack_offsets([len(data), doubled.nbytes], start)
    segment.tensor(lease.index, shout_at, np.uint8, (len(data),))[:] = np.frombuffer(data, np.uint8)
    segment.tensor(lease.index, doubled_at, np.float32, doubled.shape)[:] = doubled
    return [BytesTensorRef("shout", "BYTES", shout.shape, shout_at, len(data)),
            TensorRef("doubled", "FP32", doubled.shape, doubled_at)]


def test_split_outputs_gives_each_request_its_rows_of_a_bytes_output(loop, segment):
    config = strings_model()
    rows = [[["a", "é"]], [["", "日本"], ["b", "c"]], [["d", "e"]]]
    reqs = [parse(loop, config, json_body(r, scale=i)) for i, r in enumerate(rows)]
    lease = Ring(segment).acquire()
    refs, output_offset = write_batch(segment, lease, reqs)
    batch = SlotBatch(1, config, reqs, SlotUse(lease), refs, output_offset)
    shout = np.array([[s + "!" for s in row] for r in rows for row in r], dtype=np.object_)
    doubled = np.array([[0], [2], [2], [4]], np.float32)

    per_request = split_outputs(segment, batch, write_output_strings(segment, lease, output_offset, shout, doubled))

    assert [[[s.decode() for s in row] for row in result["shout"].tolist()] for result in per_request] == [
        [["a!", "é!"]], [["!", "日本!"], ["b!", "c!"]], [["d!", "e!"]]]
    assert [result["doubled"].ravel().tolist() for result in per_request] == [[0], [2, 2], [4]]


# -- the worker's side, with ONNX Runtime ------------------------------------------------------
@pytest.fixture(scope="module")
def textops(tmp_path_factory: pytest.TempPathFactory) -> tuple[ModelConfig, Path]:
    repo = tmp_path_factory.mktemp("textops")
    path = textops_model(repo)
    (config,) = scan_repository(repo).all_versions()
    return config, path


def worker_on(segment) -> SimpleNamespace:
    """The batch path of a worker (onnx_model.run_on_slot, slots.write_outputs) on one segment."""
    return SimpleNamespace(_run=functools.partial(run_on_slot, segment),
                           write_outputs=functools.partial(write_outputs, segment))


def test_strings_go_through_the_slot_to_onnx_runtime_and_back_as_it_answers_alone(loop, segment, textops):
    config, path = textops
    rows = [[["héllo", ""]], [["日本語 ✓", "a\x00b"], ["", ""]], [["plain", "x" * 100]]]
    reqs = [parse(loop, config, json_body(r, scale=i + 0.5)) for i, r in enumerate(rows)]
    lease = Ring(segment).acquire()
    refs, output_offset = write_batch(segment, lease, reqs)
    session = ModelSession(config, session_settings(), [CPU])
    sent = messages.Batch(batch_id=1, model=config.name, version=config.version, attempt=0, slot_index=lease.index,
                          generation=lease.generation, inputs=[ref.to_wire() for ref in refs],
                          output_offset=output_offset)

    outputs, _ = worker_on(segment)._run(session, sent)

    batch = SlotBatch(1, config, reqs, SlotUse(lease), refs, output_offset)
    alone = ort.InferenceSession(str(path), providers=[CPU])
    for request, rows_sent, result in zip(reqs, rows, split_outputs(segment, batch, [TensorRef.from_wire(o) for o in outputs])):
        shout, is_empty, doubled = alone.run(None, {"text": np.array(rows_sent, dtype=np.object_),
                                                    "scale": request.inputs["scale"]})
        assert [[s.decode() for s in row] for row in result["shout"].tolist()] == shout.tolist()
        assert np.array_equal(result["is_empty"], is_empty)
        assert np.array_equal(result["doubled"], doubled)
    assert segment.output_generation(lease.index) == lease.generation


def test_bytes_that_are_not_utf8_reach_the_slot_as_sent_and_the_worker_refuses_them_before_the_model_runs(
        loop, segment, textops):
    config, _ = textops
    body, header_length = binary_body([[b"ok", b"\x00\x89PNG"], [b"caf\xe9", b""]])  # not UTF-8: latin-1, a PNG head

    request = parse(loop, config, body, header_length)  # the gateway carries them
    lease = Ring(segment).acquire()
    refs, output_offset = write_batch(segment, lease, [request])
    text = next(ref for ref in refs if ref.name == "text")
    in_slot = segment.tensor(lease.index, text.offset, np.uint8, (text.nbytes,)).tobytes()
    assert in_slot == wire_form(b"ok", b"\x00\x89PNG", b"caf\xe9", b"")
    sent = messages.Batch(batch_id=1, model=config.name, version=config.version, attempt=0, slot_index=lease.index,
                          generation=lease.generation, inputs=[ref.to_wire() for ref in refs],
                          output_offset=output_offset)
    session = SimpleNamespace(config=config, run=lambda inputs: pytest.fail("the model ran on bytes it cannot take"))

    with pytest.raises(NotText, match=r"input 'text': BYTES element 1 is not UTF-8 \(invalid start byte at byte 1\); "
                                      "ONNX Runtime's string tensors take UTF-8 text only"):
        worker_on(segment)._run(session, sent)
    assert segment.output_generation(lease.index) != lease.generation  # nothing vouched for


def test_string_outputs_that_do_not_fit_the_slot_overflow(segment):
    config = strings_model()
    session = SimpleNamespace(config=config, output_names=["shout", "doubled"])
    shout = np.array([["x" * 2000, "y" * 2000]], dtype=np.object_)  # 16 bytes as pointers, 4008 serialized
    doubled = np.zeros((1, 1), np.float32)
    start = segment.data_capacity - 4096
    too_long = np.array([["x" * 2040, "y" * 2040]], dtype=np.object_)  # 4088 bytes, then 4 for doubled

    with pytest.raises(OutputOverflow, match="outputs need 4160 bytes, the slot has 4096 left"):
        worker_on(segment).write_outputs(session, 0, start, [too_long, doubled])
    refs = worker_on(segment).write_outputs(session, 0, start, [shout, doubled])
    assert refs[0] == ["shout", "BYTES", [1, 2], start, 4008] and len(refs[1]) == 4


# -- config: what BYTES inputs cannot do ----------------------------------------------------------
@pytest.mark.parametrize("change, field, says", [
    (dict(padding=Padding()), "dynamic_batching.padding", "BYTES input(s) 'text' cannot be padded"),
    (dict(preferred_batch_size=(4,), pad_to_preferred_batch_size=True),
     "dynamic_batching.pad_to_preferred_batch_size", "BYTES input(s) 'text' cannot be padded"),
    (dict(separate_by_inputs=("text",)), "dynamic_batching.separate_by_inputs",
     "BYTES input(s) 'text' cannot separate requests"),
])
def test_padding_and_value_separation_of_bytes_inputs_are_config_errors(change, field, says):
    with pytest.raises(ConfigError, match=re.escape(says)) as refused:
        strings_model(**change)
    assert refused.value.field == field


def test_a_ragged_bytes_input_is_a_config_error():
    with pytest.raises(ConfigError, match=re.escape("BYTES input(s) 'text' cannot be ragged")) as refused:
        ModelConfig(name="r", max_batch_size=4, inputs=(TensorConfig("text", "BYTES", (-1,), allow_ragged_batch=True),),
                    outputs=(TensorConfig("n", "INT32", (1,)),), dynamic_batching=None, version=1, model_path="/r")
    assert refused.value.field == "input.allow_ragged_batch"
