"""Python models' and ensembles' configs: the kinds, the repository scan, and the gateway serving the
config a worker completed (READY's `configs`), without ever importing a model.py itself."""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ringserve.common.repository.demo import build_demo_models
from ringserve.common.errors import ConfigError
from ringserve.common.messages import CompletedConfig
from ringserve.common.repository.config import ModelConfig
from ringserve.common.repository.kinds import kind_of
from ringserve.common.repository.scan import AwaitingWorkerConfig, load_model, scan_repository
from ringserve.gateway.dispatch.catalog import Catalog
from ringserve.gateway.core.errors import Unavailable
from ringserve.worker.python.python_model import completer

from tests.support.python_models import build_pipeline, build_triton_examples, copy_example, write_python_model


def test_the_kinds_and_what_is_refused_names_what_is_served():
    assert kind_of("onnxruntime_onnx", None) == kind_of("onnxruntime_onnx", "onnxruntime") == "onnx"
    assert kind_of("", "onnxruntime") == "onnx"  # Triton's backend field alone names the platform too
    assert kind_of("", "python") == "python" and kind_of("ensemble", None) == "ensemble"
    with pytest.raises(ConfigError, match="platform 'tensorrt_plan' is not served; served: .*'python'"):
        kind_of("tensorrt_plan", None)
    with pytest.raises(ConfigError, match="names no platform"):
        kind_of("onnxruntime_onnx", "python")


def test_a_python_model_is_read_without_importing_its_model_py(tmp_path):
    build_triton_examples(tmp_path)
    (tmp_path / "add_sub" / "1" / "model.py").write_text("raise SystemExit('imported!')\n")  # (would end the test)

    config = load_model(tmp_path, "add_sub")

    assert (config.kind, config.platform, config.max_batch_size) == ("python", "", 0)
    assert config.model_path.endswith("add_sub/1/model.py") and config.to_json()["backend"] == "python"


def test_a_model_dir_with_only_a_model_py_is_python_and_awaits_its_completion_outside_workers(tmp_path):
    copy_example(tmp_path, "batch_auto_complete", "auto_complete/batch_model.py", None)

    scan = scan_repository(tmp_path)

    assert scan.versions == {} and scan.failed == {}
    assert "auto_complete_config completes it in a worker" in scan.awaiting["batch_auto_complete"]
    with pytest.raises(AwaitingWorkerConfig):
        load_model(tmp_path, "batch_auto_complete")


def test_a_worker_completes_the_config_with_model_py_and_the_gateway_serves_what_it_reports(tmp_path):
    copy_example(tmp_path, "batch_auto_complete", "auto_complete/batch_model.py", None)
    marker = tmp_path / "marker"
    in_worker = scan_repository(tmp_path, complete=completer(marker, set()))
    config = in_worker.defaults()["batch_auto_complete"]
    assert (config.max_batch_size, [t.name for t in config.inputs]) == (4, ["INPUT0", "INPUT1"])
    assert config.dynamic_batching is not None and not marker.exists()

    gateway_scan = scan_repository(tmp_path)
    catalog = Catalog(gateway_scan.defaults(), 1 << 20)
    catalog.add_repository(gateway_scan)
    with pytest.raises(Unavailable, match="no worker has reported it yet"):
        catalog.check_failed("batch_auto_complete")

    catalog.adopt((CompletedConfig(config.key, config.version, config.model_path, config.to_json()),))

    assert catalog.configs["batch_auto_complete"] == config and "batch_auto_complete" in catalog.queues
    catalog.check_failed("batch_auto_complete")  # (served now: nothing to say)


