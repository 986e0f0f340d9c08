"""gateway/codec/binary.py: the binary tensor extension's framing, BYTES elements, content encodings."""
from __future__ import annotations

import gzip
import re
import struct
import zlib

import numpy as np
import pytest

from ringserve.common.repository.config import TensorConfig
from ringserve.common.wire import serialize_bytes_tensor
from ringserve.gateway.codec.binary import (COMPRESS_MIN_BYTES, INFLATE_CHUNK_BYTES, BinaryReader, decode_content,
                                      encode_content, inflate, pick_encoding,
                                      raw_input_shape, split_body, tensor_from_buffer)
from ringserve.gateway.core.errors import BadRequest, RequestTooLarge, UnsupportedEncoding, status_of


# -- framing ---------------------------------------------------------------------------
def test_split_body_gives_the_json_header_and_the_binary_rest():
    header, reader = split_body(b'{"a":1}\x01\x02\x03', b"7")

    assert bytes(header) == b'{"a":1}'
    assert bytes(reader.take("x", 2)) == b"\x01\x02"
    assert bytes(reader.take("y", 1)) == b"\x03"
    reader.finish()


@pytest.mark.parametrize("value, says", [
    (b"99", "but the body has only 10 bytes"),
    (b"-1", "non-negative integer"),
    (b"ten", "non-negative integer, got 'ten'"),
])
def test_a_header_length_that_does_not_fit_the_body_is_a_400(value, says):
    with pytest.raises(BadRequest, match=says):
        split_body(b"0123456789", value)


def test_binary_data_size_past_the_end_and_bytes_left_over_are_400s():
    reader = BinaryReader(memoryview(b"abcdef"))
    with pytest.raises(BadRequest, match="runs past the end of the body"):
        reader.take("x", 7)
    reader.take("x", 4)
    with pytest.raises(BadRequest, match="2 bytes after the last input's binary data"):
        reader.finish()
    with pytest.raises(BadRequest, match="non-negative integer"):
        reader.take("y", -1)
    with pytest.raises(BadRequest, match="non-negative integer"):
        reader.take("y", 1.5)


# -- fixed-size tensors ------------------------------------------------------------------
ALL_FIXED = ["BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16", "FP32", "FP64"]


@pytest.mark.parametrize("datatype", ALL_FIXED)
def test_every_fixed_size_type_is_a_view_over_the_body_bytes(datatype):
    tensor = TensorConfig("t", datatype, (3,))
    values = np.array([[1, 0, 1], [0, 1, 1]]).astype(tensor.np_dtype)
    body = values.astype(tensor.np_dtype.newbyteorder("<")).tobytes()
    view = memoryview(body)

    array = tensor_from_buffer(tensor, (2, 3), view)

    assert array.dtype == tensor.np_dtype and array.shape == (2, 3)
    assert np.array_equal(array, values)
    assert not array.flags.owndata  # no copy: the batcher's write into the slot is the only one


def test_binary_size_that_disagrees_with_shape_times_type_is_a_400():
    tensor = TensorConfig("x", "FP32", (4,))
    with pytest.raises(BadRequest, match=r"binary_data_size is 12 bytes but shape \[1, 4\] of FP32 needs 4 x 4 = 16"):
        tensor_from_buffer(tensor, (1, 4), memoryview(b"\0" * 12))


def test_bool_bytes_other_than_0_and_1_are_refused():
    tensor = TensorConfig("b", "BOOL", (2,))
    with pytest.raises(BadRequest, match="BOOL elements must be bytes 0 or 1"):
        tensor_from_buffer(tensor, (1, 2), memoryview(b"\x01\x02"))


# -- BYTES -------------------------------------------------------------------------------
def wire(*items: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(i)) + i for i in items)


STRINGS = TensorConfig("s", "BYTES", (-1,))


def test_bytes_elements_round_trip_with_a_4_byte_little_endian_length_prefix():
    items = [b"", b"hello", "h\u00e9".encode(), b"\x00\x7f" * 300]

    data = serialize_bytes_tensor(np.array(items, dtype=np.object_))

    assert data == wire(*items)
    assert tensor_from_buffer(STRINGS, (4,), memoryview(data)).tolist() == items


def test_str_elements_serialize_as_utf8():
    assert serialize_bytes_tensor(np.array(["h\u00e9"], dtype=np.object_)) == wire("h\u00e9".encode())


