"""Optional inputs and the classification extension, below the real stack: config, parse, the answer."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import orjson
import pytest

from ringserve.common.errors import ConfigError
from ringserve.common.repository.batching import DynamicBatching
from ringserve.common.repository.config import ModelConfig, TensorConfig
from ringserve.common.repository.scan import load_model, scan_repository
from ringserve.gateway.codec.classification import classify
from ringserve.gateway.core.errors import BadRequest
from ringserve.gateway.codec.parse import parse_infer_request

from tests.support.triton_rule_models import LABELS, WIDTH, build_rules_repo, triton_classes


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_rules_repo(tmp_path_factory.mktemp("rules"))


def parse(config: ModelConfig, doc: dict):
    return parse_infer_request(config, orjson.dumps(doc), capacity_bytes=1 << 20, future=None, allow_faults=False)


def x_input(name: str = "x") -> dict:
    return {"name": name, "datatype": "FP32", "shape": [WIDTH], "data": [1.0] * WIDTH}


# -- optional inputs --------------------------------------------------------------------------------
def test_an_optional_input_that_is_a_graph_initializer_is_served_and_shown_in_the_config(repo: Path):
    config = load_model(repo, "opt")
    assert [(t.name, t.optional) for t in config.inputs] == [("x", False), ("bias", True)]
    assert config.required_inputs == ("x",)
    assert config.to_json()["input"][1] == {"name": "bias", "data_type": "TYPE_FP32", "dims": [WIDTH],
                                            "optional": True}


def test_an_optional_input_on_a_batching_model_fails_it_with_tritons_reason(repo: Path):
    failed = scan_repository(repo).failed
    assert "optional input 'bias' is not supported for models that support batching" in failed["opt_batched"]


def test_optional_must_be_a_boolean(repo: Path, tmp_path: Path):
    doc = json.loads((repo / "opt" / "config.json").read_text())
    doc["input"][1]["optional"] = "yes"
    with pytest.raises(ConfigError, match="must be true or false"):
        ModelConfig.from_json("opt", doc, version=1, model_path="/m/1/model.onnx")


def test_a_request_may_leave_an_optional_input_out_and_keys_its_batch_by_the_inputs_it_gives(repo: Path):
    config = load_model(repo, "opt")
    without = parse(config, {"inputs": [x_input()]})
    given = parse(config, {"inputs": [x_input(), x_input("bias")]})
    assert list(without.inputs) == ["x"] and list(given.inputs) == ["x", "bias"]
    assert without.shape_key != given.shape_key  # (so they never share a batch)
    assert without.shape_key == parse(config, {"inputs": [x_input()]}).shape_key
    with pytest.raises(BadRequest, match=r"^expected number of inputs between 1 and 2 but got 1 inputs for model "
                                         r"'opt'\. Got input\(s\) \['bias'\], but missing required input\(s\) \['x'\]"):
        parse(config, {"inputs": [x_input("bias")]})
    # A model without optional inputs keeps its key of shapes alone (the hot path's).
    plain = ModelConfig(name="m", max_batch_size=4, inputs=(TensorConfig("a", "FP32", (2,)),),
                        outputs=(TensorConfig("y", "FP32", (2,)),), dynamic_batching=DynamicBatching(), version=1,
                        model_path="/m/1/model.onnx")
    request = parse(plain, {"inputs": [{"name": "a", "datatype": "FP32", "shape": [3, 2], "data": [0.0] * 6}]})
    assert request.shape_key == ((2,),)


# -- classification -----------------------------------------------------------------------------------
def test_labels_are_read_as_triton_reads_them_carriage_returns_kept(repo: Path):
    config = load_model(repo, "cls")
    assert config.output("y").labels == tuple(LABELS) and config.output("yi").labels == ()
    assert config.to_json()["output"][0]["label_filename"] == "labels.txt"


def test_a_label_file_that_cannot_be_read_fails_the_model(repo: Path, tmp_path: Path):
    for name, label_filename in (("missing", "nope.txt"), ("outside", "../labels.txt")):
        doc = json.loads((repo / "cls" / "config.json").read_text()) | {"name": name}
        doc["output"][0]["label_filename"] = label_filename
        (tmp_path / name / "1").mkdir(parents=True)
        (tmp_path / name / "1" / "model.onnx").write_bytes((repo / "cls" / "1" / "model.onnx").read_bytes())
        (tmp_path / name / "config.json").write_text(json.dumps(doc))
    (tmp_path / "labels.txt").write_text("a\n")
    failed = scan_repository(tmp_path).failed
    assert "nope.txt cannot be read" in failed["missing"]
    assert "outside the model's directory" in failed["outside"]


@pytest.mark.parametrize("dtype, text", [(np.float32, "%f"), (np.float64, "%f"), (np.int64, "%d"), (np.uint8, "%d")])
def test_classify_writes_tritons_strings_for_every_row(repo: Path, dtype, text):
    config = load_model(repo, "cls")
    rows = np.array([[3, 1, 4, 1, 5, 9], [2, 6, 5, 3, 5, 8]], dtype=dtype)
    answer = classify(config, "y", rows, 4)
    assert answer.shape == (2, 4) and answer.dtype == object
    assert [[item.decode() for item in row] for row in answer] == triton_classes(rows, 4, LABELS, text)


def test_classify_a_model_without_a_batch_dim_answers_one_row_of_k():
    config = ModelConfig(name="nb", max_batch_size=0, inputs=(TensorConfig("x", "FP32", (2, 2)),),
                         outputs=(TensorConfig("y", "FP32", (2, 2)),), dynamic_batching=None, version=1,
                         model_path="/m/1/model.onnx")
    answer = classify(config, "y", np.array([[0.5, 2.0], [-1.0, 1.0]], np.float32), 9)
    assert [a.decode() for a in answer] == ["2.000000:1", "1.000000:3", "0.500000:0", "-1.000000:2"]


@pytest.mark.parametrize("datatype", ["BYTES", "BOOL", "FP16"])
def test_classification_of_a_type_triton_does_not_classify_is_refused_in_its_words(datatype):
    config = ModelConfig(name="m", max_batch_size=0, inputs=(TensorConfig("x", "FP32", (2,)),),
                         outputs=(TensorConfig("y", datatype, (2,)),), dynamic_batching=None, version=1,
                         model_path="/m/1/model.onnx")
    doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [2], "data": [0.0, 1.0]}],
           "outputs": [{"name": "y", "parameters": {"classification": 1}}]}
    with pytest.raises(BadRequest, match=f"^class result not available for output due to unsupported type "
                                         f"'{datatype}'"):
        parse(config, doc)


def test_a_classified_output_is_kept_with_its_count(repo: Path):
    config = load_model(repo, "cls")
    doc = {"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 6], "data": [0.0] * 6}],
           "outputs": [{"name": "y", "parameters": {"classification": 2}}, {"name": "yi"}]}
    request = parse(config, doc)
    assert request.classes == {"y": 2} and request.requested_outputs == ["y", "yi"]
    assert parse(config, {**doc, "outputs": [{"name": "y", "parameters": {"classification": 0}}]}).classes is None
