"""Models for warm-up and reshape tests: a Python model whose first run is slow and that records every execute,
Triton's L0_warmup `failing_infer`, and the ONNX identity models of Triton's gen_qa_reshape_models.py."""
from __future__ import annotations

import textwrap
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from tests.support.python_models import write_python_model

# Each execute appends "<pid> <warm|real> <requests>" to <model dir>/executes.log (warm: its x is all zeros, as
# model_warmup's zero_data gives it); the first execute of each process sleeps FIRST_RUN_S (a cold first run).
SLOW_FIRST = """
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils

FIRST_RUN_S = {first_run_s}


class TritonPythonModel:
    def initialize(self, args):
        self.log = os.path.join(args["model_repository"], "executes.log")
        self.cold = True

    def execute(self, requests):
        xs = [pb_utils.get_input_tensor_by_name(r, "x").as_numpy() for r in requests]
        kind = "real" if any(x.any() for x in xs) else "warm"
        with open(self.log, "a") as f:
            f.write(f"{{os.getpid()}} {{kind}} {{len(requests)}}\\n")
        if self.cold:
            self.cold = False
            time.sleep(FIRST_RUN_S)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", 2 * x)]) for x in xs]
"""

WARMUP_PBTXT = """\
name: "{name}"
backend: "python"
max_batch_size: 4
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ 4 ] }} ]
output [ {{ name: "y" data_type: TYPE_FP32 dims: [ 4 ] }} ]
dynamic_batching {{ }}
"""

ZEROS_SAMPLE = """\
model_warmup [ {{
  name: "zeros"
  batch_size: {batch_size}
  count: {count}
  inputs {{ key: "x" value: {{ data_type: TYPE_FP32 dims: [ 4 ] zero_data: true }} }}
}} ]
"""


def build_slow_first(repo: Path, name: str = "slow_first", *, first_run_s: float = 2.0, batch_size: int = 2,
                     count: int = 3, warm: bool = True) -> Path:
    """A Python model (config.pbtxt) whose first execute in a process sleeps `first_run_s`; with `warm`, its
    model_warmup runs `count` executions of `batch_size` requests of zeros."""
    model_dir = write_python_model(repo, name, SLOW_FIRST.format(first_run_s=first_run_s), {})
    (model_dir / "config.json").unlink()
    text = WARMUP_PBTXT.format(name=name)
    if warm:
        text += ZEROS_SAMPLE.format(batch_size=batch_size, count=count)
    (model_dir / "config.pbtxt").write_text(text)
    return model_dir


def executes(model_dir: Path) -> list[tuple[int, str, int]]:
    """(pid, warm|real, requests) of each execute so far, in order."""
    log = model_dir / "executes.log"
    lines = log.read_text().split("\n") if log.exists() else []
    return [(int(pid), kind, int(n)) for pid, kind, n in (line.split() for line in lines if line)]


# Triton's qa/L0_warmup/failing_infer, as its test lays it out (its model answers every request with an error).
FAILING_INFER_PBTXT = """\
name: "failing_infer"
backend: "python"
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 4 ] } ]
instance_group [{ kind: KIND_CPU }]
model_warmup [
{
    name : "zero sample"
    batch_size: 1
    inputs {
        key: "INPUT"
        value: { data_type: TYPE_FP32 dims: 4 zero_data: true }
    }
}]
"""

FAILING_INFER_PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[], error=pb_utils.TritonError("An Error Occurred"))
                for _ in requests]
