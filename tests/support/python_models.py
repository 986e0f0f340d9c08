"""Repositories of Python models (model.py), ensembles and BLS models for the tests.

Triton's own examples come from tests/triton_examples/ (copied byte for byte) and are laid out as
their READMEs say; the models written here are the tests' own (a model that segfaults on one
input, one that raises, one that hangs, one that counts the requests each execute gets).
"""
from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

from ringserve.common.repository.demo import make_model, write_model_dir

EXAMPLES = Path(__file__).resolve().parents[1] / "triton_examples"


def copy_example(repo: Path, name: str, model_py: str, config: str | None) -> Path:
    """`<repo>/<name>/1/model.py` (and config.pbtxt) from the example files, as Triton's READMEs do."""
    version = repo / name / "1"
    version.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(EXAMPLES / model_py, version / "model.py")
    if config is not None:
        shutil.copyfile(EXAMPLES / config, repo / name / "config.pbtxt")
    return repo / name


def build_add_sub_onnx(repo: Path, name: str = "pytorch") -> None:
    """What the BLS example's `pytorch` model computes, as ONNX: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 =
    INPUT0 - INPUT1, FP32 [4] each, no batch dim (the example's pytorch config)."""
    tensors = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4]) for n in ("INPUT0", "INPUT1")]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4]) for n in ("OUTPUT0", "OUTPUT1")]
    nodes = [helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
             helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"])]
    write_model_dir(repo, name, make_model(name, nodes, tensors, outputs, {}), config=None)


def build_triton_examples(repo: Path) -> Path:
    """add_sub, bls_sync and bls_async (and the ONNX `pytorch` they call), and the two auto_complete models."""
    copy_example(repo, "add_sub", "add_sub/model.py", "add_sub/config.pbtxt")
    copy_example(repo, "bls_sync", "bls/sync_model.py", "bls/sync_config.pbtxt")
    copy_example(repo, "bls_async", "bls/async_model.py", "bls/async_config.pbtxt")
    build_add_sub_onnx(repo)
    copy_example(repo, "nobatch_auto_complete", "auto_complete/nobatch_model.py", None)
    copy_example(repo, "batch_auto_complete", "auto_complete/batch_model.py", None)
    return repo


def write_python_model(repo: Path, name: str, source: str, config: dict) -> Path:
    """`<repo>/<name>/1/model.py` with `source` and a config.json with `config` (backend python)."""
    version = repo / name / "1"
    version.mkdir(parents=True, exist_ok=True)
    (version / "model.py").write_text(textwrap.dedent(source))
    (repo / name / "config.json").write_text(json.dumps({"backend": "python", **config}, indent=1))
    return repo / name


def fp32(name: str, dims: list[int]) -> dict:
    return {"name": name, "data_type": "TYPE_FP32", "dims": dims}


# y = 2x + 1 per row; x[0] == -7 in any row: a real invalid read (SIGSEGV) in the worker;
# -8: raise TritonModelException; -9: a pure Python exception; -10: a response carrying an error.
# Every execute appends the number of requests it got to <model dir>/executes.log.
CRASHY = """
import ctypes
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.log = os.path.join(args["model_repository"], "executes.log")

    def execute(self, requests):
        with open(self.log, "a") as f:
            f.write(f"{len(requests)}\\n")
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            if (x[:, 0] == -7).any():
                ctypes.string_at(0)
            if (x[:, 0] == -8).any():
                raise pb_utils.TritonModelException("x[0] = -8 is refused")
            if (x[:, 0] == -9).any():
                {}["no such key"]
            if (x[:, 0] == -10).any():
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError("x[0] = -10 is refused")))
                continue
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", (2 * x + 1).astype(np.float32))]))
        return responses
"""


def build_crashy(repo: Path, name: str = "crashy", max_batch_size: int = 8, delay_us: int = 0) -> Path:
    return write_python_model(repo, name, CRASHY, {
        "max_batch_size": max_batch_size, "input": [fp32("x", [4])], "output": [fp32("y", [4])],
        "dynamic_batching": {"max_queue_delay_microseconds": delay_us}})


# x == -1: a native call that holds the GIL (PyDLL), so the heartbeat thread stops too: a wedged
# library. x == -2: a sleep in Python, which lets the heartbeat thread run.
HANGING = """
import ctypes
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            if (x == -1).any():
                ctypes.PyDLL(None).sleep(3600)
            if (x == -2).any():
                time.sleep(3600)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", x * 3)]))
        return responses
"""


def build_hanging(repo: Path, name: str = "hangs") -> Path:
    return write_python_model(repo, name, HANGING, {"max_batch_size": 8, "input": [fp32("x", [4])],
                                                    "output": [fp32("y", [4])], "dynamic_batching": {}})


# What a request's tensors are inside execute: BYTES elements' type, whether each input is a
# writable one (private to the model, as Triton's are: worker/requests.py), a ragged input's own length; the pid that imported model.py
# goes to <model dir>/imported_by.
INSPECT = """
import os

import numpy as np
import triton_python_backend_utils as pb_utils

with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "imported_by"), "a") as f:
    f.write(f"{os.getpid()}\\n")


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "text").as_numpy()
            seq = pb_utils.get_input_tensor_by_name(request, "seq").as_numpy()
            writable = all(t.as_numpy().flags.writeable for t in request.inputs() if t.name() != "text")
            kinds = np.array([[type(e).__name__.encode() + (b" writable" if writable else b" read-only")]
                              for e in text[:, 0]],
                             dtype=object)
            echo = np.array([[e[::-1]] for e in text[:, 0]], dtype=object)
            total = np.full((text.shape[0], 1), seq.sum(), np.float32)
            seen = np.array([[text.shape[0], seq.size]] * text.shape[0], np.int32)
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("kind", kinds), pb_utils.Tensor("echo", echo), pb_utils.Tensor("total", total),
                pb_utils.Tensor("seen", seen)]))
        return responses
"""


def build_inspect(repo: Path, name: str = "inspect") -> Path:
    return write_python_model(repo, name, INSPECT, {
        "max_batch_size": 16,
        "input": [{"name": "text", "data_type": "TYPE_STRING", "dims": [1]},
                  {"name": "seq", "data_type": "TYPE_FP32", "dims": [-1], "allow_ragged_batch": True}],
        "output": [{"name": "kind", "data_type": "TYPE_STRING", "dims": [1]},
                   {"name": "echo", "data_type": "TYPE_STRING", "dims": [1]}, fp32("total", [1]),
                   {"name": "seen", "data_type": "TYPE_INT32", "dims": [2]}],
        "dynamic_batching": {"max_queue_delay_microseconds": 0}})


# BLS: each request's x goes to the ONNX mlp (one BLS request per client request); y comes back.
# The model called is the config's parameters.target (mlp when none).
BLS_MLP = """
import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"]).get("parameters", {})
        self.target = parameters.get("target", {}).get("string_value", "mlp")

    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x")
            answer = pb_utils.InferenceRequest(model_name=self.target, requested_output_names=["y"], inputs=[x]).exec()
            if answer.has_error():
                raise pb_utils.TritonModelException(answer.error().message())
            responses.append(pb_utils.InferenceResponse([pb_utils.get_output_tensor_by_name(answer, "y")]))
        return responses
"""

# Triton's preprocessing example's shape: a Python step turns raw bytes (UINT8) into the mlp's
# input, x = raw / 255 - 0.5 (FP32), and the ONNX mlp computes y from it.
PREPROCESS = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            raw = pb_utils.get_input_tensor_by_name(request, "RAW").as_numpy()
            x = (raw.astype(np.float32) / 255.0 - 0.5).astype(np.float32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("PIXELS", x)]))
        return responses
