from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from ringserve.common.repository.datatypes import KSERVE_DATATYPES, kserve_datatype_from_ort, numpy_dtype
from ringserve.common.errors import ConfigError
from ringserve.common.repository.lifecycle import InstanceGroup, Lifecycle, VersionPolicy
from ringserve.common.repository.batching import MAX_PRIORITY_LEVELS, DynamicBatching, QueuePolicy
from ringserve.common.repository.config import MAX_TENSOR_DIMS, ModelConfig, TensorConfig
from ringserve.common.repository.onnx_graph import AUTO_MAX_BATCH_SIZE
from ringserve.common.repository.scan import load_model, scan_repository

ORT_TYPES = {
    "BOOL": "tensor(bool)", "UINT8": "tensor(uint8)", "UINT16": "tensor(uint16)", "UINT32": "tensor(uint32)",
    "UINT64": "tensor(uint64)", "INT8": "tensor(int8)", "INT16": "tensor(int16)", "INT32": "tensor(int32)",
    "INT64": "tensor(int64)", "FP16": "tensor(float16)", "FP32": "tensor(float)", "FP64": "tensor(double)",
    "BYTES": "tensor(string)",
}


def write_onnx(path: Path, in_shape: list, out_shape: list, elem_type: int = TensorProto.FLOAT) -> Path:
    """A one-node graph x -> Identity -> y, plus an initializer that is also listed as an input."""
    x = helper.make_tensor_value_info("x", elem_type, in_shape)
    y = helper.make_tensor_value_info("y", elem_type, out_shape)
    w = helper.make_tensor_value_info("w", TensorProto.FLOAT, [1])
    init = helper.make_tensor("w", TensorProto.FLOAT, [1], [0.0])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x, w], [y], initializer=[init])
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(helper.make_model(graph), str(path))
    return path


def write_model(repo: Path, name: str, version: int = 1, config: dict | None = None,
                in_shape: list | None = None, out_shape: list | None = None) -> None:
    write_onnx(repo / name / str(version) / "model.onnx", in_shape or ["batch", 4], out_shape or ["batch", 4])
    if config is not None:
        (repo / name / "config.json").write_text(json.dumps(config))


def valid_doc() -> dict:
    return {
        "name": "mlp",
        "max_batch_size": 8,
        "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}],
        "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [-1]}],
        "dynamic_batching": {"preferred_batch_size": [4, 8], "max_queue_delay_microseconds": 100,
                             "default_queue_policy": {"default_timeout_microseconds": 5000, "max_queue_size": 16}},
    }


def from_doc(doc: dict) -> ModelConfig:
    return ModelConfig.from_json("mlp", doc, version=1, model_path="/models/mlp/1/model.onnx")


# --- datatypes ---------------------------------------------------------------------------

def test_datatype_table_covers_kserve_names():
    assert KSERVE_DATATYPES == set(ORT_TYPES)


@pytest.mark.parametrize("datatype", sorted(ORT_TYPES))
def test_datatype_round_trips_through_ort_and_triton(datatype):
    assert kserve_datatype_from_ort(ORT_TYPES[datatype]) == datatype
    tensor = TensorConfig("t", datatype, (2,))
    assert TensorConfig.from_json(tensor.to_json()) == tensor


def test_numpy_dtypes():
    assert numpy_dtype("FP32") == np.float32
    assert numpy_dtype("FP16") == np.float16
    assert numpy_dtype("INT64") == np.int64
    assert numpy_dtype("BOOL") == np.bool_
    assert numpy_dtype("BYTES") == np.dtype(object)
    assert TensorConfig("t", "UINT16", ()).np_dtype == np.uint16


def test_bytes_is_type_string_in_triton_json():
    assert TensorConfig("t", "BYTES", (1,)).to_json()["data_type"] == "TYPE_STRING"


def test_unknown_datatypes_are_config_errors():
    with pytest.raises(ConfigError, match="BF16"):
        numpy_dtype("BF16")
    with pytest.raises(ConfigError, match="bfloat16"):
        kserve_datatype_from_ort("tensor(bfloat16)")


# --- JSON form ---------------------------------------------------------------------------

