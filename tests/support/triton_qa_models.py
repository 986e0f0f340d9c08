"""The model repositories of Triton's sequence-batcher QA, built with Triton's own generators.

Triton's generators (tests/triton_qa/qa/common/gen_qa_*_models.py, vendored unchanged) are imported and
their `create_models` is called with what their `__main__` passes for `--onnx`: the same dtypes and
shapes, and module globals `FLAGS`, `onnx` and `tu` set as `__main__` sets them. Two things differ from
Triton's CI, both forced by the onnx/onnxruntime installed here and both applied outside the vendored
files: `--onnx_opset` (Triton's own option) is DEMO_OPSET instead of 0 (onnx's newest opset, which this
onnxruntime refuses as "under development"), and every model.onnx written is re-saved with IR version
DEMO_IR_VERSION (onnx >= 1.23 stamps IR 14; onnxruntime reads up to 13).

The repositories are then laid out as the QA's test.sh scripts lay them out (the `sed`s on max_batch_size,
instance counts, queue delays and initial-state files), with the environment each script exports.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import re
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import onnx

from ringserve.common.repository.demo import DEMO_IR_VERSION, DEMO_OPSET

QA = Path(__file__).resolve().parents[1] / "triton_qa" / "qa"
COMMON = QA / "common"

# generator: its module and the (dtype, shape, no_batch) calls of its __main__ for --onnx, fixed and --variable.
_OBJECT = np.dtype(object)
GENERATORS: dict[str, tuple[str, dict[bool, list[tuple[Any, list[int], bool]]]]] = {
    "sequence": ("gen_qa_sequence_models", {
        False: [(np.float32, [1], True), (np.int32, [1], True), (_OBJECT, [1], True), (bool, [1], True)],
        True: [(np.int32, [-1], False), (np.float32, [-1], False), (_OBJECT, [-1], False), (bool, [-1], False)],
    }),
    "implicit": ("gen_qa_implicit_models", {
        False: [(np.float32, [1], True), (np.int32, [1], True), (_OBJECT, [1], True), (bool, [1], True)],
        True: [(np.int32, [-1], False), (np.float32, [-1], False), (_OBJECT, [-1], False), (bool, [-1], False)],
    }),
    "dyna_sequence": ("gen_qa_dyna_sequence_models", {
        False: [(np.int32, [1], True)],
        True: [(np.int32, [-1], False)],
    }),
    "dyna_sequence_implicit": ("gen_qa_dyna_sequence_implicit_models", {
        False: [(np.int32, [1], True)],
        True: [(np.int32, [-1], False)],
    }),
}


@contextlib.contextmanager
def _common_on_path() -> Iterator[None]:
    sys.path.insert(0, str(COMMON))
    try:
        yield
    finally:
        sys.path.remove(str(COMMON))


def generator(name: str) -> ModuleType:
    """Triton's generator module `name` (a GENERATORS key), imported as its __main__ would run it."""
    with _common_on_path():
        module = importlib.import_module(GENERATORS[name][0])
        module.onnx = onnx  # type: ignore[attr-defined]  # __main__: `if FLAGS.onnx: import onnx`
        module.tu = importlib.import_module("test_util")  # type: ignore[attr-defined]  # __main__: `import test_util as tu`
    return module


def _flags(models_dir: Path, variable: bool, initial_state: str | None) -> argparse.Namespace:
    """The parsed arguments of `gen_qa_*.py --onnx --onnx_opset=DEMO_OPSET [--variable] [--initial-state X]`."""
    return argparse.Namespace(models_dir=str(models_dir), onnx=True, onnx_opset=DEMO_OPSET, variable=variable,
                              initial_state=initial_state, tensorrt=False, tensorrt_shape_io=False, libtorch=False,
                              torch_aoti=False, openvino=False, ensemble=False)


