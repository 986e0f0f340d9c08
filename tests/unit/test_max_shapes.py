"""Bounds on variable dims (`parameters` `max_shapes`, in trt_profile_max_shapes' form) and
--max-tensor-bytes: refused with the numbers before any of the tensor's data is read."""
from __future__ import annotations

import json
from pathlib import Path

import orjson
import pytest

from ringserve.common.repository.demo import build_demo_models
from ringserve.common.errors import ConfigError
from ringserve.common.repository.batching import DynamicBatching
from ringserve.common.repository.config import ModelConfig, TensorConfig
from ringserve.common.repository.scan import load_model
from ringserve.gateway.core.errors import BadRequest, status_of
from ringserve.gateway.codec.parse import parse_infer_request

CAPACITY_BYTES = 64 << 20


def encoder(max_shapes: str | None, max_batch_size: int = 8) -> ModelConfig:
    parameters = {} if max_shapes is None else {"parameters": {"max_shapes": {"string_value": max_shapes}}}
    return ModelConfig.from_json("encoder", {
        "max_batch_size": max_batch_size,
        "input": [{"name": "ids", "data_type": "TYPE_INT64", "dims": [-1]},
                  {"name": "image", "data_type": "TYPE_UINT8", "dims": [3, -1, -1]}],
        "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [4]}],
        **parameters}, version=1, model_path="/m/encoder/1/model.onnx")


def doc(ids: int, height: int = 2, width: int = 2) -> dict:
    return {"inputs": [{"name": "ids", "datatype": "INT64", "shape": [1, ids], "data": [1] * ids},
                       {"name": "image", "datatype": "UINT8", "shape": [1, 3, height, width],
                        "data": [0] * (3 * height * width)}]}


def parse(loop, config: ModelConfig, body: dict | bytes, max_tensor_bytes: int = 0, **kwargs):
    return parse_infer_request(config, body if isinstance(body, bytes) else orjson.dumps(body),
                               capacity_bytes=CAPACITY_BYTES, future=loop.create_future(), allow_faults=False,
                               max_tensor_bytes=max_tensor_bytes, **kwargs)


# -- the config ---------------------------------------------------------------------------------------
def test_max_shapes_bounds_each_named_input_batch_dim_first_as_a_tensorrt_profile_writes_it():
    config = encoder("ids:8x512, image:-1x3x224x-1")
    assert config.max_dims == {"ids": (512,), "image": (-1, 224, -1)}  # the batch dim left out; fixed dims -1
    assert encoder(None).max_dims == {}


def test_an_unbatched_model_writes_no_batch_dim():
    assert encoder("ids:16", max_batch_size=0).max_dims == {"ids": (16,)}


@pytest.mark.parametrize("text, says", [
    ("ids", "is not name:shape"),
    ("idz:8x512", "'idz' is not an input; inputs: ['ids', 'image']"),
    ("ids:8x512,ids:8x16", "bounds 'ids' twice"),
    ("ids:512", "has 1 dims; the input has 2 (-1x-1, batch dim included)"),
    ("ids:4x512", "the batch dim's bound is max_batch_size (8); write 8 or -1 there, got 4"),
    ("ids:8xabc", "must be integers joined by 'x'"),
    ("ids:8x0", "dim 1 bound must be >= 1 or -1, got 0"),
    ("image:8x4x16x16", "dim 1 is fixed at 3 by dims; its bound must be 3 or -1, got 4"),
])
def test_a_bad_max_shapes_refuses_the_model_at_load_naming_what_is_wrong(text, says):
    with pytest.raises(ConfigError, match="parameters.max_shapes") as raised:
        encoder(text)
    assert says in str(raised.value)
    assert raised.value.model == "encoder"


def test_max_shapes_in_a_config_pbtxt_is_read_as_in_config_json(tmp_path: Path):
    build_demo_models(tmp_path)
    config = json.loads((tmp_path / "encoder" / "config.json").read_text())
    (tmp_path / "encoder" / "config.json").unlink()
    (tmp_path / "encoder" / "config.pbtxt").write_text(
        f'name: "encoder"\nmax_batch_size: {config["max_batch_size"]}\n'
        'parameters { key: "max_shapes" value: { string_value: "input_ids:-1x512,attention_mask:-1x512" } }\n')
    assert load_model(tmp_path, "encoder").max_dims == {"input_ids": (512,), "attention_mask": (512,)}