@pytest.mark.parametrize("data, count, says", [
    (wire(b"ab") + b"\x01\x00", 2, "BYTES data of 8 bytes ends inside the length of element 1 of 2"),
    (struct.pack("<I", 10) + b"abc", 1, "BYTES element 0 says 10 bytes but only 3 remain"),
    (wire(b"a") + b"\x01\x00", 1, "BYTES data has 2 bytes after its 1 elements"),
    (b"\x01\x00", 2, "BYTES data of 2 bytes cannot hold 2 elements (each takes a 4-byte length)"),
    (b"\x01\x00", 10**12, "BYTES data of 2 bytes cannot hold 1000000000000 elements"),  # refused before allocating
])
def test_broken_bytes_data_is_a_400_that_names_the_input_and_says_the_format(data, count, says):
    with pytest.raises(BadRequest, match=re.escape(f"input 's': {says}")) as raised:
        tensor_from_buffer(STRINGS, (count,), memoryview(data))
    assert str(raised.value).endswith("each element is a 4-byte little-endian length followed by that many bytes")


@pytest.mark.parametrize("data, count, says", [
    (wire(b"a"), 2, "expected 2 string elements for inference input 's' for model 'm', got 1; "),
    (wire(b"a"), 10**12, "expected 1000000000000 string elements for inference input 's' for model 'm', got 1; "),
    (wire(b"a", b"b", b"c"), 2, "unexpected number of string elements 3 for inference input 's' for model 'm', "
                                "expecting 2; "),
])
def test_whole_bytes_elements_of_another_count_than_the_shape_s_are_refused_in_tritons_words(data, count, says):
    """qa/L0_input_validation (test_wrong_input_shape_tensor_size): Triton counts the elements, stopping at one
    past the shape's count (core infer_request.cc ValidateBytesInputs)."""
    with pytest.raises(BadRequest) as raised:
        tensor_from_buffer(STRINGS, (count,), memoryview(data), "m")
    assert str(raised.value).startswith(says)


def test_bytes_elements_are_any_bytes_carried_as_sent():
    items = [b"ok", b"\xff\xfe", b"caf\xe9", b"\x00\x89PNG", b""]  # not UTF-8: images, latin-1, protos

    array = tensor_from_buffer(STRINGS, (5,), memoryview(wire(*items)))

    assert array.tolist() == items


def test_bytes_tensor_from_buffer_has_the_requested_shape():
    tensor = TensorConfig("s", "BYTES", (2,))

    array = tensor_from_buffer(tensor, (1, 2), memoryview(wire(b"a", b"bc")))

    assert array.shape == (1, 2) and array.dtype == np.object_
    assert array.tolist() == [[b"a", b"bc"]]


# -- raw requests ------------------------------------------------------------------------
def test_raw_request_shape_comes_from_the_body_size():
    x = TensorConfig("x", "FP32", (4,))
    assert raw_input_shape(x, batched=True, body_bytes=48) == (3, 4)
    assert raw_input_shape(TensorConfig("x", "FP32", (2, 4)), batched=False, body_bytes=32) == (2, 4)
    assert raw_input_shape(TensorConfig("x", "UINT8", (-1,)), batched=False, body_bytes=5) == (5,)


@pytest.mark.parametrize("tensor, nbytes, shape", [
    (TensorConfig("x", "FP32", (-1,)), 16, (1, 4)),
    (TensorConfig("x", "FP32", (3, -1)), 24, (1, 3, 2)),
    (TensorConfig("x", "INT64", (-1, 2)), 0, (1, 0, 2)),  # an empty body: a zero-sized tensor
    (TensorConfig("s", "BYTES", (1,)), 7, (1, 1)),  # the body is the one element
])
def test_a_raw_request_to_a_batching_model_with_a_variable_dim_is_batch_1_of_the_config_dims(tensor, nbytes, shape):
    """Triton's core prepends batch 1 and deduces the one variable config dim from the body size."""
    assert raw_input_shape(tensor, batched=True, body_bytes=nbytes) == shape