def generate(name: str, models_dir: Path, *, variable: bool = False, initial_state: str | None = None) -> list[str]:
    """Run generator `name`'s ONNX part into models_dir, as its __main__ does; return the model names."""
    module = generator(name)
    module.FLAGS = _flags(models_dir, variable, initial_state)  # type: ignore[attr-defined]
    models_dir.mkdir(parents=True, exist_ok=True)
    for dtype, shape, no_batch in GENERATORS[name][1][variable]:
        if name == "implicit":
            module.create_models(str(models_dir), dtype, shape, initial_state, no_batch)
        else:
            module.create_models(str(models_dir), dtype, shape, no_batch)
    for path in models_dir.glob("*/*/model.onnx"):
        lower_ir_version(path)
    return sorted(p.name for p in models_dir.iterdir() if (p / "config.pbtxt").is_file())


def lower_ir_version(path: Path) -> None:
    """Re-save an ONNX model stamped with a newer IR version than this onnxruntime reads."""
    model = onnx.load(str(path))
    if model.ir_version > DEMO_IR_VERSION:
        model.ir_version = DEMO_IR_VERSION
        onnx.save(model, str(path))


# ---- the layouts of the test.sh scripts ---------------------------------------------------------------

def _edit(config: Path, *subs: tuple[str, str]) -> None:
    text = config.read_text()
    for pattern, replacement in subs:
        text = re.sub(pattern, replacement, text, flags=re.MULTILINE)
    config.write_text(text)


def _counted(count: int) -> list[tuple[str, str]]:
    # sed "s/kind: KIND_GPU/kind: KIND_GPU\ncount: N/" and the same for KIND_CPU
    return [(r"kind: KIND_GPU", f"kind: KIND_GPU\ncount: {count}"), (r"kind: KIND_CPU", f"kind: KIND_CPU\ncount: {count}")]


def _python_model(onnx_model: Path, dst: Path) -> Path:
    """test.sh's generate_python_models: the onnx config with `backend: "python"` and the python_models
    sequence_int32/model.py."""
    name = onnx_model.name.replace("onnx", "python")
    (dst / name / "1").mkdir(parents=True)
    text = re.sub(r"platform:.*", 'backend: "python"', (onnx_model / "config.pbtxt").read_text())
    (dst / name / "config.pbtxt").write_text(text.replace("onnx", "python"))
    shutil.copyfile(QA / "python_models" / "sequence_int32" / "model.py", dst / name / "1" / "model.py")
    return dst / name


# L0_sequence_batcher/test.sh: MODEL_TRIALS "0 1 2 4 v" -> (max_batch_size, instance count, env).
SEQUENCE_TRIALS: dict[str, tuple[int | None, int, dict[str, str]]] = {
    "0": (None, 4, {"NO_BATCHING": "1", "MODEL_INSTANCES": "4", "BATCHER_TYPE": "FIXED"}),
    "1": (4, 1, {"NO_BATCHING": "0", "MODEL_INSTANCES": "1", "BATCHER_TYPE": "FIXED"}),
    "2": (2, 2, {"NO_BATCHING": "0", "MODEL_INSTANCES": "2", "BATCHER_TYPE": "FIXED"}),
    "4": (1, 4, {"NO_BATCHING": "0", "MODEL_INSTANCES": "4", "BATCHER_TYPE": "FIXED"}),
    "v": (4, 1, {"NO_BATCHING": "0", "MODEL_INSTANCES": "1", "BATCHER_TYPE": "VARIABLE"}),
    # queue_delay_models: max_batch_size 4, one instance, `direct { max_queue_delay_microseconds: 3000000
    # minimum_slot_utilization: 0 }` and its _half (0.5) and _full (1) copies. test.sh exports only
    # NO_BATCHING=0 for them: MODEL_INSTANCES and BATCHER_TYPE are left from the last trial, "v".
    "queue_delay": (4, 1, {"NO_BATCHING": "0", "MODEL_INSTANCES": "1", "BATCHER_TYPE": "VARIABLE"}),
}