# -- requests past the bounds ---------------------------------------------------------------------------
def test_a_request_within_the_bounds_is_accepted(loop):
    request = parse(loop, encoder("ids:8x512,image:8x3x224x224"), doc(512, 224, 1))
    assert request.inputs["ids"].shape == (1, 512)


@pytest.mark.parametrize("body, says", [
    (doc(513), "input 'ids': shape [1, 513] has 513 at dim 1; model 'encoder' takes at most 512 there "
               "(parameters.max_shapes: 8x512, -1 = any size)"),
    (doc(4, 225, 2), "input 'image': shape [1, 3, 225, 2] has 225 at dim 2; model 'encoder' takes at most 224 "
                     "there (parameters.max_shapes: 8x-1x224x-1, -1 = any size)"),
])
def test_a_variable_dim_past_its_bound_gets_400_with_the_numbers(loop, body, says):
    with pytest.raises(BadRequest) as raised:
        parse(loop, encoder("ids:8x512,image:-1x3x224x-1"), body)
    assert status_of(raised.value) == 400 and str(raised.value) == says


def test_the_bound_is_checked_from_the_shape_before_any_data_is_read(loop):
    """The shape says 10**9 tokens and the data is a few: the bound answers, not the data check."""
    body = {"inputs": [{"name": "ids", "datatype": "INT64", "shape": [1, 10**9], "data": [1, 2]},
                       {"name": "image", "datatype": "UINT8", "shape": [1, 3, 1, 1], "data": [0, 0, 0]}]}
    with pytest.raises(BadRequest, match="has 1000000000 at dim 1; model 'encoder' takes at most 512"):
        parse(loop, encoder("ids:8x512"), body)


def test_a_raw_request_past_the_bound_gets_400(loop):
    config = ModelConfig.from_json("raw", {
        "max_batch_size": 0, "input": [{"name": "ids", "data_type": "TYPE_INT64", "dims": [-1]}],
        "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [4]}],
        "parameters": {"max_shapes": {"string_value": "ids:16"}}}, version=1, model_path="/m/raw/1/model.onnx")
    assert parse(loop, config, bytes(16 * 8), header_length="0").inputs["ids"].shape == (16,)
    with pytest.raises(BadRequest, match=r"input 'ids': shape \[17\] has 17 at dim 0; model 'raw' takes at most 16"):
        parse(loop, config, bytes(17 * 8), header_length="0")


# -- --max-tensor-bytes ------------------------------------------------------------------------------
def test_a_tensor_over_max_tensor_bytes_gets_400_with_its_size_and_the_limit(loop):
    config = encoder(None)
    assert parse(loop, config, doc(128), max_tensor_bytes=1024).rows == 1  # 128 x 8 = 1024 bytes: at the limit
    with pytest.raises(BadRequest) as raised:
        parse(loop, config, doc(129), max_tensor_bytes=1024)
    assert str(raised.value) == ("input 'ids': shape [1, 129] INT64 is 1032 bytes; this server takes tensors of at "
                                 "most 1024 bytes (--max-tensor-bytes)")


def test_max_tensor_bytes_is_checked_from_the_shape_before_any_data_is_read(loop):
    body = {"inputs": [{"name": "ids", "datatype": "INT64", "shape": [1, 10**9], "data": [1]}]}
    with pytest.raises(BadRequest, match=r"shape \[1, 1000000000\] INT64 is 8000000000 bytes"):
        parse(loop, encoder(None), body, max_tensor_bytes=1 << 20)


def test_a_bytes_tensor_counts_its_serialized_size(loop):
    config = ModelConfig("text", 4, (TensorConfig("s", "BYTES", (1,)),), (TensorConfig("y", "FP32", (1,)),),
                         DynamicBatching(), 1, "/m/text/1/model.onnx")
    body = {"inputs": [{"name": "s", "datatype": "BYTES", "shape": [2, 1], "data": ["a" * 60, "b" * 60]}]}
    assert parse(loop, config, body, max_tensor_bytes=128).rows == 2  # 2 x (4 + 60)
    with pytest.raises(BadRequest, match=r"input 's': shape \[2, 1\] BYTES is 130 bytes; .* at most 128 bytes"):
        parse(loop, config, {"inputs": [{**body["inputs"][0], "data": ["a" * 61, "b" * 61]}]}, max_tensor_bytes=128)