"""


def build_pipeline(repo: Path) -> None:
    """`bls_mlp` (Python, BLS to mlp), `preprocess` (Python) and `pipeline` (ensemble: preprocess -> mlp);
    the mlp must be in the repository too. (Triton's ensemble_scheduling is a oneof with dynamic_batching:
    the ensemble batches as a model with max_batch_size > 0 does here, its steps with it.)"""
    write_python_model(repo, "bls_mlp", BLS_MLP, {"max_batch_size": 8, "input": [fp32("x", [512])],
                                                 "output": [fp32("y", [10])], "dynamic_batching": {}})
    if (repo / "mlp").exists():  # a lazy copy of the mlp, which only bls_lazy calls
        shutil.copytree(repo / "mlp", repo / "mlp_lazy")
        config = json.loads((repo / "mlp_lazy" / "config.json").read_text())
        config.update(name="mlp_lazy", model_load_policy="lazy")
        (repo / "mlp_lazy" / "config.json").write_text(json.dumps(config))
        write_python_model(repo, "bls_lazy", BLS_MLP, {
            "max_batch_size": 8, "input": [fp32("x", [512])], "output": [fp32("y", [10])],
            "parameters": {"target": {"string_value": "mlp_lazy"}}})
    write_python_model(repo, "preprocess", PREPROCESS, {
        "max_batch_size": 8, "input": [{"name": "RAW", "data_type": "TYPE_UINT8", "dims": [512]}],
        "output": [fp32("PIXELS", [512])], "dynamic_batching": {}})
    (repo / "pipeline" / "1").mkdir(parents=True, exist_ok=True)
    (repo / "pipeline" / "config.pbtxt").write_text(textwrap.dedent("""\
        name: "pipeline"
        platform: "ensemble"
        max_batch_size: 8
        input [ { name: "IMAGE" data_type: TYPE_UINT8 dims: [ 512 ] } ]
        output [ { name: "SCORES" data_type: TYPE_FP32 dims: [ 10 ] } ]
        ensemble_scheduling {
          step [
            { model_name: "preprocess" model_version: -1
              input_map { key: "RAW" value: "IMAGE" } output_map { key: "PIXELS" value: "x" } },
            { model_name: "mlp" model_version: -1
              input_map { key: "x" value: "x" } output_map { key: "y" value: "SCORES" } }
          ]
        }
        """))


def preprocess_then_mlp(model_path: Path, raw: np.ndarray) -> np.ndarray:
    """The pipeline's answer computed in the test process: numpy, then ONNX Runtime."""
    import onnxruntime as ort

    x = (raw.astype(np.float32) / 255.0 - 0.5).astype(np.float32)
    session = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


