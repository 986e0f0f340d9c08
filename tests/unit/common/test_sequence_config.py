"""Triton's sequence_batching read as Triton reads it: its defaults, and its refusals in its words."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

from ringserve.common.errors import ConfigError
from ringserve.common.repository.config import ModelConfig
from ringserve.common.repository.scan import load_model
from tests.support.sequence_models import accumulator_config, build_accumulator


def config(doc: dict, path: str = "/r/m/1/model.onnx") -> ModelConfig:
    return ModelConfig.from_json("m", doc, version=1, model_path=path)


def test_oldest_gets_tritons_defaults_and_gives_its_block_back():
    doc = accumulator_config(max_batch_size=8, candidates=4)
    del doc["sequence_batching"]["max_sequence_idle_microseconds"]
    seq = config(doc).sequence_batching
    assert (seq.strategy, seq.max_sequence_idle_us, seq.preferred_batch_size, seq.max_candidate_sequences) == (
        "oldest", 1_000_000, (8,), 4,
    )
    block = config(doc).to_json()["sequence_batching"]
    assert block["max_sequence_idle_microseconds"] == 1_000_000
    assert block["oldest"]["preferred_batch_size"] == [8]


def test_no_strategy_is_direct_with_a_slot_per_batch_row_and_instance():
    doc = accumulator_config(max_batch_size=4, strategy="direct", instance_group=[{"count": 2, "kind": "KIND_CPU"}])
    model = config(doc)
    assert model.sequence_batching.strategy == "direct"
    assert model.sequence_batching.candidate_slots(model.max_batch_size, model.lifecycle.instance_count) == 8


def test_control_and_state_tensors_are_inputs_the_gateway_writes():
    seq = config(accumulator_config()).sequence_batching
    assert seq.generated_inputs == ("START", "READY", "CORRID", "INPUT_STATE")
    assert seq.state_outputs == {"OUTPUT_STATE"}
    assert seq.control("START").value(True) == 1 and seq.control("START").value(False) == 0


def test_a_slot_holds_the_controls_and_both_states_of_each_row():
    model = config(accumulator_config(state_width=16))
    # outputs (16 fp32 + 1 uint64) + START, READY (int32) + CORRID (uint64) + state in and out (16 fp32 each)
    assert model.fixed_row_bytes == 16 * 4 + 8 + 4 + 4 + 8 + 2 * 16 * 4


TRITON_REFUSALS = [
    (lambda s: s["control_input"].append({"control": [{"kind": "CONTROL_SEQUENCE_END", "int32_false_true": [0, 1]}]}),
     "sequence batching control tensor must have a name for m"),
    (lambda s: s["control_input"].append(dict(s["control_input"][0])),
     "sequence batching control tensor 'START' is specified for multiple control kinds for m"),
    (lambda s: s["control_input"].append(
        {"name": "S2", "control": [{"kind": "CONTROL_SEQUENCE_START", "int32_false_true": [0, 1]}]}),
     "sequence batching specifies multiple CONTROL_SEQUENCE_START tensors for m"),
    (lambda s: s["control_input"][0]["control"][0].update(int32_false_true=[0, 1, 2]),
     "sequence batching control 'int32_false_true' must have exactly 2 entries for CONTROL_SEQUENCE_START for m"),
    (lambda s: s["control_input"][0]["control"][0].update(fp32_false_true=[0, 1]),
     "sequence batching specifies more than one from 'int32_false_true', 'fp32_false_true' and 'bool_false_true' "
     "for CONTROL_SEQUENCE_START for m"),
    (lambda s: s["control_input"][0]["control"][0].pop("int32_false_true"),
     "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or 'bool_false_true' for "
     "CONTROL_SEQUENCE_START for m"),
    (lambda s: s["control_input"][2]["control"][0].update(data_type="TYPE_FP32"),
     "unexpected data type for control CONTROL_SEQUENCE_CORRID for m. Allowed data types are TYPE_UINT64, "
     "TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING"),
    (lambda s: s["control_input"][2]["control"][0].update(int32_false_true=[0, 1]),
     "sequence batching must not specify either 'int32_false_true', 'fp32_false_true' or 'bool_false_true' for "
     "CONTROL_SEQUENCE_CORRID for m"),
    (lambda s: s["oldest"].update(preferred_batch_size=[16]),
     "sequence batching preferred batch size must be <= max batch size for m"),
    (lambda s: s["oldest"].update(preferred_batch_size=[0]),
     "sequence batching preferred batch size must be positive for m"),
    (lambda s: s.update(direct={"minimum_slot_utilization": 1.5}) or s.pop("oldest"),
     "sequence batching minimum slot utilization must be in range (0.0, 1.0] for m"),
    (lambda s: s["state"].append(dict(s["state"][0])),
     "State input name 'INPUT_STATE' specified more than once."),
    (lambda s: s["state"][0].update(initial_state=[{"data_type": "TYPE_FP32", "dims": [1], "zero_data": True}]),
     "Field 'name' must be set when using initial_state for state input 'INPUT_STATE'."),
    (lambda s: s["state"][0].update(initial_state=[{"name": "i", "data_type": "TYPE_INT32", "dims": [1],
                                                    "zero_data": True}]),
     "The data type used for 'initial_state' field of state 'INPUT_STATE' does not match the state data type."),
    (lambda s: s["state"][0].update(initial_state=[{"name": "i", "data_type": "TYPE_FP32", "dims": [2],
                                                    "zero_data": True}]),
     "'initial_state' dim for input name 'INPUT_STATE' doesn't match 'state' dim description. 2 != 1"),
    (lambda s: s["state"][0].update(use_growable_memory=True),
     "'use_growable_memory' can only work with KIND_GPU model instances right now."),
]


@pytest.mark.parametrize("change, message", TRITON_REFUSALS, ids=range(len(TRITON_REFUSALS)))
def test_configs_triton_refuses_are_refused_with_tritons_reason(change, message):
    doc = copy.deepcopy(accumulator_config())
    change(doc["sequence_batching"])
    with pytest.raises(ConfigError) as caught:
        config(doc)
    assert message in str(caught.value)


def test_a_model_has_one_scheduler():
    doc = {**accumulator_config(), "dynamic_batching": {}}
    with pytest.raises(ConfigError, match="set dynamic_batching or sequence_batching, not both"):
        config(doc)


def test_a_control_input_cannot_also_be_a_request_input():
    doc = accumulator_config()
    doc["input"].append({"name": "START", "data_type": "TYPE_INT32", "dims": [1]})
    with pytest.raises(ConfigError, match="written by the sequence batcher"):
        config(doc)


def test_the_initial_state_file_comes_from_the_models_initial_state_folder(tmp_path: Path):
    (tmp_path / "m" / "initial_state").mkdir(parents=True)
    (tmp_path / "m" / "initial_state" / "input_state_data").write_bytes(np.array([100], np.float32).tobytes())
    doc = accumulator_config()
    doc["sequence_batching"]["state"][0]["initial_state"] = [
        {"name": "i", "data_type": "TYPE_FP32", "dims": [1], "data_file": "input_state_data"}
    ]
    state = config(doc, str(tmp_path / "m" / "1" / "model.onnx")).sequence_batching.states[0]
    assert state.start_value().tolist() == [100.0]
    (tmp_path / "m" / "initial_state" / "input_state_data").write_bytes(b"\0\0")
    with pytest.raises(ConfigError, match="initial_state setting expects 4 bytes, but the data provided from "
                                          "input_state_dataonly has 2 bytes."):
        config(doc, str(tmp_path / "m" / "1" / "model.onnx"))


def test_a_growing_state_is_bounded_by_max_shapes_as_its_window():
    doc = accumulator_config(state_width=1)
    doc["sequence_batching"]["state"][0]["dims"] = [-1]
    doc["parameters"] = {"max_shapes": {"string_value": "INPUT_STATE:8x32"}}
    state = config(doc).sequence_batching.states[0]
    assert (state.window, state.start_shape(), state.max_bytes) == ((32,), (1,), 128)


def test_tritons_pbtxt_loads_unchanged(tmp_path: Path):
    build_accumulator(tmp_path)
    (tmp_path / "accumulator" / "config.json").unlink()
    (tmp_path / "accumulator" / "config.pbtxt").write_text(
        """
name: "accumulator"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] }, { name: "SEEN_CORRID" data_type: TYPE_UINT64 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
sequence_batching {
  max_sequence_idle_microseconds: 5000000
  oldest { max_candidate_sequences: 6 preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 0 }
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
  state [ { input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_FP32 dims: 1 } ]
}
"""
    )
    seq = load_model(tmp_path, "accumulator").sequence_batching
    assert (seq.strategy, seq.max_candidate_sequences, seq.preferred_batch_size) == ("oldest", 6, (4,))
    assert seq.states[0].dims == (1,)
    assert [c.kind for c in seq.controls] == ["START", "READY", "CORRID"]


def test_an_onnx_graph_that_takes_the_control_and_state_inputs_passes_the_graph_check(tmp_path: Path):
    build_accumulator(tmp_path)
    model = load_model(tmp_path, "accumulator")
    assert [t.name for t in model.inputs] == ["INPUT"]
    assert model.output_datatypes["OUTPUT_STATE"] == "FP32"
