"""config.pbtxt: Triton's text config, parsed by protobuf into Triton's ModelConfig, served as its
config.json twin would be."""
from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest
from tritonclient.grpc import model_config_pb2

from ringserve.common.repository.fields import MODEL, Fields
from ringserve.common.errors import ConfigError
from ringserve.common.repository.config import ModelConfig
from ringserve.common.repository.onnx_graph import AUTO_MAX_BATCH_SIZE
from ringserve.common.repository.scan import load_model, scan_repository

from tests.support.pbtxt_models import (BATCHING_JSON, BATCHING_PBTXT, UNBATCHED_JSON, UNBATCHED_PBTXT, build_segsum,
                            build_twice, ragged_json, ragged_pbtxt)


def twins(tmp_path: Path, build, text: str, doc: dict) -> tuple[ModelConfig, ModelConfig]:
    """The config served from `text` as config.pbtxt and from `doc` as config.json, same graph."""
    build(tmp_path / "pbtxt", text)
    build(tmp_path / "json", doc)
    from_pbtxt, from_json = load_model(tmp_path / "pbtxt", doc["name"]), load_model(tmp_path / "json", doc["name"])
    # Only the repository's path differs.
    return dataclasses.replace(from_pbtxt, model_path=from_json.model_path), from_json


def test_dynamic_batching_with_preferred_sizes_and_queue_policies_is_its_json_twin(tmp_path):
    pbtxt, json = twins(tmp_path, build_twice, BATCHING_PBTXT, BATCHING_JSON)
    assert pbtxt == json
    assert pbtxt.to_json() == json.to_json()  # `extra` too: instance_group, version_policy
    batching = pbtxt.dynamic_batching
    assert pbtxt.max_batch_size == 2 and batching.preferred_batch_size == (2,)
    assert batching.priority_levels == 3 and batching.default_priority_level == 2
    assert batching.default_queue_policy.timeout_action == "DELAY"
    assert batching.default_queue_policy.default_timeout_us == 5_000_000
    assert batching.policy_for(1).max_queue_size == 16 and batching.policy_for(1).timeout_action == "REJECT"
    assert pbtxt.lifecycle.version_policy.versions == (1,)  # an int64 list, as ints
    assert [g.kind for g in pbtxt.lifecycle.instance_groups] == ["KIND_CPU"]


@pytest.mark.parametrize("kind", ["BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", "BATCH_ACCUMULATED_ELEMENT_COUNT",
                                  "BATCH_ELEMENT_COUNT"])  # the enum's zero: protobuf's JSON leaves it out
def test_ragged_input_with_batch_input_is_its_json_twin(tmp_path, kind):
    pbtxt, json = twins(tmp_path, build_segsum, ragged_pbtxt(kind), ragged_json(kind))
    assert pbtxt == json and pbtxt.to_json() == json.to_json()
    assert pbtxt.ragged_inputs == {"INPUT"}
    assert [(b.kind, b.target_name, b.source_input) for b in pbtxt.batch_inputs] == [(kind, "OFFSETS", "INPUT")]


def test_max_batch_size_0_is_kept_although_protobuf_drops_a_zero(tmp_path):
    pbtxt, json = twins(tmp_path, build_twice, UNBATCHED_PBTXT, UNBATCHED_JSON)
    assert pbtxt == json and pbtxt.to_json() == json.to_json()
    assert pbtxt.max_batch_size == 0 and pbtxt.dynamic_batching is None
    assert pbtxt.input("x").dims == (-1, 4)


def test_max_batch_size_0_alone_and_left_out_are_the_json_twins(tmp_path):
    """Written, 0 is 0; left out, it is auto-completed from the graph, as in config.json."""
    pbtxt, json = twins(tmp_path / "zero", build_twice, 'name: "twice"\nmax_batch_size: 0  # no batch dim\n',
                        {"name": "twice", "max_batch_size": 0})
    assert pbtxt == json and pbtxt.max_batch_size == 0
    # A comment or a nested field of that name is not the top-level field.
    pbtxt, json = twins(tmp_path / "auto", build_twice,
                        'name: "twice"  # max_batch_size: 0\nparameters { key: "max_batch_size" value { string_value: "0" } }\n',
                        {"name": "twice", "parameters": {"max_batch_size": {"string_value": "0"}}})
    assert pbtxt == json and pbtxt.max_batch_size == AUTO_MAX_BATCH_SIZE


def test_both_files_is_an_error_naming_both(tmp_path):
    build_twice(tmp_path, BATCHING_JSON)
    (tmp_path / "twice" / "config.pbtxt").write_text(BATCHING_PBTXT)
    with pytest.raises(ConfigError, match=r"holds both config\.json and config\.pbtxt; keep one"):
        load_model(tmp_path, "twice")
    scan = scan_repository(tmp_path)
    assert not scan.versions and "both config.json and config.pbtxt" in scan.failed["twice"]