def test_from_json_reads_triton_fields():
    config = from_doc(valid_doc())
    assert config.max_batch_size == 8
    assert config.input("x") == TensorConfig("x", "FP32", (4,))
    assert config.output("y").dims == (-1,)
    assert config.dynamic_batching == DynamicBatching(
        preferred_batch_size=(4, 8), max_queue_delay_us=100,
        default_queue_policy=QueuePolicy(default_timeout_us=5000, max_queue_size=16))


def test_lookup_of_unknown_tensor_is_key_error():
    with pytest.raises(KeyError):
        from_doc(valid_doc()).input("y")


def test_to_json_round_trips():
    config = from_doc(valid_doc())
    again = ModelConfig.from_json(config.name, config.to_json(), version=config.version,
                                  model_path=config.model_path)
    assert again == config
    assert again.to_json() == config.to_json()


def test_kserve_datatype_key_and_string_ints_are_accepted():
    doc = valid_doc()
    doc["input"] = [{"name": "x", "datatype": "INT64", "dims": ["-1", "3"]}]
    doc["max_batch_size"] = "8"
    config = from_doc(doc)
    assert config.input("x") == TensorConfig("x", "INT64", (-1, 3))
    assert config.max_batch_size == 8


def test_every_lifecycle_field_of_ringserves_own_is_accepted():
    doc = {**valid_doc(), "model_load_policy": "lazy", "ttl_s": 30, "eviction_priority": -2}
    config = from_doc(doc)
    assert (config.lifecycle.load_policy, config.lifecycle.eviction_priority) == ("lazy", -2)


def test_a_misspelt_top_level_field_refuses_the_model_naming_the_closest_field():
    doc = valid_doc()
    doc["max_batch_sze"] = doc.pop("max_batch_size")
    with pytest.raises(ConfigError, match=r"unknown field 'max_batch_sze' \(did you mean 'max_batch_size'\?\)"):
        from_doc(doc)


@pytest.mark.parametrize(("change", "where", "unknown", "closest"), [
    (lambda d: d["input"][0].update(data_typ="TYPE_FP32"), "input[0]", "data_typ", "data_type"),
    (lambda d: d["output"][0].update(dim=[4]), "output[0]", "dim", "dims"),
    (lambda d: d["dynamic_batching"].update(max_queue_delay_microsecond=5), "dynamic_batching",
     "max_queue_delay_microsecond", "max_queue_delay_microseconds"),
    (lambda d: d["dynamic_batching"]["default_queue_policy"].update(max_queue_sise=4),
     "dynamic_batching.default_queue_policy", "max_queue_sise", "max_queue_size"),
    (lambda d: d["dynamic_batching"].update(priority_levels=2, priority_queue_policy={"1": {"timeout_acton": "DELAY"}}),
     "dynamic_batching.priority_queue_policy.1", "timeout_acton", "timeout_action"),
    (lambda d: d["dynamic_batching"].update(padding={"mask_inputs": "x"}), "dynamic_batching.padding",
     "mask_inputs", "mask_input"),
    (lambda d: d.update(instance_group=[{"cont": 2}]), "instance_group[0]", "cont", "count"),
    (lambda d: d.update(version_policy={"latest": {"num_version": 2}}), "version_policy.latest", "num_version",
     "num_versions"),
    (lambda d: d.update(model_load_polcy="lazy"), "config.json", "model_load_polcy", "model_load_policy"),
])
def test_a_misspelt_field_at_any_level_refuses_the_model(change, where, unknown, closest):
    doc = valid_doc()
    change(doc)
    with pytest.raises(ConfigError) as info:
        from_doc(doc)
    assert info.value.field == where
    assert info.value.problem == f"unknown field {unknown!r} (did you mean {closest!r}?)"


def test_a_field_like_no_other_is_refused_without_a_guess():
    doc = valid_doc()
    doc["dynamic_batching"]["zzz"] = 2
    with pytest.raises(ConfigError) as info:
        from_doc(doc)
    assert info.value.problem == "unknown field 'zzz'"


