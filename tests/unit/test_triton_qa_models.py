"""Triton's sequence-batcher QA models, built by Triton's own generators (tests/support/triton_qa_models.py):
the vendored files are Triton's byte for byte, each generator writes the config its __main__ writes, and
each model, run in onnxruntime the way a sequence batcher feeds it (control inputs per slot, state carried
from step to step), computes what Triton's QA expects of it (the numpy below). No server."""
from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np
import onnxruntime as ort
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from tests.support.triton_qa_models import (
    INITIAL_STATE_DATA,
    QA,
    dyna_sequence_repo,
    generate,
    implicit_state_repo,
    sequence_batcher_repo,
)

VENDORED = QA.parent
Control = model_config_pb2.ModelSequenceBatching.Control


def git_blob(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def config_of(model: Path) -> model_config_pb2.ModelConfig:
    return text_format.Parse((model / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())


def session(model: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(model / "1" / "model.onnx"), providers=["CPUExecutionProvider"])


def col(values: list, dtype: object) -> np.ndarray:
    """One value per slot, shaped [B, 1] as the batcher's control and INPUT tensors are."""
    return np.array(values, dtype=dtype).reshape(-1, 1)


def test_the_vendored_triton_files_are_triton_s_byte_for_byte():
    listed = dict(re.findall(r"^\| `([^`]+)` \| `([0-9a-f]{40})` \|$", (VENDORED / "README.md").read_text(), re.M))
    present = {str(p.relative_to(VENDORED)) for p in VENDORED.rglob("*") if p.is_file() and p.name != "README.md"}
    assert present == set(listed), "every vendored file, and only those, is listed with its blob"
    changed = [path for path, blob in listed.items() if git_blob((VENDORED / path).read_bytes()) != blob]
    assert changed == []


def test_the_generators_write_the_sequence_batching_block_their_main_writes(tmp_path):
    plain = generate("sequence", tmp_path / "plain")
    implicit = generate("implicit", tmp_path / "implicit")
    dyna = generate("dyna_sequence", tmp_path / "dyna")
    dyna_implicit = generate("dyna_sequence_implicit", tmp_path / "dyna_implicit")

    expected = {f"onnx{b}_sequence_{d}" for b in ("", "_nobatch") for d in ("int32", "float32", "object", "bool")}
    assert set(plain) == set(implicit) == expected
    assert set(dyna) == set(dyna_implicit) == {"onnx_dyna_sequence_int32", "onnx_nobatch_dyna_sequence_int32"}

    config = config_of(tmp_path / "plain" / "onnx_sequence_int32")
    seq = config.sequence_batching
    assert (config.platform, config.max_batch_size, seq.max_sequence_idle_microseconds) == ("onnxruntime_onnx", 8, 5000000)
    assert not seq.HasField("oldest") and not seq.HasField("direct") and not seq.state
    assert [(c.name, c.control[0].kind, list(c.control[0].int32_false_true)) for c in seq.control_input] == [
        ("START", Control.CONTROL_SEQUENCE_START, [0, 1]), ("READY", Control.CONTROL_SEQUENCE_READY, [0, 1])]
    assert [g.kind for g in config.instance_group] == [model_config_pb2.ModelInstanceGroup.KIND_GPU]
    assert config_of(tmp_path / "plain" / "onnx_nobatch_sequence_int32").max_batch_size == 0
    bool_config = config_of(tmp_path / "plain" / "onnx_sequence_bool")
    assert bool_config.input[0].data_type == model_config_pb2.TYPE_INT32  # bool is the controls' type only
    assert list(bool_config.sequence_batching.control_input[0].control[0].bool_false_true) == [False, True]
    assert list(config_of(tmp_path / "plain" / "onnx_sequence_float32")
                .sequence_batching.control_input[0].control[0].fp32_false_true) == [0.0, 1.0]

    state = config_of(tmp_path / "implicit" / "onnx_sequence_object").sequence_batching.state
    assert [(s.input_name, s.output_name, s.data_type, list(s.dims)) for s in state] == [
        ("INPUT_STATE", "OUTPUT_STATE", model_config_pb2.TYPE_STRING, [1])]

    dyna_config = config_of(tmp_path / "dyna" / "onnx_dyna_sequence_int32").sequence_batching
    assert (dyna_config.oldest.max_candidate_sequences, list(dyna_config.oldest.preferred_batch_size),
            dyna_config.oldest.max_queue_delay_microseconds) == (6, [4], 0)
    assert [c.name for c in dyna_config.control_input] == ["START", "END", "READY", "CORRID"]
    assert dyna_config.control_input[3].control[0].data_type == model_config_pb2.TYPE_UINT64
    assert not config_of(tmp_path / "dyna" / "onnx_nobatch_dyna_sequence_int32").sequence_batching.HasField("oldest")
    assert [s.input_name for s in config_of(tmp_path / "dyna_implicit" / "onnx_dyna_sequence_int32")
            .sequence_batching.state] == ["INPUT_STATE"]


def test_the_sequence_model_is_ready_times_input_plus_start(tmp_path):
    generate("sequence", tmp_path)
    for name, control in (("onnx_sequence_int32", np.int32), ("onnx_sequence_bool", np.bool_)):
        inp, start, ready = [7, 5, 9], [1, 0, 1], [1, 1, 0]  # slot 2 is a READY=0 padding slot
        (out,) = session(tmp_path / name).run(None, {
            "INPUT": col(inp, np.int32), "START": col(start, control), "READY": col(ready, control)})
        assert out.dtype == np.int32
        np.testing.assert_array_equal(out, col(np.array(ready) * (np.array(inp) + np.array(start)), np.int32))

    (out,) = session(tmp_path / "onnx_nobatch_sequence_int32").run(None, {
        "INPUT": np.array([42], np.int32), "START": np.array([1], np.int32), "READY": np.array([1], np.int32)})
    np.testing.assert_array_equal(out, [43])
    (out,) = session(tmp_path / "onnx_sequence_object").run(None, {
        "INPUT": col(["7", "5"], object), "START": col([1, 0], np.int32), "READY": col([1, 1], np.int32)})
    assert [int(x) for x in out.ravel()] == [8, 5]


def run_implicit(model: ort.InferenceSession, steps: list[tuple[int, bool]], first_state: int, *,
                 control: type = np.int32, extra: dict | None = None, ready_gated: bool = True) -> list[int]:
    """One sequence in slot 0 beside a READY=0 slot 1, step after step, OUTPUT_STATE fed back as
    INPUT_STATE: what the server does with `state`. Returns slot 0's OUTPUTs. ready_gated: the model
    adds the state only where READY && !START (else always: the initial-state models)."""
    state, results = col([first_state, 1000], np.int32), []
    for value, is_start in steps:
        out, out_state = model.run(["OUTPUT", "OUTPUT_STATE"], {
            "INPUT": col([value, 3], np.int32), "INPUT_STATE": state,
            "START": col([is_start, False], control), "READY": col([True, False], control), **(extra or {})})
        np.testing.assert_array_equal(out, out_state)
        assert out[1, 0] == (3 if ready_gated else 3 + state[1, 0])  # padding: INPUT (+ INPUT_STATE)
        results.append(int(out[0, 0]))
        state = out_state
    return results


def test_the_implicit_state_model_accumulates_since_start_through_the_fed_back_state(tmp_path):
    generate("implicit", tmp_path)
    steps = [(1, True), (2, False), (3, False), (4, False)]
    # The state at START is ignored (READY && !START is 0): whatever the slot held before.
    assert run_implicit(session(tmp_path / "onnx_sequence_int32"), steps, first_state=777) == [1, 3, 6, 10]
    assert run_implicit(session(tmp_path / "onnx_sequence_bool"), steps, 777, control=np.bool_) == [1, 3, 6, 10]

    # A second START restarts the sum (test_no_sequence_end: 1, 2, start 42, end 9 -> 51).
    assert run_implicit(session(tmp_path / "onnx_sequence_int32"), [(1, True), (2, False), (42, True), (9, False)],
                        0)[-1] == 51

    out, out_state = session(tmp_path / "onnx_sequence_object").run(["OUTPUT", "OUTPUT_STATE"], {
        "INPUT": col(["9"], object), "INPUT_STATE": col([""], object), "START": col([0], np.int32),
        "READY": col([1], np.int32)})
    assert out.ravel().tolist() == out_state.ravel().tolist() == ["9"]  # strings pass through


def test_the_initial_state_model_adds_the_state_the_server_starts_it_with(tmp_path):
    generate("implicit", tmp_path, initial_state="zero")
    config = config_of(tmp_path / "onnx_sequence_int32").sequence_batching.state[0]
    (initial,) = config.initial_state  # repeated in model_config.proto; Triton takes at most one
    assert (initial.name, initial.zero_data, list(initial.dims)) == ("state init", True, [1])
    model = session(tmp_path / "onnx_sequence_int32")
    steps = [(1, True), (2, False), (3, False)]
    # START and READY are not read: the sum starts from whatever state the server feeds at START.
    assert run_implicit(model, steps, first_state=0, ready_gated=False) == [1, 3, 6]
    file_state = int(np.frombuffer(INITIAL_STATE_DATA, np.int32)[0])
    assert run_implicit(model, steps, first_state=file_state, ready_gated=False) == [101, 103, 106]  # the QA's expected + 100


def test_the_dyna_models_add_start_and_end_times_corrid_or_accumulate(tmp_path):
    generate("dyna_sequence", tmp_path / "plain")
    generate("dyna_sequence_implicit", tmp_path / "implicit")
    inp, start, end, ready, corrid = [9, 5, 1, 4], [0, 1, 1, 0], [1, 0, 1, 0], [1, 1, 1, 0], [52, 7, 99, 3]
    (out,) = session(tmp_path / "plain" / "onnx_dyna_sequence_int32").run(None, {
        "INPUT": col(inp, np.int32), "START": col(start, np.int32), "END": col(end, np.int32),
        "READY": col(ready, np.int32), "CORRID": col(corrid, np.uint64)})
    a = [np.array(x) for x in (inp, start, end, ready, corrid)]
    np.testing.assert_array_equal(out, col(a[3] * (a[0] + a[1] + a[2] * a[4]), np.int32))  # [61, 6, 101, 0]

    extra = {"END": col([0, 0], np.int32), "CORRID": col([1001, 0], np.uint64)}
    assert run_implicit(session(tmp_path / "implicit" / "onnx_dyna_sequence_int32"),
                        [(11, True), (12, False), (13, False)], 5, extra=extra) == [11, 23, 36]


def test_the_test_sh_layouts_give_the_instance_counts_batch_sizes_and_env_of_each_trial(tmp_path):
    repo, env = sequence_batcher_repo(tmp_path, "2")
    assert sorted(p.name for p in repo.iterdir()) == ["onnx_sequence_bool", "onnx_sequence_int32"]
    config = config_of(repo / "onnx_sequence_int32")
    assert (config.max_batch_size, config.instance_group[0].count) == (2, 2)
    assert (env["NO_BATCHING"], env["MODEL_INSTANCES"], env["BATCHER_TYPE"], env["BACKENDS"]) == ("0", "2", "FIXED", "onnx")

    repo, env = sequence_batcher_repo(tmp_path, "0", implicit=True, initial_state="file")
    assert sorted(p.name for p in repo.iterdir()) == [f"onnx_nobatch_sequence_{d}" for d in ("bool", "int32", "object")]
    state = config_of(repo / "onnx_nobatch_sequence_int32").sequence_batching.state[0]
    assert state.initial_state[0].data_file == "input_state_data"
    assert (repo / "onnx_nobatch_sequence_int32" / "initial_state" / "input_state_data").read_bytes() == INITIAL_STATE_DATA
    assert (config_of(repo / "onnx_nobatch_sequence_int32").instance_group[0].count, env["NO_BATCHING"]) == (4, "1")

    repo, _ = sequence_batcher_repo(tmp_path, "queue_delay")
    half = config_of(repo / "onnx_sequence_int32_half")
    assert (half.name, half.sequence_batching.direct.max_queue_delay_microseconds,
            half.sequence_batching.direct.minimum_slot_utilization) == ("onnx_sequence_int32_half", 3000000, 0.5)

    repo, env = dyna_sequence_repo(tmp_path, batched_stage=True)
    oldest = config_of(repo / "onnx_dyna_sequence_int32").sequence_batching.oldest
    assert (oldest.max_candidate_sequences, oldest.max_queue_delay_microseconds, env["NO_BATCHING"]) == (4, 5000000, "0")

    repo, _ = implicit_state_repo(tmp_path)
    output = config_of(repo / "onnx_nobatch_sequence_int32_output")
    assert output.name == "onnx_nobatch_sequence_int32_output"
    assert [o.name for o in output.output] == ["OUTPUT", "OUTPUT_STATE"]
