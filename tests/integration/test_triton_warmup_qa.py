"""Triton's qa/L0_warmup/test.sh, its ONNX cases: the same model_warmup blocks appended to the same models, and the
same greps of the server's log. onnx_sequence_int32 and onnx_sequence_object come from Triton's own generator
(gen_qa_sequence_models.py, tests/triton_qa/); the add/sub and string identity models are built as gen_qa_models.py
and gen_qa_identity_models.py build them (those generators are not vendored here)."""
from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tests.support.stack import Stack
from tests.support.triton_qa_models import generate
from tests.support.warmup_models import build_addsub, build_string_identity


def warmup(*samples: str) -> str:
    return "model_warmup [" + ",".join(samples) + "]\n"


def sample(name: str, batch_size: int, inputs: list[tuple[str, str, str]], count: int | None = None) -> str:
    """One sample as test.sh echoes it: inputs as (key, data_type, the data line)."""
    text = f'{{\n    name : "{name}"\n' + (f"    count : {count}\n" if count else "")
    text += f"    batch_size: {batch_size}\n"
    for key, data_type, data in inputs:
        text += (f'    inputs {{\n        key: "{key}"\n        value: {{\n            data_type: {data_type}\n'
                 f"            dims: {16 if key.startswith('INPUT') and key[-1].isdigit() else 1}\n"
                 f"            {data}\n        }}\n    }}\n")
    return text + "}"


@pytest.fixture(scope="module")
def sequence_models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """gen_qa_sequence_models.py's ONNX models (onnx_sequence_int32, onnx_sequence_object, ...)."""
    where = tmp_path_factory.mktemp("generated")
    generate("sequence", where)
    return where


def serve_and_read_log(repo: Path, tmp_path: Path) -> str:
    log = tmp_path / "inference_server.log"

    class LoggedStack(Stack):
        stderr = log.open("w")

    stack = LoggedStack(repo, "--log-level", "INFO")  # test.sh's --log-verbose=1
    try:
        stack.start()
        for model in (p.name for p in repo.iterdir()):
            assert stack.get(f"/v2/models/{model}/ready")[0] == 200, model
    finally:
        try:
            stack.stop()
        finally:
            stack.kill_everything()
            LoggedStack.stderr.close()
        stack.assert_nothing_left()
    return log.read_text()


def test_fixed_size_samples_and_a_sequence_sample_run_twice(sequence_models: Path, tmp_path: Path) -> None:
    repo = tmp_path / "models"
    repo.mkdir()
    build_addsub(repo)
    shutil.copytree(sequence_models / "onnx_sequence_int32", repo / "onnx_sequence_int32")
    with (repo / "onnx_float32_float32_float32" / "config.pbtxt").open("a") as f:
        f.write(warmup(sample("regular sample", 1, [("INPUT0", "TYPE_FP32", "zero_data: true"),
                                                    ("INPUT1", "TYPE_FP32", "random_data: true")])))
    with (repo / "onnx_sequence_int32" / "config.pbtxt").open("a") as f:
        f.write(warmup(sample("sequence sample", 8, [(k, "TYPE_INT32", "zero_data: true")
                                                     for k in ("INPUT", "START", "READY")], count=2)))

    log = serve_and_read_log(repo, tmp_path)

    assert "is running warmup sample 'regular sample'" in log
    assert "is running warmup sample 'sequence sample' for iteration 1" in log
    assert "is running warmup sample 'sequence sample' for iteration 2" in log
    assert "failed to run warmup" not in log


def test_string_samples_zero_random_and_from_a_file(sequence_models: Path, tmp_path: Path) -> None:
    repo = tmp_path / "models"
    repo.mkdir()
    build_string_identity(repo)
    shutil.copytree(sequence_models / "onnx_sequence_object", repo / "onnx_sequence_object")
    with (repo / "onnx_zero_1_object" / "config.pbtxt").open("a") as f:
        f.write(warmup(sample("zero string stateless", 1, [("INPUT0", "TYPE_STRING", "zero_data: true")]),
                       sample("random string stateless", 1, [("INPUT0", "TYPE_STRING", "random_data: true")])))
    with (repo / "onnx_sequence_object" / "config.pbtxt").open("a") as f:
        f.write(warmup(sample("string statefull", 8, [("INPUT", "TYPE_STRING", 'input_data_file: "raw_string_data"'),
                                                      ("START", "TYPE_INT32", "zero_data: true"),
                                                      ("READY", "TYPE_INT32", "zero_data: true")])))
    (repo / "onnx_sequence_object" / "warmup").mkdir()
    (repo / "onnx_sequence_object" / "warmup" / "raw_string_data").write_bytes(b"\x03\x00\x00\x00\x32\x33\x33")

    log = serve_and_read_log(repo, tmp_path)

    for name in ("zero string stateless", "random string stateless", "string statefull"):
        assert re.search(f"is running warmup sample '{name}'", log), name
    assert "failed to run warmup" not in log