def test_a_triton_config_with_the_fields_ringserve_ignores_still_loads():
    doc = valid_doc()
    doc.update(backend="onnxruntime", platform="onnxruntime_onnx", default_model_filename="model.onnx",
               optimization={"execution_accelerators": {"gpu_execution_accelerator": [{"name": "tensorrt"}]}},
               model_transaction_policy={"decoupled": False},
               response_cache={"enable": False}, metric_tags={}, runtime="", cc_model_filenames={},
               model_operations={}, model_repository_agents={},
               instance_group=[{"name": "g", "count": 1, "kind": "KIND_CPU", "rate_limiter": {}}],
               parameters={"intra_op_thread_count": {"string_value": "1"}},
               version_policy={"latest": {"num_versions": 1}}, model_load_policy="eager", warmup=False, ttl_s=0)
    doc["input"][0]["format"] = "FORMAT_NONE"
    doc["output"][0]["label_filename"] = "labels.txt"
    config = from_doc(doc)
    assert config.max_batch_size == 8
    assert config.to_json()["model_transaction_policy"] == {"decoupled": False}  # /config shows what was written


def test_tritons_fields_that_ringserve_does_not_implement_are_refused_as_such():
    doc = valid_doc()
    doc["input"][0]["is_non_linear_format_io"] = True
    with pytest.raises(ConfigError, match="Triton's field 'is_non_linear_format_io' is not supported by ringserve"):
        from_doc(doc)


def test_ensemble_scheduling_on_an_onnx_model_is_refused_naming_the_platform_it_is_for():
    doc = valid_doc()
    doc["ensemble_scheduling"] = {"step": [{"model_name": "a", "model_version": -1}]}
    with pytest.raises(ConfigError, match="'ensemble_scheduling' is for platform: \"ensemble\" models only"):
        from_doc(doc)


def test_triton_queue_controls_are_parsed_with_their_names():
    doc = valid_doc()
    doc["dynamic_batching"].update(priority_levels=3, default_priority_level=2, preserve_ordering=True,
                                   priority_queue_policy={"1": {"timeout_action": "DELAY", "max_queue_size": 4}})
    doc["dynamic_batching"]["default_queue_policy"].update(timeout_action="DELAY", allow_timeout_override=True)
    batching = from_doc(doc).dynamic_batching
    assert (batching.priority_levels, batching.default_priority_level, batching.preserve_ordering) == (3, 2, True)
    assert batching.default_queue_policy == QueuePolicy("DELAY", 5000, True, 16)
    assert batching.policy_for(1) == QueuePolicy("DELAY", 0, False, 4)
    assert batching.policy_for(3) is batching.default_queue_policy
    assert DynamicBatching.from_json(batching.to_json()) == batching


def test_unknown_queue_policy_key_is_an_error():
    doc = valid_doc()
    doc["dynamic_batching"]["default_queue_policy"]["timeout_actoin"] = "DELAY"
    with pytest.raises(ConfigError, match="timeout_actoin"):
        from_doc(doc)


def test_unknown_top_level_keys_are_kept():
    doc = valid_doc()
    doc["instance_group"] = [{"count": 2}]
    assert from_doc(doc).to_json()["instance_group"] == [{"count": 2}]


@pytest.mark.parametrize(("change", "field"), [
    (lambda d: d.update(max_batch_size=-3), "max_batch_size"),
    (lambda d: d.update(name="other"), "name"),
    (lambda d: d.update(platform="tensorflow_savedmodel"), "platform"),
    (lambda d: d["input"].append({"name": "x", "data_type": "TYPE_FP32", "dims": [4]}), "input"),
    (lambda d: d["output"].append({"name": "y", "data_type": "TYPE_FP32", "dims": [4]}), "output"),
    (lambda d: d.update(input=[]), "input"),
    (lambda d: d["input"][0].update(name=""), "name"),
    (lambda d: d["input"][0].update(data_type="TYPE_FP8"), "datatype"),
    (lambda d: d["input"][0].pop("data_type") and d["input"][0].update(datatype="FP8"), "data_type"),
    (lambda d: d["input"][0].pop("data_type"), "data_type"),
    (lambda d: d["input"][0].update(dims=[0]), "dims"),
    (lambda d: d["input"][0].update(dims=[-2]), "dims"),
    (lambda d: d["input"][0].update(dims=[1.5]), "dims"),
    (lambda d: d["input"][0].update(reshape={"shape": [2, 3]}), "input.reshape"),
    (lambda d: d["input"][0].update(is_shape_tensor=True), "is_shape_tensor"),
    (lambda d: d["dynamic_batching"].update(preferred_batch_size=[16]), "dynamic_batching.preferred_batch_size"),
    (lambda d: d["dynamic_batching"].update(preferred_batch_size=[0]), "dynamic_batching.preferred_batch_size"),
    (lambda d: d["dynamic_batching"].update(max_queue_delay_microseconds=-1),
     "dynamic_batching.max_queue_delay_microseconds"),
    (lambda d: d["dynamic_batching"]["default_queue_policy"].update(default_timeout_microseconds=-1),
     "default_timeout_microseconds"),
    (lambda d: d["dynamic_batching"]["default_queue_policy"].update(max_queue_size=-1), "max_queue_size"),
    (lambda d: d.update(max_batch_size=0), "dynamic_batching"),
])
def test_invalid_config_names_the_field(change, field):
    doc = valid_doc()
    change(doc)
    with pytest.raises(ConfigError) as info:
        from_doc(doc)
    assert "model 'mlp': config field '" in str(info.value)
    assert field in info.value.field