# Decoupled: N responses for N (I = 0, 1, ...), 0.3 s apart, sent from execute; N < 0: |N| responses,
# but the worker segfaults 0.3 s after sending the second (a message sent just before a crash may
# not have left the process: ZeroMQ sends from its own thread).
STREAMER = """
import ctypes
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            sender = request.get_response_sender()
            for i in range(abs(n)):
                sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("I", np.array([i], np.int32))]))
                time.sleep(0.3)
                if n < 0 and i == 1:
                    ctypes.string_at(0)
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


def build_streamer(repo: Path, name: str = "streamer") -> Path:
    return write_python_model(repo, name, STREAMER, {
        "max_batch_size": 0, "model_transaction_policy": {"decoupled": True},
        "input": [{"name": "N", "data_type": "TYPE_INT32", "dims": [1]}],
        "output": [{"name": "I", "data_type": "TYPE_INT32", "dims": [1]}]})


def build_decoupled_examples(repo: Path) -> Path:
    copy_example(repo, "square_int32", "decoupled/square_model.py", "decoupled/square_config.pbtxt")
    copy_example(repo, "repeat_int32", "decoupled/repeat_model.py", "decoupled/repeat_config.pbtxt")
    return repo


def build_custom_metrics_example(repo: Path) -> Path:
    """The custom_metrics example, laid out as its README says (models/custom_metrics/1/model.py)."""
    copy_example(repo, "custom_metrics", "custom_metrics/model.py", "custom_metrics/config.pbtxt")
    return repo


def build_bls_decoupled_examples(repo: Path) -> Path:
    """bls_decoupled_sync and bls_decoupled_async, and the decoupled square_int32 they call (their README's layout)."""
    copy_example(repo, "bls_decoupled_sync", "bls_decoupled/sync_model.py", "bls_decoupled/sync_config.pbtxt")
    copy_example(repo, "bls_decoupled_async", "bls_decoupled/async_model.py", "bls_decoupled/async_config.pbtxt")
    copy_example(repo, "square_int32", "decoupled/square_model.py", "decoupled/square_config.pbtxt")
    return repo


# Cancellation as Triton's README writes it (Request Cancellation Handling). Decoupled: a thread per request
# sends I = 0 once, then waits, never sending its final flag, until its sender is cancelled; then it notes
# "<request id> <request.is_cancelled()>" in <model folder>/cancelled.log and answers CANCELLED with the final
# flag. execute returns at once. (`model_repository` is the model's folder, as in Triton.)
UNTIL_CANCELLED = """
import os
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.log = os.path.join(args["model_repository"], "cancelled.log")

    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self.respond, args=(request,), daemon=True).start()
        return None

    def respond(self, request):
        sender = request.get_response_sender()
        sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("I", np.array([[0]], np.int32))]))
        while not sender.is_cancelled():
            time.sleep(0.01)
        with open(self.log, "a") as log:
            log.write(f"{request.request_id()} {request.is_cancelled()}\\n")
        sender.send(
            pb_utils.InferenceResponse(error=pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED)),
            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
        )
"""

# Not decoupled: each request waits S seconds, polling request.is_cancelled() as Triton's README does; a
# cancelled one is noted ("<request id>" in <model folder>/cancelled.log) and answered CANCELLED.
POLLS_CANCELLED = """
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.log = os.path.join(args["model_repository"], "cancelled.log")

    def execute(self, requests):
        responses = []
        for request in requests:
            wait_s = float(pb_utils.get_input_tensor_by_name(request, "S").as_numpy()[0])
            deadline = time.monotonic() + wait_s
            while not request.is_cancelled() and time.monotonic() < deadline:
                time.sleep(0.01)
            if request.is_cancelled():
                with open(self.log, "a") as log:
                    log.write(f"{request.request_id()}\\n")
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED)))
            else:
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([wait_s], np.float32))]))
        return responses
"""

# Decoupled: |N| responses sent from a thread, 13 ms apart, each with I = 0, 1, ... and T = time.time() when
# it was sent; execute returns at once for N > 0, and waits for its thread for N < 0. N > 1000: N - 1000
# responses, but the thread segfaults the worker 0.3 s after sending the second.
PACED = """
import ctypes
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        waits = []
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            thread = threading.Thread(target=self.respond, args=(request.get_response_sender(), abs(n)))
            thread.start()
            if n < 0:
                waits.append(thread)
        for thread in waits:
            thread.join()
        return None

    def respond(self, sender, n):
        crash, n = n > 1000, n % 1000
        for i in range(n):
            sender.send(pb_utils.InferenceResponse([
                pb_utils.Tensor("I", np.array([i], np.int32)),
                pb_utils.Tensor("T", np.array([time.time()], np.float64)),
            ]))
            time.sleep(0.3 if crash else 0.013)
            if crash and i == 1:
                ctypes.string_at(0)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""


def build_cancellable(repo: Path) -> None:
    """until_cancelled (decoupled, batched: N is [1, 1]; a request's `timeout` parameter may bound it),
    polls_cancelled and paced."""
    decoupled = {"max_batch_size": 0, "model_transaction_policy": {"decoupled": True}}
    n = [{"name": "N", "data_type": "TYPE_INT32", "dims": [1]}]
    write_python_model(repo, "until_cancelled", UNTIL_CANCELLED, {  # (a queue policy needs a batch dim)
        "max_batch_size": 8, "model_transaction_policy": {"decoupled": True}, "input": n,
        "output": [{"name": "I", "data_type": "TYPE_INT32", "dims": [1]}],
        "dynamic_batching": {"default_queue_policy": {"allow_timeout_override": True}}})
    write_python_model(repo, "polls_cancelled", POLLS_CANCELLED, {
        "max_batch_size": 0, "input": [fp32("S", [1])], "output": [fp32("OUT", [1])]})
    write_python_model(repo, "paced", PACED, {
        **decoupled, "input": n, "output": [{"name": "I", "data_type": "TYPE_INT32", "dims": [1]},
                                            {"name": "T", "data_type": "TYPE_FP64", "dims": [1]}]})