"""


def build_failing_infer(repo: Path) -> Path:
    model_dir = repo / "failing_infer"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.py").write_text(textwrap.dedent(FAILING_INFER_PY))
    (model_dir / "config.pbtxt").write_text(FAILING_INFER_PBTXT)
    return model_dir


# -- Triton's qa/common/gen_qa_reshape_models.py, its ONNX part ------------------------------------------------
ONNX_TYPES = {np.float32: onnx.TensorProto.FLOAT, np.int32: onnx.TensorProto.INT32}
TRITON_TYPES = {np.float32: "TYPE_FP32", np.int32: "TYPE_INT32"}


def _onnx_shape(shape: list[int], start: int) -> tuple[list, int]:
    """test_util.shape_to_onnx_shape: each -1 a dim of its own name."""
    out = []
    for d in shape:
        if d == -1:
            out.append(f"var_{start}")
            start += 1
        else:
            out.append(d)
    return out, start


def _dims(shape: list[int]) -> str:
    return ", ".join(map(str, shape))


def reshape_model_name(max_batch: int, io_cnt: int, dtype: type) -> str:
    """test_util.get_zero_model_name."""
    return f"{'onnx_nobatch' if max_batch == 0 else 'onnx'}_zero_{io_cnt}_{np.dtype(dtype).name}"


def create_reshape_model(repo: Path, max_batch: int, dtype: type, input_shapes: list[list[int]],
                         input_model_shapes: list[list[int]], output_shapes: list[list[int]] | None = None,
                         output_model_shapes: list[list[int]] | None = None) -> str:
    """create_onnx_modelfile + create_onnx_modelconfig: identity graphs over the model shapes, and the config
    that reshapes the client's shapes to them (emu.create_general_modelconfig's text)."""
    output_shapes = output_shapes or input_shapes
    output_model_shapes = output_model_shapes or input_model_shapes
    name = reshape_model_name(max_batch, len(input_shapes), dtype)
    batch_dim = [] if max_batch == 0 else ["batch"]
    nodes, inputs, outputs, idx = [], [], [], 0
    for i, (in_model, out_model) in enumerate(zip(input_model_shapes, output_model_shapes)):
        in_shape, idx = _onnx_shape(in_model, idx)
        out_shape, idx = _onnx_shape(out_model, idx)
        inputs.append(helper.make_tensor_value_info(f"INPUT{i}", ONNX_TYPES[dtype], batch_dim + in_shape))
        outputs.append(helper.make_tensor_value_info(f"OUTPUT{i}", ONNX_TYPES[dtype], batch_dim + out_shape))
        nodes.append(helper.make_node("Identity", [f"INPUT{i}"], [f"OUTPUT{i}"]))
    model = helper.make_model(helper.make_graph(nodes, name, inputs, outputs), producer_name="triton",
                              opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8  # onnx 1.23 writes IR 14, which onnxruntime refuses
    (repo / name / "1").mkdir(parents=True)
    onnx.save(model, str(repo / name / "1" / "model.onnx"))
    text = f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: {max_batch}\n'
    text += "version_policy: { latest { num_versions: 1 }}\n"
    for kind, shapes, model_shapes in (("input", input_shapes, input_model_shapes),
                                       ("output", output_shapes, output_model_shapes)):
        for i, (shape, model_shape) in enumerate(zip(shapes, model_shapes)):
            reshape = "" if shape == model_shape else f"reshape: {{ shape: [ {_dims(model_shape)} ] }}"
            text += (f'{kind} [\n  {{\n    name: "{kind.upper()}{i}"\n    data_type: {TRITON_TYPES[dtype]}\n'
                     f"    dims: [ {_dims(shape)} ]\n    {reshape}\n  }}\n]\n")
    (repo / name / "config.pbtxt").write_text(text)
    return name


def build_ragged_identity(repo: Path, name: str = "ragged_io") -> Path:
    """L0_batch_input's ragged_io: an identity over one 1-D tensor (Triton's onnx_nobatch_zero_1_float32 with
    dims [-1]), served batched with INPUT0 ragged and OUTPUT0 scattered back by INPUT0's shape."""
    x = helper.make_tensor_value_info("INPUT0", onnx.TensorProto.FLOAT, ["n"])
    y = helper.make_tensor_value_info("OUTPUT0", onnx.TensorProto.FLOAT, ["n"])
    model = helper.make_model(helper.make_graph([helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])], name,
                                                [x], [y]), opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    (repo / name / "1").mkdir(parents=True)
    onnx.save(model, str(repo / name / "1" / "model.onnx"))
    (repo / name / "config.pbtxt").write_text(f"""\
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: 4
input [ {{ name: "INPUT0" allow_ragged_batch: true data_type: TYPE_FP32 dims: [ -1 ] is_shape_tensor: false }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
batch_output [{{target_name: "OUTPUT0" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: "INPUT0" }}]
dynamic_batching {{ max_queue_delay_microseconds: 1000000 }}
""")
    return repo / name