def test_config_error_message_format():
    assert str(ConfigError("mlp", "max_batch_size", "must be >= 0, got -3")) == \
        "model 'mlp': config field 'max_batch_size': must be >= 0, got -3"
    with pytest.raises(ConfigError, match="^model 'mlp': config field 'max_batch_size': must be >= 0, got -3$"):
        from_doc({**valid_doc(), "max_batch_size": -3, "dynamic_batching": None})


def test_version_must_be_positive():
    with pytest.raises(ConfigError, match="'version'"):
        ModelConfig.from_json("mlp", valid_doc(), version=0, model_path="/m.onnx")


# --- auto-complete from the ONNX graph ----------------------------------------------------

def test_symbolic_batch_dim_gives_default_max_batch_size(tmp_path):
    path = write_onnx(tmp_path / "m" / "3" / "model.onnx", ["batch", "seq", 8], ["batch", "seq", 8])
    config = load_model(tmp_path, "m")  # no config.json
    assert config.max_batch_size == AUTO_MAX_BATCH_SIZE == 64
    assert config.inputs == (TensorConfig("x", "FP32", (-1, 8)),)  # the initializer "w" is not an input
    assert config.outputs == (TensorConfig("y", "FP32", (-1, 8)),)
    assert config.dynamic_batching == DynamicBatching()
    assert config.version == 3
    assert config.model_path == str(path)


def test_unknown_batch_dim_counts_as_symbolic(tmp_path):
    write_onnx(tmp_path / "m" / "1" / "model.onnx", [None, 8], [None, 8], TensorProto.INT64)
    config = load_model(tmp_path, "m")
    assert config.max_batch_size == 64
    assert config.input("x") == TensorConfig("x", "INT64", (8,))


def test_fixed_first_dim_means_no_batching(tmp_path):
    write_onnx(tmp_path / "m" / "1" / "model.onnx", [1, 8], [1, 8])
    config = load_model(tmp_path, "m")
    assert config.max_batch_size == 0
    assert config.input("x").dims == (1, 8)
    assert config.dynamic_batching is None


def test_config_without_tensors_is_completed_from_graph(tmp_path):
    write_model(tmp_path, "m", config={"max_batch_size": 16, "dynamic_batching": {}},
                in_shape=["b", 3, "s"], out_shape=["b", 3, "s"])
    config = load_model(tmp_path, "m")
    assert config.max_batch_size == 16
    assert config.input("x") == TensorConfig("x", "FP32", (3, -1))
    assert config.output("y") == TensorConfig("y", "FP32", (3, -1))


def test_config_with_no_batching_keeps_full_shape(tmp_path):
    write_model(tmp_path, "m", config={"max_batch_size": 0})
    assert load_model(tmp_path, "m").input("x").dims == (-1, 4)


@pytest.mark.parametrize(("tensor", "expected"), [
    ({"name": "x", "data_type": "TYPE_INT32", "dims": [4]}, "'x' is INT32 in config.json but FP32"),
    ({"name": "z", "data_type": "TYPE_FP32", "dims": [4]}, "'z' is not an input"),
    ({"name": "x", "data_type": "TYPE_FP32", "dims": [5]}, "'x' has shape"),
    ({"name": "x", "data_type": "TYPE_FP32", "dims": [4, 1]}, "'x' has shape"),
])
def test_config_that_disagrees_with_graph_is_rejected(tmp_path, tensor, expected):
    write_model(tmp_path, "m", config={"max_batch_size": 4, "input": [tensor]})
    with pytest.raises(ConfigError, match=expected) as info:
        load_model(tmp_path, "m")
    assert info.value.model == "m"
    assert info.value.field == "input"