# L0_sequence_batcher/test.sh: the TRITONSERVER_DELAY_SCHEDULER / _BACKLOG_DELAY_SCHEDULER each delayed
# test runs with (the tests assert these values in their own environment; the server must honour them).
DELAY_ENV: dict[str, tuple[int, int]] = {
    "test_backlog_fill": (10, 2), "test_backlog_fill_no_end": (10, 3), "test_backlog_same_correlation_id": (12, 2),
    "test_backlog_same_correlation_id_no_end": (16, 0), "test_half_batch": (8, 0),
    "test_backlog_sequence_timeout": (4, 0), "test_skip_batch": (12, 0), "test_full_batch": (12, 0),
    "test_ragged_batch": (12, 0), "test_backlog": (12, 0), "test_queue_delay_no_min_util": (2, 0),
    "test_queue_delay_half_min_util": (2, 0), "test_queue_delay_full_min_util": (2, 0),
}

INITIAL_STATE_DATA = b"\x64\x00\x00\x00"  # test.sh: echo -n -e "\x64\x00\x00\x00" > input_state_data (int32 100)


def sequence_batcher_repo(work: Path, trial: str, *, implicit: bool = False, initial_state: str | None = None,
                          backends: tuple[str, ...] = ("onnx",)) -> tuple[Path, dict[str, str]]:
    """L0_sequence_batcher's models<trial> repository (ENSEMBLES=0) and the env its tests run with.
    initial_state (implicit only): "zero" is INITIAL_STATE_ZERO=1 (the `--initial-state zero` repository),
    "file" is INITIAL_STATE_FILE=1 (that repository with zero_data sed-ed to the 100 file)."""
    max_batch, count, trial_env = SEQUENCE_TRIALS[trial]
    variable = trial == "v"
    initial_state_file = initial_state == "file"
    source = work / f"generated-{'implicit' if implicit else 'plain'}-{initial_state}-{variable}"
    if not source.exists():
        generate("implicit" if implicit else "sequence", source, variable=variable,
                 initial_state="zero" if initial_state else None)
    repo = work / f"models{trial}"
    repo.mkdir()
    dtypes = ["int32", "bool"] if not implicit else ["object", "int32", "bool"]  # get_datatype for onnx
    prefix = "onnx_nobatch" if trial == "0" else "onnx"
    for dtype in dtypes:
        src = source / f"{prefix}_sequence_{dtype}"
        models = [_python_model(src, repo)] if "python" in backends else []
        if "onnx" in backends:
            models.append(Path(shutil.copytree(src, repo / src.name)))
        for model in models:
            subs = _counted(count)
            if max_batch is not None:
                subs.insert(0, (r"^max_batch_size:.*", f"max_batch_size: {max_batch}"))
            if trial == "queue_delay":
                subs.append((r"sequence_batching \{", "sequence_batching {\ndirect {\nmax_queue_delay_microseconds: "
                                                      "3000000\nminimum_slot_utilization: 0\n}"))
            _edit(model / "config.pbtxt", *subs)
            copies = [model]
            if trial == "queue_delay":
                for suffix, utilization in (("_half", "0.5"), ("_full", "1")):
                    copy = Path(shutil.copytree(model, repo / (model.name + suffix)))
                    _edit(copy / "config.pbtxt", (re.escape(model.name), copy.name),
                          (r"minimum_slot_utilization: 0", f"minimum_slot_utilization: {utilization}"))
                    copies.append(copy)
            if initial_state_file:
                for each in copies:
                    (each / "initial_state").mkdir()
                    (each / "initial_state" / "input_state_data").write_bytes(INITIAL_STATE_DATA)
                    _edit(each / "config.pbtxt", (r"zero_data.*", 'data_file:"input_state_data"'))
    env = {**trial_env, "BACKENDS": " ".join(backends), "ENSEMBLES": "0", "IMPLICIT_STATE": "1" if implicit else "0",
           "INITIAL_STATE_FILE": "1" if initial_state_file else "0",
           "INITIAL_STATE_ZERO": "1" if initial_state == "zero" else "0", "TEST_SYSTEM_SHARED_MEMORY": "0",
           "TEST_CUDA_SHARED_MEMORY": "0"}
    return repo, env