@pytest.mark.parametrize("text, where", [
    ('name: "twice"\nmax_batch_sze: 2\n', r':2:1 : Message type "inference.ModelConfig" has no field named "max_batch_sze"'),
    ('name: "twice"\nmax_batch_size: 2\ninput [ { name: "x" data_type: TYPE_FP33 } ]\n', r':3:\d+ : .*TYPE_FP33'),
    ('name: "twice"\ndynamic_batching {\n  preferred_batch_size: [ 2 ]\n', r':3:\d+ : Expected "}"'),
])
def test_a_pbtxt_that_does_not_parse_says_where(tmp_path, text, where):
    build_twice(tmp_path, text)
    path = tmp_path / "twice" / "config.pbtxt"
    with pytest.raises(ConfigError, match="config field 'config.pbtxt': " + str(path).replace(".", r"\.") + where):
        load_model(tmp_path, "twice")
    assert "twice" in scan_repository(tmp_path).failed


UNSUPPORTED = [
    ("model_namespace", 'ensemble_scheduling { step [ { model_name: "a" model_namespace: "n" } ] }',
     "ensemble_scheduling.step[0]", "model_namespace"),
    ("is_non_linear_format_io", None, "output[0]", "is_non_linear_format_io"),
]


@pytest.mark.parametrize("field, extra, where, name", UNSUPPORTED, ids=[u[0] for u in UNSUPPORTED])
def test_triton_fields_ringserve_does_not_implement_are_refused_by_name(tmp_path, field, extra, where, name):
    text = BATCHING_PBTXT
    if field == "model_namespace":  # a oneof with dynamic_batching: drop that one
        text = text.split("# Triton's model-configuration")[0]
    if extra is not None:
        text += extra + "\n"
    else:
        text = text.replace('name: "y"', 'name: "y"\n    is_non_linear_format_io: true')
    build_twice(tmp_path, text)
    with pytest.raises(ConfigError, match=re.escape(f"config field '{where}': Triton's field '{name}' is not supported")):
        load_model(tmp_path, "twice")


def test_an_instance_group_kind_ringserve_lacks_is_refused_by_name(tmp_path):
    build_twice(tmp_path, BATCHING_PBTXT.replace("kind: KIND_CPU", "kind: KIND_TPU"))
    with pytest.raises(ConfigError, match="instance_group.kind.*KIND_TPU"):
        load_model(tmp_path, "twice")


def test_triton_fields_ringserve_ignores_still_load(tmp_path):
    text = BATCHING_PBTXT + ('backend: "onnxruntime"\nmodel_operations { op_library_filename: "x.so" }\n'
                             "optimization { graph { level: 1 } }\n")
    pbtxt = load_model(tmp_path, "twice") if build_twice(tmp_path, text) else None
    assert pbtxt.max_batch_size == 2 and pbtxt.extra["backend"] == "onnxruntime"


def _unclassified(descriptor, fields: Fields, path: str) -> list[str]:
    missing = []
    for field in descriptor.fields:
        sub = field.message_type
        if sub is not None and sub.GetOptions().map_entry:
            sub = sub.fields_by_name["value"].message_type
        if field.name in fields.nested:
            inner = fields.nested[field.name]
            missing += _unclassified(sub, inner.each_value or inner, f"{path}.{field.name}")
        elif field.name not in fields.used | fields.ignored | fields.unsupported:
            missing.append(f"{path}.{field.name}")
    return missing


def test_every_field_of_tritons_model_config_is_used_ignored_or_refused_by_name():
    """So that no Triton field in a config.pbtxt ends up as an 'unknown field' (or slips through)."""
    assert _unclassified(model_config_pb2.ModelConfig.DESCRIPTOR, MODEL, "ModelConfig") == []


def test_a_pbtxt_that_disagrees_with_the_graph_is_named_in_the_message(tmp_path):
    build_twice(tmp_path, BATCHING_PBTXT.replace("dims: [ 4 ]", "dims: [ 5 ]", 1))
    with pytest.raises(ConfigError, match=r"'x' has shape \[-1, 5\] in config\.pbtxt .* but \[-1, 4\]"):
        load_model(tmp_path, "twice")


def test_only_a_config_pbtxt_imports_grpc(tmp_path):
    """tritonclient's grpc package loads grpcio: a repository of config.json models never pays for it."""
    build_twice(tmp_path / "json", BATCHING_JSON)
    build_twice(tmp_path / "pbtxt", BATCHING_PBTXT)
    script = ("import sys; from ringserve.common.repository.scan import scan_repository; "
              "scan = scan_repository(sys.argv[1]); assert not scan.failed, scan.failed; "
              "print(sorted({m.split('.')[0] for m in sys.modules} & {'grpc', 'tritonclient'}))")
    seen = [subprocess.run([sys.executable, "-c", script, str(tmp_path / kind)], capture_output=True, text=True,
                           check=True, timeout=60).stdout.strip() for kind in ("json", "pbtxt")]
    assert seen == ["[]", "['grpc', 'tritonclient']"]