def test_batching_a_graph_with_fixed_first_dim_is_rejected(tmp_path):
    write_model(tmp_path, "m", config={"max_batch_size": 4}, in_shape=[1, 4], out_shape=[1, 4])
    with pytest.raises(ConfigError, match=r"\[-1, 4\] in config.json .* but \[1, 4\]"):
        load_model(tmp_path, "m")


def test_output_datatype_mismatch_names_output(tmp_path):
    write_model(tmp_path, "m", config={"output": [{"name": "y", "data_type": "TYPE_FP64", "dims": [4]}]})
    with pytest.raises(ConfigError, match="config field 'output': 'y' is FP64"):
        load_model(tmp_path, "m")


def test_invalid_json_is_config_error(tmp_path):
    write_model(tmp_path, "m")
    (tmp_path / "m" / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="config.json"):
        load_model(tmp_path, "m")


# --- repository --------------------------------------------------------------------------

def test_a_scan_serves_the_highest_version_and_skips_non_models(tmp_path):
    for version in (1, 2, 10):
        write_model(tmp_path, "b_model", version=version)
    (tmp_path / "b_model" / "11").mkdir()  # a version without model.onnx is not a candidate
    write_model(tmp_path, "a_model", config={"max_batch_size": 0})
    write_model(tmp_path, "..hidden")  # a model (Triton serves '..my_model')
    (tmp_path / "README.md").write_text("not a model")
    (tmp_path / "notes").mkdir()
    (tmp_path / ".git" / "objects" / "4b").mkdir(parents=True)  # no config, version folder or .onnx file
    (tmp_path / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    configs = scan_repository(tmp_path).defaults()
    assert list(configs) == ["..hidden", "a_model", "b_model"]
    assert configs["b_model"].version == 10
    assert configs["b_model"].model_path == str(tmp_path / "b_model" / "10" / "model.onnx")
    assert configs["a_model"].max_batch_size == 0


def test_missing_repository_is_config_error(tmp_path):
    with pytest.raises(ConfigError, match="is not a directory"):
        scan_repository(tmp_path / "nope")


def test_model_without_any_version_is_config_error(tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    (tmp_path / "m" / "1").mkdir()
    assert scan_repository(tmp_path).failed["m"].startswith("model 'm': config field 'version'")


def test_model_onnx_outside_a_version_folder_fails_saying_what_was_found_and_what_is_expected(tmp_path):
    write_onnx(tmp_path / "flat" / "model.onnx", ["batch", 4], ["batch", 4])  # no config.json, no 1/
    write_onnx(tmp_path / "beside" / "model.onnx", ["batch", 4], ["batch", 4])
    (tmp_path / "beside" / "config.json").write_text(json.dumps({"max_batch_size": 8}))
    scan = scan_repository(tmp_path)
    assert scan.versions == {}
    for name in ("flat", "beside"):
        assert scan.failed[name] == (
            f"model '{name}': config field 'version': found model.onnx directly in {tmp_path / name}, outside a "
            f"version folder; expected {tmp_path / name}/<version>/model.onnx, e.g. {tmp_path / name}/1/model.onnx "
            "(Triton's layout)")


def test_a_misspelt_field_in_config_json_fails_that_model_and_the_others_serve(tmp_path):
    write_model(tmp_path, "good")
    write_model(tmp_path, "typo", config={"max_batch_sze": 8})
    scan = scan_repository(tmp_path)
    assert list(scan.versions) == ["good"]
    assert scan.failed["typo"].endswith("unknown field 'max_batch_sze' (did you mean 'max_batch_size'?)")


def test_config_that_leaves_out_a_graph_input_is_rejected(tmp_path):
    a, b, y = (helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", 4]) for n in "aby")
    graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["y"])], "g", [a, b], [y])
    (tmp_path / "m" / "1").mkdir(parents=True)
    onnx.save(helper.make_model(graph), str(tmp_path / "m" / "1" / "model.onnx"))
    (tmp_path / "m" / "config.json").write_text(json.dumps(
        {"max_batch_size": 4, "input": [{"name": "a", "data_type": "TYPE_FP32", "dims": [4]}]}))
    with pytest.raises(ConfigError, match=r"the ONNX graph also needs \['b'\]"):
        load_model(tmp_path, "m")


