"""model_warmup, reshape, batch_output and is_shape_tensor as config fields: what loads, and what is refused in
Triton's words (core's model_config_utils.cc and backend_model_instance.cc, Triton's L0_model_config expectations)."""
from __future__ import annotations

import pytest

from ringserve.common.errors import ConfigError
from ringserve.common.repository.config import ModelConfig
from ringserve.common.repository.reshape import refill, scatter_shapes
from ringserve.common.repository.warmup import WarmupInput, WarmupSample


def doc(**changes) -> dict:
    base = {"name": "m", "max_batch_size": 8,
            "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [4, 4]}],
            "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [16]}]}
    return {**base, **changes}


def build(d: dict, platform: str = "") -> ModelConfig:
    return ModelConfig.from_json("m", d, version=1, model_path="/models/m/1/model.onnx")


def sample(**inputs) -> dict:
    return {"name": "s", "batch_size": 2, "count": 3, "inputs": inputs}


def test_model_warmup_samples_are_read_with_tritons_defaults_and_warmup_true_adds_one_of_zeros():
    config = build(doc(warmup=True, model_warmup=[
        sample(x={"data_type": "TYPE_FP32", "dims": ["4", "4"], "random_data": True}),
        {"name": "skipped", "batch_size": 0, "inputs": {}},  # Triton skips a batch 0 sample
        {"name": "once", "batch_size": 1, "inputs": {"x": {"data_type": "TYPE_FP32", "dims": [4, 4],
                                                            "input_data_file": "raw"}}}]))
    assert config.warmup_samples == (
        WarmupSample("s", 2, (WarmupInput("x", "FP32", (4, 4), "random_data"),), 3),
        WarmupSample("once", 1, (WarmupInput("x", "FP32", (4, 4), "input_data_file", "raw"),), 1),  # count 0: once
        WarmupSample("warmup", 1, (WarmupInput("x", "FP32", (4, 4), "zero_data"),), 1, required=False),
    )


@pytest.mark.parametrize("change, words", [
    (sample(x={"data_type": "TYPE_FP32", "dims": [4, -1], "zero_data": True}),
     "warmup setting expects all variable-size dimensions are specified for input 'x'"),
    (sample(x={"data_type": "TYPE_FP32", "dims": [4, 4]}),
     "warmup setting expects input 'x' to have input_data_type set"),
    (sample(), "sample 's': expected 1 inputs but got 0 inputs for model 'm'; missing required input(s) ['x']"),
    (sample(x={"data_type": "TYPE_INT32", "dims": [4, 4], "zero_data": True}),
     "input 'x' data-type is 'INT32', but model 'm' expects 'FP32'"),
    (sample(x={"data_type": "TYPE_FP32", "dims": [16], "zero_data": True}),
     "unexpected shape for input 'x' for model 'm'. Expected [4, 4], got [16]"),
    (sample(z={"data_type": "TYPE_FP32", "dims": [1], "zero_data": True}), "'z' is not an input of model 'm'"),
    ({**sample(x={"data_type": "TYPE_FP32", "dims": [4, 4], "zero_data": True}), "batch_size": 9},
     "batch_size 9 exceeds max_batch_size 8"),
    (sample(x={"data_type": "TYPE_FP32", "dims": [4, 4], "input_data_file": "../../etc/passwd"}),
     "must name a file inside the model's warmup/ folder"),
])
def test_a_warmup_sample_that_cannot_run_is_refused_when_the_config_is_read(change, words):
    with pytest.raises(ConfigError) as info:
        build(doc(model_warmup=[change]))
    assert words in info.value.problem


def test_an_ensemble_cannot_have_model_warmup_as_in_triton():
    ensemble = {"name": "m", "platform": "ensemble", "max_batch_size": 8,
                "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}],
                "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [4]}],
                "ensemble_scheduling": {"step": [{"model_name": "a", "model_version": -1, "input_map": {"x": "x"},
                                                  "output_map": {"y": "y"}}]},
                "model_warmup": [sample(x={"data_type": "TYPE_FP32", "dims": [4], "zero_data": True})]}
    with pytest.raises(ConfigError, match="model_warmup can not be specified for ensemble 'm'"):
        ModelConfig.from_json("m", ensemble, version=1, model_path="/models/m/1")


@pytest.mark.parametrize("dims, reshape, max_batch_size, words", [
    ([1], [], 0, "model input 'x' cannot have empty reshape for non-batching model as scalar tensors are not "
                 "supported"),
    ([4], [0, 4], 8, "model input 'x' reshape dimensions must be integer >= 1, or -1 to indicate a variable-size "
                     "dimension"),
    ([4, 4], [15], 8, "model input 'x' has different size for dims and reshape"),
    ([2, 4, -1, 6], [8, -1, -1, 6], 8, "model input 'x' has different number of variable-size dimensions for dims "
                                      "and reshape"),
    ([2, 4, -1, 6], [4, -1, 2, 6], 8, "model input 'x' has different size for dims and reshape"),
])
def test_a_reshape_that_does_not_hold_the_same_elements_is_refused_in_tritons_words(dims, reshape, max_batch_size,
                                                                                    words):
    d = doc(max_batch_size=max_batch_size, input=[{"name": "x", "data_type": "TYPE_FP32", "dims": dims,
                                                   "reshape": {"shape": reshape}}])
    with pytest.raises(ConfigError) as info:
        build(d)
    assert info.value.problem == words


def test_reshape_maps_variable_dims_in_order_both_ways():
    assert refill((3, 2, 4, 5, 6), (2, 4, -1, 6), (8, -1, 1, 6), batched=True) == (3, 8, 5, 1, 6)
    assert refill((3, 8, 5, 1, 6), (8, -1, 1, 6), (2, 4, -1, 6), batched=True) == (3, 2, 4, 5, 6)
    assert refill((7, 1), (1,), (), batched=True) == (7,)
    assert refill((7,), (), (1,), batched=True) == (7, 1)
    assert refill((4, 1), (-1, 1), (1, -1), batched=False) == (1, 4)


@pytest.mark.parametrize("batch_output, words", [
    ({"target_name": ["y", "y"], "source_input": ["x"]}, "target output name 'y' can only be specified once"),
    ({"target_name": ["y"], "source_input": []},
     "batch output kind 'BATCH_SCATTER_WITH_INPUT_SHAPE' expects 1 source input, got 0"),
    ({"target_name": ["UNKNOWN_OUTPUT"], "source_input": ["x"]}, "unknown target output name 'UNKNOWN_OUTPUT'"),
    ({"target_name": ["y"], "source_input": ["z"]}, "unknown source input name 'z'"),
    ({"target_name": ["y"], "kind": "BATCH_GATHER", "source_input": ["x"]}, "unknown batch output kind 'BATCH_GATHER'"),
])
def test_a_batch_output_is_checked_in_the_words_of_tritons_model_config_tests(batch_output, words):
    with pytest.raises(ConfigError) as info:
        build(doc(batch_output=[batch_output]))
    assert info.value.problem == words


def test_a_batch_output_scatters_by_the_source_inputs_shapes():
    config = build(doc(batch_output=[{"target_name": ["y"], "kind": "BATCH_SCATTER_WITH_INPUT_SHAPE",
                                      "source_input": ["x"]}]))
    assert config.batch_output_sources == {"y": "x"}
    assert config.to_json()["batch_output"] == [{"target_name": ["y"], "kind": "BATCH_SCATTER_WITH_INPUT_SHAPE",
                                                 "source_input": ["x"]}]
    assert scatter_shapes((-1,), True, [(1, 3), (2, 5)]) == [(1, 3), (2, 5)]
    assert scatter_shapes((4,), True, [(1, 3), (2, 5)]) == [(1, 4), (2, 4)]


def test_is_shape_tensor_false_loads_and_true_is_refused_as_tritons_core_refuses_it_outside_tensorrt():
    build(doc(input=[{"name": "x", "data_type": "TYPE_FP32", "dims": [4, 4], "is_shape_tensor": False}]))
    with pytest.raises(ConfigError, match="shape tensors are only supported for TensorRT platform"):
        build(doc(output=[{"name": "y", "data_type": "TYPE_FP32", "dims": [16], "is_shape_tensor": True}]))