def test_a_quarantined_model_py_is_not_even_imported_by_the_scan(tmp_path):
    write_python_model(tmp_path, "doomed", "raise RuntimeError('imported')\n",
                       {"max_batch_size": 0, "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [1]}],
                        "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [1]}]})

    assert scan_repository(tmp_path, complete=completer(None, {"doomed"})).failed == {}
    assert "RuntimeError: imported" in scan_repository(tmp_path, complete=completer(None, set())).failed["doomed"]


def test_an_ensemble_is_checked_against_its_steps(tmp_path):
    build_demo_models(tmp_path / "demo")
    shutil.copytree(tmp_path / "demo" / "mlp", tmp_path / "repo" / "mlp")
    build_pipeline(tmp_path / "repo")
    scan = scan_repository(tmp_path / "repo")
    pipeline = scan.defaults()["pipeline"]
    assert [s.model_name for s in pipeline.ensemble_steps] == ["preprocess", "mlp"] and not scan.failed

    text = (tmp_path / "repo" / "pipeline" / "config.pbtxt").read_text()
    (tmp_path / "repo" / "pipeline" / "config.pbtxt").write_text(text.replace('key: "y"', 'key: "logits"'))
    failed = scan_repository(tmp_path / "repo").failed["pipeline"]
    assert "['logits'] are not outputs of model 'mlp'" in failed


def test_ensemble_steps_run_in_the_order_their_tensors_are_made():
    doc = {"name": "e", "platform": "ensemble", "max_batch_size": 0,
           "input": [{"name": "A", "data_type": "TYPE_FP32", "dims": [1]}],
           "output": [{"name": "C", "data_type": "TYPE_FP32", "dims": [1]}],
           "ensemble_scheduling": {"step": [
               {"model_name": "second", "input_map": {"i": "B"}, "output_map": {"o": "C"}},
               {"model_name": "first", "input_map": {"i": "A"}, "output_map": {"o": "B"}}]}}
    config = ModelConfig.from_json("e", doc, version=1, model_path="/r/e/1")

    assert [s.model_name for s in config.ensemble_steps] == ["first", "second"]
    doc["ensemble_scheduling"]["step"][1]["input_map"] = {"i": "Z"}
    with pytest.raises(ConfigError, match=r"\['B', 'Z'\] are neither ensemble inputs nor made by another step"):
        ModelConfig.from_json("e", doc, version=1, model_path="/r/e/1")


@pytest.mark.parametrize("extra, where", [
    ({"parameters": {"EXECUTION_ENV_PATH": {"string_value": "$$TRITON_MODEL_DIRECTORY/env.tar.gz"}}},
     "parameters.EXECUTION_ENV_PATH"),
    ({"batch_input": [{"kind": "BATCH_ELEMENT_COUNT", "target_name": ["n"], "data_type": "TYPE_INT32",
                       "source_input": ["x"]}]}, "batch_input"),
])
def test_python_model_fields_that_are_not_served_are_refused_by_name(extra, where):
    doc = {"backend": "python", "max_batch_size": 4, "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [1]}],
           "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [1]}], **extra}
    with pytest.raises(ConfigError) as info:
        ModelConfig.from_json("m", doc, version=1, model_path="/r/m/1/model.py")
    assert info.value.field == where


def test_decoupled_is_for_python_models_only():
    doc = {"platform": "onnxruntime_onnx", "max_batch_size": 0, "model_transaction_policy": {"decoupled": True},
           "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [1]}],
           "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [1]}]}
    with pytest.raises(ConfigError, match="only backend: \"python\" models may be decoupled"):
        ModelConfig.from_json("m", doc, version=1, model_path="/r/m/1/model.onnx")


def test_a_completed_config_survives_the_trip_to_the_gateway_unchanged(tmp_path: Path):
    build_triton_examples(tmp_path)
    for config in scan_repository(tmp_path, complete=completer(None, set())).all_versions():
        again = ModelConfig.from_json(config.name, config.to_json(), version=config.version,
                                      model_path=config.model_path, default_version=config.default_version)
        assert again == config and again.to_json() == config.to_json()


def test_another_lanes_model_py_is_not_imported_unless_its_config_needs_completing(tmp_path):
    """--lanes model: a lane scans every model, but imports only its own model.py files, and another lane's
    only where its config declares no tensor (its import's crash or memory is that lane's alone)."""
    write_python_model(tmp_path, "doomed", "raise RuntimeError('imported')\n",
                       {"max_batch_size": 0, "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [1]}],
                        "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [1]}]})
    copy_example(tmp_path, "batch_auto_complete", "auto_complete/batch_model.py", None)
    elsewhere = completer(None, set(), mine=lambda name: False)

    scan = scan_repository(tmp_path, complete=elsewhere)

    assert scan.failed == {} and scan.awaiting == {}
    assert [t.name for t in scan.versions["doomed"][-1].inputs] == ["x"]  # as written
    assert scan.versions["batch_auto_complete"][-1].inputs  # completed by its model.py
    assert "RuntimeError: imported" in scan_repository(
        tmp_path, complete=completer(None, set(), mine=lambda name: True)).failed["doomed"]