# --- lifecycle: versions, load policy, TTL, instance groups -----------------------------------

@pytest.mark.parametrize("policy, served", [
    (None, [10]),
    ({"latest": {"num_versions": 2}}, [2, 10]),
    ({"latest": {"num_versions": "5"}}, [1, 2, 10]),
    ({"all": {}}, [1, 2, 10]),
    ({"specific": {"versions": [1, 2, 7]}}, [1, 2]),
])
def test_version_policy_selects_versions_as_triton_does(tmp_path, policy, served):
    for version in (1, 2, 10):
        write_model(tmp_path, "m", version=version, config={} if policy is None else {"version_policy": policy})
    configs = scan_repository(tmp_path).versions["m"]
    assert [c.version for c in configs] == served
    assert [c.default_version for c in configs] == [False] * (len(served) - 1) + [True]
    assert [c.key for c in configs] == [f"m/{v}" for v in served[:-1]] + ["m"]
    assert load_model(tmp_path, "m").version == served[-1]  # unversioned requests reach the highest served


def test_a_specific_policy_that_selects_nothing_on_disk_is_a_config_error(tmp_path):
    write_model(tmp_path, "m", config={"version_policy": {"specific": {"versions": [3]}}})
    with pytest.raises(ConfigError, match=r"config field 'version_policy': .* selects none of the versions on disk \(\[1\]\)"):
        load_model(tmp_path, "m")


@pytest.mark.parametrize("doc, field", [
    ({"version_policy": {"newest": {}}}, "version_policy"),
    ({"version_policy": {"latest": {}, "all": {}}}, "version_policy"),
    ({"version_policy": {"latest": {"num_versions": 0}}}, "version_policy.latest.num_versions"),
    ({"version_policy": {"specific": {"versions": []}}}, "version_policy.specific.versions"),
    ({"version_policy": {"specific": {"versions": [0]}}}, "version_policy.specific.versions"),
    ({"model_load_policy": "sometimes"}, "model_load_policy"),
    ({"ttl_s": -1}, "ttl_s"),
    ({"ttl_s": "600"}, "ttl_s"),
    ({"warmup": "yes"}, "warmup"),
    ({"instance_group": {"count": 1}}, "instance_group"),
    ({"instance_group": [{"count": 0}]}, "instance_group.count"),
    ({"instance_group": [{"kind": "KIND_TPU"}]}, "instance_group.kind"),
    ({"instance_group": [{"kind": "KIND_CPU", "gpus": [0]}]}, "instance_group.gpus"),
])
def test_invalid_lifecycle_settings_name_the_field(doc, field):
    with pytest.raises(ConfigError) as info:
        from_doc({**valid_doc(), **doc})
    assert "model 'mlp': config field '" in str(info.value) and info.value.field == field


def test_lifecycle_settings_are_read_and_kept_verbatim():
    doc = {**valid_doc(), "model_load_policy": "lazy", "warmup": True, "ttl_s": 600,
           "version_policy": {"latest": {"num_versions": 2}},
           "instance_group": [{"count": 2, "kind": "KIND_GPU", "gpus": [0, 1]}]}
    config = from_doc(doc)
    assert config.lifecycle == Lifecycle(load_policy="lazy", warmup=True, ttl_s=600.0,
                                         version_policy=VersionPolicy("latest", num_versions=2),
                                         instance_groups=(InstanceGroup(2, "KIND_GPU", (0, 1)),))
    assert config.to_json()["version_policy"] == {"latest": {"num_versions": 2}}
    assert from_doc(config.to_json()) == config
    assert from_doc(valid_doc()).lifecycle == Lifecycle()  # eager, no warmup, no TTL, latest 1


