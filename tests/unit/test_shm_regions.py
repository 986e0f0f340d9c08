"""gateway/core/regions.py and the codec's shared-memory paths: registering a client's segment (only with
--allow-client-shm, and within --client-shm-key-prefix), tensors that name a region (read with preadv
straight into the slot, never through a mapping), outputs written into it, and every refusal saying why."""
from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from multiprocessing import resource_tracker

import numpy as np
import orjson
import pytest

from ringserve.common.repository.batching import DynamicBatching

from ringserve.common.repository.config import ModelConfig, TensorConfig
from ringserve.gateway.codec.encode import encode_response
from ringserve.gateway.codec.parse import parse_infer_request
from ringserve.gateway.core.errors import BadRequest, PayloadTooLarge, status_of
from ringserve.gateway.core.region_errors import (CLIENT_SHM_DISABLED, MAX_REGIONS, ClientShmDisabled, RegionError,
                                                 RegionNotFound)
from ringserve.gateway.core.region_registry import RegionRegistry
from ringserve.gateway.core.regions import OutputRegion, RegionInput, RegionReadFailed, WrittenOutput, write_outputs
from ringserve.gateway.batching.slots import write_batch
from ringserve.shm.ring import Ring

from .conftest import make_segment

MODEL = ModelConfig(
    name="scale", max_batch_size=8,
    inputs=(TensorConfig("x", "FP32", (4,)),), outputs=(TensorConfig("y", "FP32", (4,)),),
    dynamic_batching=DynamicBatching(), version=1, model_path="/models/scale/1/model.onnx",
)
STRINGS = ModelConfig(
    name="strings", max_batch_size=8,
    inputs=(TensorConfig("text", "BYTES", (2,)),), outputs=(TensorConfig("echo", "BYTES", (2,)),),
    dynamic_batching=DynamicBatching(), version=1, model_path="/models/strings/1/model.onnx",
)
SEGMENT_BYTES = 8192