@pytest.mark.parametrize("tensor, batched, nbytes, says", [
    (TensorConfig("x", "FP32", (4,)), True, 20, "whole number"),
    (TensorConfig("x", "FP32", (4,)), True, 0, "whole number"),
    (TensorConfig("x", "FP32", (-1, -1)), True, 16, "at most one variable dim"),
    (TensorConfig("x", "FP32", (-1, 3)), True, 16, "whole number of 12-byte steps"),
    (TensorConfig("x", "FP32", (4,)), False, 32, "is 16 bytes"),
    (TensorConfig("s", "BYTES", (2,)), True, 8, "model whose input has dims \\[1\\]"),
    (TensorConfig("s", "BYTES", (-1,)), False, 8, "model whose input has dims \\[1\\]"),
])
def test_raw_request_that_cannot_be_deduced_is_a_400(tensor, batched, nbytes, says):
    with pytest.raises(BadRequest, match=says):
        raw_input_shape(tensor, batched, nbytes)


# -- content encodings -----------------------------------------------------------------
BODY = b'{"inputs": []}' * 100


@pytest.mark.parametrize("encoding, packed", [
    ("gzip", gzip.compress(BODY)),
    ("x-gzip", gzip.compress(BODY)),
    ("deflate", zlib.compress(BODY)),
    ("deflate", zlib.compress(BODY)[2:-4]),  # bare deflate, as some clients send it
    ("identity", BODY),
    ("GZIP ", gzip.compress(BODY)),
])
def test_gzip_and_deflate_bodies_are_decoded(encoding, packed):
    assert decode_content(packed, encoding, limit_bytes=len(BODY)) == BODY


def test_a_body_that_inflates_past_the_limit_is_a_413_without_inflating_it_all():
    bomb = gzip.compress(b"\0" * (50 << 20))  # 50 MiB of zeros in ~50 KiB

    with pytest.raises(RequestTooLarge) as info:
        decode_content(bomb, "gzip", limit_bytes=1 << 20)

    assert status_of(info.value) == 413
    assert "gzip-decoded request body" in str(info.value)


def test_broken_or_truncated_compressed_bodies_are_400s():
    with pytest.raises(BadRequest, match="not valid gzip"):
        decode_content(b"not gzip at all", "gzip", 1 << 20)
    with pytest.raises(BadRequest, match="truncated"):
        decode_content(gzip.compress(BODY)[:-12], "gzip", 1 << 20)


def test_an_unknown_content_encoding_is_a_415_naming_the_accepted_ones():
    with pytest.raises(UnsupportedEncoding) as info:
        decode_content(BODY, "br", 1 << 20)
    assert status_of(info.value) == 415
    assert "accepted: gzip, deflate, identity" in str(info.value)


@pytest.mark.parametrize("accept, chosen", [
    ("gzip", "gzip"), ("deflate", "deflate"), ("gzip, deflate, br", "gzip"), ("br, deflate;q=0.5", "deflate"),
    ("gzip;q=0, deflate", "deflate"), ("gzip;q=0", None), ("identity", None), ("", None), ("gzip;q=x", None),
])
def test_response_encoding_follows_accept_encoding(accept, chosen):
    assert pick_encoding(accept) == chosen


def test_encoded_responses_decode_back():
    body = b"x" * COMPRESS_MIN_BYTES
    assert gzip.decompress(encode_content(body, "gzip")) == body
    assert zlib.decompress(encode_content(body, "deflate")) == body


def test_inflate_hands_the_body_out_a_chunk_at_a_time_member_after_member():
    first, second = bytes(range(256)) * (12 << 10), b"z" * (3 << 20)  # 3 MiB each
    chunks = list(inflate(gzip.compress(first) + gzip.compress(second), "gzip"))
    assert all(0 < len(c) <= INFLATE_CHUNK_BYTES for c in chunks) and len(chunks) >= 6
    assert b"".join(chunks) == first + second
    assert b"".join(inflate(zlib.compress(second)[2:-4], "deflate")) == second  # bare deflate, chunked too


def test_a_caller_that_stops_at_its_limit_inflates_one_chunk_past_it():
    bomb = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    packed = b"".join(bomb.compress(bytes(1 << 20)) for _ in range(256)) + bomb.flush()  # 256 MiB in ~250 KiB
    inflated = 0
    for chunk in inflate(packed, "gzip"):
        inflated += len(chunk)
        if inflated > 1 << 20:
            break
    assert inflated <= (1 << 20) + INFLATE_CHUNK_BYTES
    with pytest.raises(RequestTooLarge):
        decode_content(packed, "gzip", limit_bytes=1 << 20)