def test_instance_groups_decide_placement_and_eager_loads():
    gpu = Lifecycle(instance_groups=(InstanceGroup(1, "KIND_GPU", (3, 1)),))
    assert (gpu.instance_count, gpu.gpus, gpu.cpu_only) == (2, (1, 3), False)  # one per listed GPU
    assert [gpu.device_for(worker, worker_device=0) for worker in range(3)] == [1, 3, 1]
    assert Lifecycle().device_for(5, worker_device=2) == 2  # no gpus: the worker's own (--gpus)
    assert [gpu.eager_on(i) for i in range(3)] == [True, True, False]
    assert Lifecycle(instance_groups=(InstanceGroup(1, "KIND_CPU"),)).cpu_only
    assert Lifecycle().instance_count == 0 and Lifecycle().eager_on(7)
    assert not Lifecycle(load_policy="lazy").eager_on(0)


def test_scan_serves_every_good_model_and_says_why_the_others_fail(tmp_path):
    write_model(tmp_path, "good")
    for version in (1, 2):
        write_model(tmp_path, "multi", version=version, config={"version_policy": {"all": {}}})
    (tmp_path / "multi" / "2" / "model.onnx").write_bytes(b"garbage")  # no tensors declared: unreadable
    write_model(tmp_path, "declared", config={"max_batch_size": 8,
                                              "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}],
                                              "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [4]}]})
    (tmp_path / "declared" / "1" / "model.onnx").write_bytes(b"garbage")
    write_model(tmp_path, "broken", config={"max_batch_size": -1})

    scan = scan_repository(tmp_path)

    assert sorted(scan.versions) == ["declared", "good", "multi"]
    assert [c.key for c in scan.versions["multi"]] == ["multi"]  # version 1, the highest that could be read
    assert "cannot be read" in scan.failed["multi/2"]
    assert scan.versions["declared"][0].input("x").dims == (4,)  # as declared: the runtime will say what is wrong
    assert "max_batch_size" in scan.failed["broken"]
    assert scan.defaults() == {name: configs[-1] for name, configs in scan.versions.items()}


def test_a_scan_for_exit_on_error_fails_a_file_that_is_not_onnx_even_when_config_json_declares_it(tmp_path):
    write_model(tmp_path, "declared", config={"max_batch_size": 8,
                                              "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [4]}],
                                              "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [4]}]})
    (tmp_path / "declared" / "1" / "model.onnx").write_bytes(b"garbage")
    assert list(scan_repository(tmp_path).versions) == ["declared"]  # the worker's runtime will say why
    assert "cannot be read" in scan_repository(tmp_path, unreadable_graph_ok=False).failed["declared"]


def test_priority_levels_are_bounded_and_the_refusal_names_the_bound():
    assert DynamicBatching(priority_levels=MAX_PRIORITY_LEVELS).default_priority_level == 32
    with pytest.raises(ConfigError, match=r"priority_levels.*must be at most 64 .* got 65$"):
        DynamicBatching(priority_levels=MAX_PRIORITY_LEVELS + 1)


def test_a_config_with_millions_of_priority_levels_is_refused_at_load_with_the_bound(tmp_path):
    doc = valid_doc()
    doc["dynamic_batching"]["priority_levels"] = 3_000_000
    write_model(tmp_path, "mlp", config=doc)

    scan = scan_repository(tmp_path)

    assert scan.failed["mlp"] == (
        "model 'mlp': config field 'dynamic_batching.priority_levels': must be at most 64 (ringserve's bound: a "
        "model's queue keeps a lane per level and looks through them for each batch), got 3000000")
    with pytest.raises(ConfigError, match="must be at most 64"):
        load_model(tmp_path, "mlp")


def test_a_tensor_past_the_arrays_bound_of_dims_is_refused_batch_dim_included():
    doc = {**valid_doc(), "max_batch_size": 0, "dynamic_batching": None}
    doc["input"][0]["dims"] = [1] * MAX_TENSOR_DIMS
    assert len(from_doc(doc).inputs[0].dims) == MAX_TENSOR_DIMS  # the most an array has, no batch dim
    with pytest.raises(ConfigError, match=f"tensor 'x' has {MAX_TENSOR_DIMS + 1} dims with the batch dim"):
        from_doc({**doc, "max_batch_size": 8})
    doc["input"][0]["dims"] = [1] * (MAX_TENSOR_DIMS + 1)
    with pytest.raises(ConfigError, match=f"config field 'dims': tensor 'x' has {MAX_TENSOR_DIMS + 1} dims; a "
                                          f"tensor may have at most {MAX_TENSOR_DIMS}$"):
        from_doc(doc)