@pytest.fixture
def segment() -> Iterator[str]:
    """A client's segment in /dev/shm (made with os calls: no resource tracker in the test either)."""
    key = f"/rs-test-shmx-{secrets.token_hex(6)}"
    fd = os.open("/dev/shm" + key, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        os.ftruncate(fd, SEGMENT_BYTES)
        yield key
    finally:
        os.close(fd)
        try:
            os.unlink("/dev/shm" + key)
        except FileNotFoundError:
            pass


def write_segment(key: str, offset: int, data: bytes) -> None:
    fd = os.open("/dev/shm" + key, os.O_RDWR)
    try:
        os.pwrite(fd, data, offset)
    finally:
        os.close(fd)


def read_segment(key: str, offset: int, nbytes: int) -> bytes:
    fd = os.open("/dev/shm" + key, os.O_RDONLY)
    try:
        return os.pread(fd, nbytes, offset)
    finally:
        os.close(fd)


def registry(*key_prefixes: str, max_read_bytes: int | None = None, max_regions: int = MAX_REGIONS) -> RegionRegistry:
    """The regions of a server started with --allow-client-shm (and these --client-shm-key-prefix)."""
    return RegionRegistry(True, key_prefixes, max_read_bytes=max_read_bytes, max_regions=max_regions)


def truncate(key: str, size: int) -> None:
    fd = os.open("/dev/shm" + key, os.O_RDWR)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


def parse(doc: dict, regions: RegionRegistry | None, config: ModelConfig = MODEL):
    return parse_infer_request(config, orjson.dumps(doc), capacity_bytes=1 << 20, future=None, allow_faults=False,
                               regions=regions)


def shm_input(region: str, shape: list[int], byte_size: int, offset: int = 0, **extra) -> dict:
    params = {"shared_memory_region": region, "shared_memory_byte_size": byte_size}
    if offset:
        params["shared_memory_offset"] = offset
    return {"name": "x", "datatype": "FP32", "shape": shape, "parameters": params, **extra}


# -- registering ------------------------------------------------------------------
def test_register_status_and_unregister_as_triton_answers_them(segment):
    regions = registry()

    regions.register("in", {"key": segment, "offset": 64, "byte_size": 128})
    regions.register("out", {"key": segment, "byte_size": 4096})

    assert regions.status(None) == [{"name": "in", "key": segment, "offset": 64, "byte_size": 128},
                                    {"name": "out", "key": segment, "offset": 0, "byte_size": 4096}]
    assert regions.status("in") == [{"name": "in", "key": segment, "offset": 64, "byte_size": 128}]
    assert regions.unregister("in") == ["in"] and regions.unregister("in") == []  # unknown: not an error
    with pytest.raises(RegionNotFound, match="'in'.*registered: out"):
        regions.status("in")
    assert regions.unregister(None) == ["out"] and regions.status(None) == []


def test_registering_never_involves_the_resource_tracker(segment, monkeypatch):
    # Python 3.11's SharedMemory registers what it attaches and unlinks it at exit: the client's segment.
    def refuse(*args, **kwargs):
        raise AssertionError("the resource tracker was asked to track a client's segment")
    monkeypatch.setattr(resource_tracker, "register", refuse)

    region = registry().register("r", {"key": segment, "byte_size": 64})

    assert region.byte_size == 64


@pytest.mark.parametrize("doc, message", [
    ({"byte_size": 8}, "no 'key' field"),
    ({"key": "/k"}, "no 'byte_size' field"),
    ({"key": 7, "byte_size": 8}, "'key' must be a string"),
    ({"key": "/a/b", "byte_size": 8}, "without '/'"),
    ({"key": "/..", "byte_size": 8}, "is not a shared-memory key"),
    ({"key": "/ringserve-1-abc-ring", "byte_size": 8}, "server's own rings"),
    ({"key": "/k", "byte_size": -1}, "'byte_size' must be a non-negative integer"),
    ({"key": "/k", "byte_size": 0}, "'byte_size' must be at least 1"),
    ({"key": "/k", "offset": 1.5, "byte_size": 8}, "'offset' must be a non-negative integer"),
    ([1], "must be a JSON object"),
])
def test_a_bad_register_body_is_refused_naming_the_field(doc, message):
    with pytest.raises(RegionError, match=message) as caught:
        registry().register("r", doc)
    assert status_of(caught.value) == 400


def test_a_missing_segment_is_refused_naming_the_key():
    key = f"/rs-test-shmx-missing-{secrets.token_hex(4)}"
    with pytest.raises(RegionError, match=f"no shared-memory segment '{key}'.*create it first"):
        registry().register("r", {"key": key, "byte_size": 8})


def test_a_region_past_the_end_of_its_segment_is_refused_with_the_segment_size(segment):
    with pytest.raises(RegionError, match=f"4096 \\+ byte_size 8192 = 12288 runs past.*has {SEGMENT_BYTES} bytes"):
        registry().register("r", {"key": segment, "offset": 4096, "byte_size": 8192})


def test_a_name_taken_is_refused_unless_the_same_region_comes_again_from_a_peer(segment):
    regions = registry()
    first = regions.register("r", {"key": segment, "byte_size": 64})

    with pytest.raises(RegionError, match="already in manager"):
        regions.register("r", {"key": segment, "byte_size": 64})
    assert regions.register("r", {"key": segment, "byte_size": 64}, idempotent=True) is first
    with pytest.raises(RegionError, match="already in manager"):
        regions.register("r", {"key": segment, "byte_size": 32}, idempotent=True)


def test_region_names_with_a_slash_are_refused(segment):
    with pytest.raises(RegionError, match="without '/'"):
        registry().register("a/b", {"key": segment, "byte_size": 8})


def test_the_number_of_regions_is_bounded(segment):
    regions = registry(max_regions=2)  # (MAX_REGIONS, or the open-files budget's share)
    regions.register("a", {"key": segment, "byte_size": 8})
    regions.register("b", {"key": segment, "byte_size": 8})
    with pytest.raises(RegionError, match="2 regions are registered"):
        regions.register("c", {"key": segment, "byte_size": 8})
    assert MAX_REGIONS >= 256


# -- inputs -------------------------------------------------------------------------
def test_an_input_in_a_region_is_read_at_write_time_with_preadv_straight_into_the_slot(segment, monkeypatch):
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    write_segment(segment, 256 + 32, x.tobytes())
    regions = registry()
    region = regions.register("in", {"key": segment, "offset": 256, "byte_size": 1024})
    read = []
    real_preadv = os.preadv

    def spy(fd, buffers, offset):
        read.append((fd, [np.frombuffer(b, np.uint8) for b in buffers], offset))
        return real_preadv(fd, buffers, offset)
    monkeypatch.setattr(os, "preadv", spy)

    request = parse({"inputs": [shm_input("in", [2, 4], 32, offset=32)]}, regions)

    source = request.inputs["x"]
    assert type(source) is RegionInput and read == []  # nothing is read at parse
    assert (source.shape, source.nbytes, source.position) == ((2, 4), 32, 256 + 32)
    assert request.shm_regions == [region] and request.output_regions is None
    with make_segment() as ring_segment:
        lease = Ring(ring_segment).acquire()
        (ref,), _ = write_batch(ring_segment, lease, [request])
        in_slot = ring_segment.tensor(lease.index, ref.offset, np.float32, ref.shape)
        np.testing.assert_array_equal(in_slot, x)
        ((fd, (into,), position),) = read
        assert fd == region.fd and position == 256 + 32 and np.shares_memory(into, in_slot)  # no copy between
        del in_slot, into, read[:]  # (the views, before the segment closes)


def test_a_truncated_segment_is_a_short_read_and_a_400_naming_the_region_offset_and_sizes(segment):
    regions = registry()
    regions.register("in", {"key": segment, "offset": 4096, "byte_size": 64})
    request = parse({"inputs": [shm_input("in", [1, 4], 16, offset=16)]}, regions)
    truncate(segment, 4100)  # the client shrinks its segment while the request waits

    with pytest.raises(RegionReadFailed) as caught:
        request.inputs["x"].read()

    message = str(caught.value)
    assert status_of(caught.value) == 400 and caught.value.source is request.inputs["x"]
    assert message.startswith("input 'x': shared memory region 'in' (key ") and "only 0 of 16 bytes" in message
    assert "at offset 4112 (region offset 4096 + shared_memory_offset 16); the segment now has 4100 bytes" in message


def test_a_mapping_of_the_clients_segment_is_never_made(segment, monkeypatch):
    """A read through a mapping of a segment its client truncates is SIGBUS: there is none to read through."""
    import mmap

    def refuse(*args, **kwargs):
        raise AssertionError("a client's segment was mapped")
    monkeypatch.setattr(mmap, "mmap", refuse)
    write_segment(segment, 0, np.ones(4, np.float32).tobytes())
    regions = registry()
    regions.register("in", {"key": segment, "byte_size": 64})
    regions.register("out", {"key": segment, "offset": 64, "byte_size": 64})
    request = parse({"inputs": [shm_input("in", [1, 4], 16)],
                     "outputs": [{"name": "y", "parameters": {"shared_memory_region": "out",
                                                              "shared_memory_byte_size": 16}}]}, regions)

    np.testing.assert_array_equal(request.inputs["x"].read(), np.ones((1, 4), np.float32))
    write_outputs({"y": np.full((1, 4), 3, np.float32)}, request.output_regions, MODEL)
    assert read_segment(segment, 64, 16) == np.full(4, 3, np.float32).tobytes()


def test_a_bool_input_in_a_region_must_hold_bytes_0_or_1(segment):
    flags = ModelConfig(name="flags", max_batch_size=8, inputs=(TensorConfig("x", "BOOL", (4,)),),
                        outputs=(TensorConfig("y", "BOOL", (4,)),), dynamic_batching=DynamicBatching(), version=1,
                        model_path="/models/flags/1/model.onnx")
    write_segment(segment, 0, bytes([0, 1, 1, 0, 0, 1, 2, 0]))
    regions = registry()
    regions.register("in", {"key": segment, "byte_size": 8})
    item = {"name": "x", "datatype": "BOOL", "shape": [1, 4],
            "parameters": {"shared_memory_region": "in", "shared_memory_byte_size": 4}}

    ok = parse({"inputs": [item]}, regions, flags)
    bad = parse({"inputs": [{**item, "parameters": {**item["parameters"], "shared_memory_offset": 4}}]}, regions, flags)

    assert ok.inputs["x"].read().tolist() == [[False, True, True, False]]
    with pytest.raises(RegionReadFailed, match="input 'x': BOOL elements must be bytes 0 or 1"):
        bad.inputs["x"].read()


@pytest.mark.parametrize("params, message", [
    ({"shared_memory_region": "nope", "shared_memory_byte_size": 32},
     "^Unable to find shared memory region: 'nope'; input 'x': registered: in"),
    ({"shared_memory_region": "in"}, "needs parameters.shared_memory_byte_size"),
    ({"shared_memory_region": "in", "shared_memory_byte_size": 32, "shared_memory_offset": 1000},
     "^Invalid offset \\+ byte size for shared memory region: 'in'; input 'x': shared_memory_offset 1000 \\+ "
     "shared_memory_byte_size 32 = 1032 runs past region 'in' \\(byte_size 1024\\)"),
    ({"shared_memory_region": "in", "shared_memory_byte_size": 0, "shared_memory_offset": 1024},
     "^Invalid offset for shared memory region: 'in'; "),
    ({"shared_memory_region": "in", "shared_memory_byte_size": 2048}, "offset \\+ byte_size <= 1024"),
    ({"shared_memory_region": "in", "shared_memory_byte_size": -4}, "must be a non-negative integer"),
    ({"shared_memory_region": "in", "shared_memory_byte_size": 16},
     "^input byte size mismatch for input 'x' for model 'scale'. Expected 32, got 16; .*16 bytes but shape \\[2, 4\\] of "
     "FP32 needs"),
    ({"shared_memory_region": 3, "shared_memory_byte_size": 32}, "must be a region name"),
])
def test_a_bad_input_region_reference_is_a_400_that_says_what_is_accepted(segment, params, message):
    regions = registry()
    regions.register("in", {"key": segment, "byte_size": 1024})
    item = {"name": "x", "datatype": "FP32", "shape": [2, 4], "parameters": params}

    with pytest.raises(BadRequest, match=message) as caught:
        parse({"inputs": [item]}, regions)
    assert status_of(caught.value) == 400 and "input 'x'" in str(caught.value)


def test_an_input_with_data_and_a_region_is_refused(segment):
    regions = registry()
    regions.register("in", {"key": segment, "byte_size": 1024})
    with pytest.raises(BadRequest, match="both parameters.shared_memory_region and 'data'; give exactly one"):
        parse({"inputs": [shm_input("in", [2, 4], 32, data=[0.0] * 8)]}, regions)


def test_without_a_registry_a_region_reference_is_refused():
    with pytest.raises(BadRequest, match="not accepted on this endpoint"):
        parse({"inputs": [shm_input("in", [2, 4], 32)]}, None)


def test_a_bytes_input_in_a_region_is_read_in_the_binary_bytes_form(segment):
    from ringserve.common.wire import serialize_bytes_tensor
    text = np.array([[b"ab", "zw\u00f6lf".encode()]], dtype=np.object_)
    data = serialize_bytes_tensor(text)
    write_segment(segment, 0, data)
    regions = registry()
    regions.register("in", {"key": segment, "byte_size": 512})
    item = {"name": "text", "datatype": "BYTES", "shape": [1, 2],
            "parameters": {"shared_memory_region": "in", "shared_memory_byte_size": len(data)}}

    request = parse({"inputs": [item]}, regions, STRINGS)

    assert request.inputs["text"].tolist() == text.tolist()
    bounded = registry(max_read_bytes=len(data) - 1)  # (a slot's capacity, in the server)
    bounded.register("in", {"key": segment, "byte_size": 512})
    with pytest.raises(PayloadTooLarge):  # read at parse, so never more than a slot holds
        parse({"inputs": [item]}, bounded, STRINGS)


def test_a_region_unregistered_while_a_request_holds_it_stays_open_until_the_request_goes(segment):
    x = np.arange(4, dtype=np.float32).reshape(1, 4)
    write_segment(segment, 0, x.tobytes())
    regions = registry()
    region = regions.register("in", {"key": segment, "byte_size": 64})
    request = parse({"inputs": [shm_input("in", [1, 4], 16)]}, regions)
    fd = region.fd
    del region

    regions.unregister("in")

    np.testing.assert_array_equal(request.inputs["x"].read(), x)  # its descriptor is still open
    request.shm_regions[0].check_intact()
    del request
    with pytest.raises(OSError):
        os.fstat(fd)  # closed with the last holder


def test_a_truncated_output_segment_is_found_before_it_is_written(segment):
    regions = registry()
    region = regions.register("out", {"key": segment, "offset": 4096, "byte_size": 64})
    truncate(segment, 4096)

    with pytest.raises(RegionError, match="truncated to 4096 bytes.*needs offset 4096 \\+ byte_size 64"):
        region.check_intact()


# -- client shared memory off (the default), and the key prefixes --------------------
def test_with_client_shm_off_register_and_unregister_answer_as_triton_and_status_is_empty(segment):
    regions = RegionRegistry()  # (--allow-client-shm not given)

    for call in (lambda: regions.register("r", {"key": segment, "byte_size": 8}), lambda: regions.unregister("r"),
                 lambda: regions.unregister(None)):
        with pytest.raises(ClientShmDisabled) as caught:
            call()
        assert str(caught.value) == CLIENT_SHM_DISABLED == ("Client shared memory is disabled. Start the server "
                                                            "with '--allow-client-shm=true' to enable.")
        assert status_of(caught.value) == 501
    assert regions.status(None) == []
    with pytest.raises(BadRequest, match="input 'x': shared memory region 'r': Client shared memory is disabled"):
        parse({"inputs": [shm_input("r", [1, 4], 16)]}, regions)


def test_a_key_outside_the_prefixes_is_refused_naming_them(segment):
    regions = registry("/rs-test-shmx-", "app-")
    other = registry("/someone-else-")

    assert regions.register("r", {"key": segment, "byte_size": 8}).key == segment
    assert regions.register("bare", {"key": segment[1:], "byte_size": 8}).key == segment[1:]  # ('/' optional)
    with pytest.raises(RegionError) as caught:
        other.register("r", {"key": segment, "byte_size": 8})
    assert status_of(caught.value) == 400
    assert str(caught.value) == (f"'key' {segment!r} is not one this server accepts: its keys must start with "
                                 "'/someone-else-' (--client-shm-key-prefix)")
    assert other.regions == {}


# -- outputs ------------------------------------------------------------------------
def output_doc(byte_size: int, offset: int = 0, **params) -> dict:
    out = {"shared_memory_region": "out", "shared_memory_byte_size": byte_size, **params}
    if offset:
        out["shared_memory_offset"] = offset
    return {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2, 4], "data": [0.0] * 8}],
            "outputs": [{"name": "y", "parameters": out}]}