def dyna_sequence_repo(work: Path, *, implicit: bool = False, batched_stage: bool = False) -> tuple[Path, dict[str, str]]:
    """L0_dyna_sequence_batcher's `models` (every ONNX model of the dyna repository, `count: 1`); with
    batched_stage, after test.sh's sed for the NO_BATCHING=0 tests (max_candidate_sequences:4,
    max_queue_delay_microseconds:5000000)."""
    repo = work / f"dyna-models-{'implicit' if implicit else 'plain'}-{batched_stage}"
    generate("dyna_sequence_implicit" if implicit else "dyna_sequence", repo)
    for config in repo.glob("*/config.pbtxt"):
        subs = _counted(1)
        if batched_stage:
            subs += [(r"max_candidate_sequences:.*", "max_candidate_sequences:4"),
                     (r"max_queue_delay_microseconds:.*", "max_queue_delay_microseconds:5000000")]
        _edit(config, *subs)
    env = {"BACKENDS": "onnx", "IMPLICIT_STATE": "1" if implicit else "0", "NO_BATCHING": "0" if batched_stage else "1",
           "TEST_SYSTEM_SHARED_MEMORY": "0", "TEST_CUDA_SHARED_MEMORY": "0"}
    return repo, env


def implicit_state_repo(work: Path) -> tuple[Path, dict[str, str]]:
    """L0_implicit_state's ONNX models: onnx_nobatch_sequence_int32 of the implicit repository and its
    `_output` copy that also declares OUTPUT_STATE as an output (the custom-backend models are left out)."""
    source = work / "generated-implicit-for-L0_implicit_state"
    generate("implicit", source)
    repo = work / "implicit-state-models"
    repo.mkdir()
    name = "onnx_nobatch_sequence_int32"
    shutil.copytree(source / name, repo / name)
    output = Path(shutil.copytree(source / name, repo / f"{name}_output"))
    _edit(output / "config.pbtxt", (r"^name:.*", f'name: "{name}_output"'))
    with (output / "config.pbtxt").open("a") as f:  # echo -e "output [{ name: ... }]" >> config.pbtxt
        f.write('output [{ name: "OUTPUT_STATE" \n data_type: TYPE_INT32 \n dims: [ 1 ] }]\n')
    env = {"BACKENDS": "onnx", "ENSEMBLES": "0", "IMPLICIT_STATE": "1", "INITIAL_STATE_ZERO": "0",
           "INITIAL_STATE_FILE": "0", "SINGLE_STATE_BUFFER": "0"}
    return repo, env


def preserve_ordering_repo(work: Path) -> tuple[Path, dict[str, str]]:
    """L0_sequence_batcher's preserve_ordering_models: python_models/sequence_py as
    seqpy_{no_preserve,preserve}_ordering_{decoupled,nondecoupled}. test.sh's
    `sed "s/^preserve_ordering: False/preserve_ordering: True/"` matches nothing (the line is indented in
    sequence_py/config.pbtxt), so in Triton's CI every copy keeps `preserve_ordering: False`; so here."""
    repo = work / "preserve_ordering_models"
    base = QA / "python_models" / "sequence_py"
    for mode in ("decoupled", "nondecoupled"):
        no_preserve = repo / f"seqpy_no_preserve_ordering_{mode}"
        (no_preserve / "1").mkdir(parents=True)
        shutil.copyfile(base / "config.pbtxt", no_preserve / "config.pbtxt")
        shutil.copyfile(base / "model.py", no_preserve / "1" / "model.py")
        preserve = Path(shutil.copytree(no_preserve, repo / f"seqpy_preserve_ordering_{mode}"))
        _edit(preserve / "config.pbtxt", (r"^preserve_ordering: False", "preserve_ordering: True"))
        if mode == "decoupled":
            for model in (no_preserve, preserve):  # echo -e "\nmodel_transaction_policy { decoupled: true }" >>
                with (model / "config.pbtxt").open("a") as f:
                    f.write("\nmodel_transaction_policy { decoupled: true }\n")
    # The module reads these at import; test.sh leaves them from its earlier loops.
    env = {"NO_BATCHING": "0", "MODEL_INSTANCES": "1", "BATCHER_TYPE": "FIXED", "BACKENDS": "python", "ENSEMBLES": "0",
           "IMPLICIT_STATE": "0", "INITIAL_STATE_FILE": "0", "TEST_SYSTEM_SHARED_MEMORY": "0",
           "TEST_CUDA_SHARED_MEMORY": "0"}
    return repo, env