# Triton's qa/L0_warmup/decoupled, which records each execute as SLOW_FIRST does and answers one response, then
# the final flag (Triton's sends the final flag alone).
DECOUPLED_PY = """
import os

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.log = os.path.join(args["model_repository"], "executes.log")

    def execute(self, requests):
        with open(self.log, "a") as f:
            f.write(f"{os.getpid()} warm {len(requests)}\\n")
        for request in requests:
            sender = request.get_response_sender()
            x = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", x)]))
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


def build_decoupled(repo: Path) -> Path:
    model_dir = repo / "decoupled"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.py").write_text(textwrap.dedent(DECOUPLED_PY))
    (model_dir / "config.pbtxt").write_text(
        FAILING_INFER_PBTXT.replace('"failing_infer"', '"decoupled"').replace("zero sample", "decoupled sample")
        + "model_transaction_policy {\n  decoupled: True\n}\n"
    )
    return model_dir


def build_addsub(repo: Path, name: str = "onnx_float32_float32_float32") -> Path:
    """gen_qa_models.py's ONNX add/sub model: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1, [16] each."""
    io = [helper.make_tensor_value_info(n, onnx.TensorProto.FLOAT, ["batch", 16])
          for n in ("INPUT0", "INPUT1", "OUTPUT0", "OUTPUT1")]
    nodes = [helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
             helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"])]
    return _save(repo, name, helper.make_graph(nodes, name, io[:2], io[2:]), "TYPE_FP32", [16], ("INPUT0", "INPUT1"),
                 ("OUTPUT0", "OUTPUT1"))


def build_string_identity(repo: Path, name: str = "onnx_zero_1_object") -> Path:
    """gen_qa_identity_models.py's ONNX string identity: OUTPUT0 = INPUT0, TYPE_STRING [-1]."""
    x = helper.make_tensor_value_info("INPUT0", onnx.TensorProto.STRING, ["batch", "n"])
    y = helper.make_tensor_value_info("OUTPUT0", onnx.TensorProto.STRING, ["batch", "n"])
    graph = helper.make_graph([helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])], name, [x], [y])
    return _save(repo, name, graph, "TYPE_STRING", [-1], ("INPUT0",), ("OUTPUT0",))


def _save(repo: Path, name: str, graph: onnx.GraphProto, data_type: str, dims: list[int], inputs: tuple[str, ...],
          outputs: tuple[str, ...]) -> Path:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    (repo / name / "1").mkdir(parents=True)
    onnx.save(model, str(repo / name / "1" / "model.onnx"))
    tensors = "".join(f'{kind} [ {{ name: "{n}" data_type: {data_type} dims: [ {_dims(dims)} ] }} ]\n'
                      for kind, names in (("input", inputs), ("output", outputs)) for n in names)
    (repo / name / "config.pbtxt").write_text(f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
                                              + tensors)
    return repo / name


# A Python model with reshape: Triton's core hands it x as [rows, 2, 2] (the client sends [rows, 4]) and turns its
# y [rows, 2, 2] back into [rows, 4]. It refuses any other shape, so an unapplied reshape is an error.
RESHAPED_PY = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            if x.shape[1:] != (2, 2):
                raise pb_utils.TritonModelException(f"x has shape {x.shape}, the reshape says [rows, 2, 2]")
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", 2 * x)]))
        return responses
"""


def build_python_reshape(repo: Path, name: str = "python_reshape") -> Path:
    model_dir = repo / name
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.py").write_text(textwrap.dedent(RESHAPED_PY))
    (model_dir / "config.pbtxt").write_text(f"""\
name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "x" data_type: TYPE_FP32 dims: [ 4 ] reshape: {{ shape: [ 2, 2 ] }} }} ]
output [ {{ name: "y" data_type: TYPE_FP32 dims: [ 4 ] reshape: {{ shape: [ 2, 2 ] }} }} ]
dynamic_batching {{ max_queue_delay_microseconds: 200000 }}
""")
    return model_dir