def test_an_output_in_a_region_is_written_there_and_answered_without_data(segment):
    regions = registry()
    regions.register("out", {"key": segment, "offset": 128, "byte_size": 1024})
    request = parse(output_doc(64, offset=16, binary_data=False), regions)
    slot_rows = np.arange(8, dtype=np.float32).reshape(2, 4)
    outputs = {"y": slot_rows}

    write_outputs(outputs, request.output_regions, MODEL)
    body, json_length = encode_response(request, outputs)

    assert read_segment(segment, 128 + 16, 32) == slot_rows.tobytes()
    assert outputs["y"] == WrittenOutput((2, 4), {"shared_memory_region": "out", "shared_memory_byte_size": 32,
                                                  "shared_memory_offset": 16})
    assert json_length is None
    # Triton's answer: name, datatype and shape only (its C++ client reads binary_data_size from any parameters).
    assert orjson.loads(body)["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [2, 4]}]


def test_a_fixed_size_output_that_cannot_fit_its_region_space_is_refused_before_it_runs(segment):
    regions = registry()
    regions.register("out", {"key": segment, "byte_size": 1024})

    with pytest.raises(RegionError, match="output 'y' will be 32 bytes \\(shape \\[2, 4\\] FP32\\); .*gives it 16 "
                                          "bytes.*give at least 32") as caught:
        parse(output_doc(16), regions)
    assert status_of(caught.value) == 400


def test_an_output_larger_than_its_region_space_once_computed_is_a_400_with_the_size_needed(segment):
    regions = registry()
    region = regions.register("out", {"key": segment, "byte_size": 1024})
    targets = {"y": OutputRegion(region, 0, 16)}  # (as for an output with a variable dim)

    with pytest.raises(RegionError, match="output 'y' is 32 bytes .*gives it 16 bytes.*give at least 32"):
        write_outputs({"y": np.zeros((2, 4), np.float32)}, targets, MODEL)


def test_an_output_region_with_binary_data_true_is_refused_as_triton_does(segment):
    regions = registry()
    regions.register("out", {"key": segment, "byte_size": 1024})
    with pytest.raises(BadRequest, match="can't set both 'shared_memory_region' and 'binary_data'"):
        parse(output_doc(64, binary_data=True), regions)
    with pytest.raises(BadRequest, match="^Unable to find shared memory region: 'gone'; output 'y': registered"):
        parse(output_doc(64) | {"outputs": [{"name": "y", "parameters": {"shared_memory_region": "gone",
                                                                          "shared_memory_byte_size": 8}}]}, regions)


def test_a_request_naming_no_region_pays_nothing_for_the_extension():
    request = parse({"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 4], "data": [1.0] * 4}]},
                    registry())
    assert request.shm_regions is None and request.output_regions is None


def test_an_output_goes_from_the_slot_into_the_region_in_one_copy(segment, monkeypatch):
    regions = registry()
    regions.register("out", {"key": segment, "byte_size": 1024})
    request = parse(output_doc(64), regions)
    slot = np.arange(32, dtype=np.float32).reshape(8, 4)
    rows_of_request = slot[2:4]  # what split_outputs hands over for a region output: a view of the slot
    written = []
    real_pwritev = os.pwritev

    def spy(fd, buffers, offset):
        written.extend(np.frombuffer(b, np.uint8) for b in buffers)
        return real_pwritev(fd, buffers, offset)
    monkeypatch.setattr(os, "pwritev", spy)

    write_outputs({"y": rows_of_request}, request.output_regions, MODEL)

    assert len(written) == 1 and np.shares_memory(written[0], slot)  # no copy before the kernel's
    assert read_segment(segment, 0, 32) == slot[2:4].tobytes()
