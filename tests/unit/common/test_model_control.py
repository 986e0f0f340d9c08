"""common/repository/control.py: Triton's load parameters, the served repository of explicit mode, poll's fingerprint."""
from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from ringserve.common.repository.control import (
    LoadParameterError,
    LoadRequest,
    ServedRepository,
    fingerprint,
    parse_load_parameters,
)
from ringserve.common.repository.scan import scan_repository
from tests.support.lifecycle_models import build_versioned, versioned_model

CONFIG = {"backend": "onnxruntime", "max_batch_size": 4,
          "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": ["4"]}],
          "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": ["1"]}]}


def test_a_config_and_files_are_read_from_base64_over_http_and_bytes_over_grpc():
    over_http = parse_load_parameters({"config": json.dumps(CONFIG), "file:1/model.onnx": base64.b64encode(b"onnx").decode()})
    over_grpc = parse_load_parameters({"config": json.dumps(CONFIG), "file:1/model.onnx": b"onnx"})

    assert over_http == over_grpc == LoadRequest(CONFIG, {"1/model.onnx": b"onnx"})


@pytest.mark.parametrize(("params", "words"), [
    ({"config": "{"}, "Invalid config override"),
    ({"config": "[]"}, "Invalid config override"),
    ({"file:1/model.onnx": b"x"}, "Load parameter 'config' must be specified for model file override"),
    ({"config": "{}", "file:../../etc/passwd": b"x"}, "must stay within model directory."),
    ({"config": "{}", "file:/etc/passwd": b"x"}, "must stay within model directory."),
    ({"config": "{}", "file:1/model.onnx": "not base64!"}, "must have base64-encoded contents"),
    ({"config": 7}, "Unrecognized load parameter 'config' with type 'INT'"),
    ({"colour": True}, "Unrecognized load parameter 'colour' with type 'BOOL'"),
])
def test_parameters_triton_refuses_are_refused_in_its_words(params, words):
    with pytest.raises(LoadParameterError) as refused:
        parse_load_parameters(params)

    assert words in str(refused.value)


def test_the_served_repository_holds_the_models_named_and_each_load_swaps_one_entry(tmp_path: Path):
    repo = tmp_path / "repo"
    build_versioned(repo, "a", weight_bytes=64)
    build_versioned(repo, "b", weight_bytes=64)
    served = ServedRepository(tmp_path / "run" / "repository", repo)
    (tmp_path / "run").mkdir()

    assert served.create(["a", "ghost"]) == ["ghost"]
    assert list(scan_repository(served.served).versions) == ["a"]

    served.override("b", LoadRequest(CONFIG, {"3/model.onnx": versioned_model("b", 3, 64).SerializeToString()}))
    scan = scan_repository(served.served)
    assert sorted(scan.versions) == ["a", "b"] and scan.versions["b"][-1].version == 3
    assert scan.versions["b"][-1].max_batch_size == 4

    served.override("a", LoadRequest(CONFIG))  # config alone: the repository's version folders beside it
    assert scan_repository(served.served).versions["a"][-1].max_batch_size == 4
    served.link("a")
    assert scan_repository(served.served).versions["a"][-1].max_batch_size == 64
    assert list((tmp_path / "run" / "overrides").iterdir()) != []  # b's, still served

    assert served.remove("b") and not served.remove("b")
    assert served.names() == ["a"] and list((tmp_path / "run" / "overrides").iterdir()) == []
    assert served.create(["*"]) == [] and served.names() == ["a", "b"]


def test_the_fingerprint_changes_with_a_model_added_removed_or_rewritten(tmp_path: Path):
    build_versioned(tmp_path, "a", weight_bytes=64)
    before = fingerprint(tmp_path)
    build_versioned(tmp_path, "b", weight_bytes=64)
    added = fingerprint(tmp_path)
    (tmp_path / "a" / "1" / "model.onnx").write_bytes(b"new weights, longer than the old ones" * 100)

    assert set(added) == {"a", "b"} and added["a"] == before["a"]
    assert fingerprint(tmp_path)["a"] != before["a"]
    assert fingerprint(tmp_path / "missing") == {}
