"""Two Python models for BLS streams across lanes: `listener` calls the decoupled `ticker` with
exec(decoupled=True), and with `--lanes model` (the default) each has a lane of its own."""

from __future__ import annotations

from pathlib import Path

from tests.support.python_models import write_python_model

# Decoupled, as Triton's README writes one: execute hands each request's sender to a thread and returns. The
# thread sends N responses (I = i, SENT = when it sent it), `gap_s` apart, then the final flag alone (with
# parameter final_with_last: on the last response). Sent its
# first response, it writes its pid to <marks>/streaming; cancelled (sender.is_cancelled(), looked at every
# 10 ms), it touches <marks>/cancelled and ends with a CANCELLED error and the final flag.
TICKER = """
import json
import os
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy()[0])
            parameters = json.loads(request.parameters() or "{}")
            threading.Thread(target=self.tick, args=(request.get_response_sender(), n, parameters["gap_s"],
                                                     parameters.get("marks", ""), parameters.get("final_with_last")),
                             daemon=True).start()
        return None

    def tick(self, sender, n, gap_s, marks, final_with_last):
        for i in range(n):
            if sender.is_cancelled():
                if marks:
                    open(os.path.join(marks, "cancelled"), "w").close()
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError(
                    "ticker: cancelled", pb_utils.TritonError.CANCELLED)),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return
            last = final_with_last and i == n - 1
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("I", np.array([i], np.int32)),
                                                    pb_utils.Tensor("SENT", np.array([time.time()]))]),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if last else 0)
            if last:
                return
            if i == 0 and marks:
                with open(os.path.join(marks, "streaming"), "w") as f:
                    f.write(str(os.getpid()))
            due = time.monotonic() + gap_s
            while time.monotonic() < due and not sender.is_cancelled():
                time.sleep(0.01)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

# Asks ticker for N responses and answers SENT (when ticker sent each), GOT (when its iterator yielded it),
# ERROR (the error responses' messages, joined) and COUNT (every response the iterator yielded, empty ones
# too); its first response got, it touches <marks>/received. parameters: gap_s, marks and final_with_last (ticker's), timeout_us (the BLS
# request's timeout), mode: "sync" exec(decoupled=True), "async" async_exec(decoupled=True), "cancel" cancel()
# after the first response, "strict" an error response raises (the request's answer is an error).
LISTENER = """
import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            parameters = json.loads(request.parameters() or "{}")
            mode = parameters.get("mode", "sync")
            ask = pb_utils.InferenceRequest(
                model_name="ticker", requested_output_names=["I", "SENT"],
                inputs=[pb_utils.get_input_tensor_by_name(request, "N")],
                parameters={k: v for k, v in parameters.items() if k in ("gap_s", "marks", "final_with_last")},
                timeout=parameters.get("timeout_us", 0))
            answers = await ask.async_exec(decoupled=True) if mode == "async" else ask.exec(decoupled=True)
            sent, got, errors, count = [], [], [], 0
            for answer in answers:
                at, count = time.time(), count + 1
                if answer.has_error():
                    if mode == "strict":
                        raise pb_utils.TritonModelException(answer.error().message())
                    errors.append(answer.error().message())
                elif answer.output_tensors():
                    sent.append(float(pb_utils.get_output_tensor_by_name(answer, "SENT").as_numpy()[0]))
                    got.append(at)
                    if len(got) == 1 and parameters.get("marks"):
                        open(os.path.join(parameters["marks"], "received"), "w").close()
                    if mode == "cancel" and len(got) == 1:
                        answers.cancel()
            responses.append(pb_utils.InferenceResponse([
                pb_utils.Tensor("SENT", np.array(sent, np.float64)), pb_utils.Tensor("GOT", np.array(got, np.float64)),
                pb_utils.Tensor("ERROR", np.array([" | ".join(errors).encode()], dtype=object)),
                pb_utils.Tensor("COUNT", np.array([count], np.int32))]))
        return responses
"""


def build_bls_stream(repo: Path) -> Path:
    n = {"name": "N", "data_type": "TYPE_INT32", "dims": [1]}
    write_python_model(repo, "ticker", TICKER, {
        "max_batch_size": 0, "model_transaction_policy": {"decoupled": True}, "input": [n],
        "output": [{"name": "I", "data_type": "TYPE_INT32", "dims": [1]},
                   {"name": "SENT", "data_type": "TYPE_FP64", "dims": [1]}]})
    write_python_model(repo, "listener", LISTENER, {
        "max_batch_size": 0, "input": [n],
        "output": [{"name": "SENT", "data_type": "TYPE_FP64", "dims": [-1]},
                   {"name": "GOT", "data_type": "TYPE_FP64", "dims": [-1]},
                   {"name": "ERROR", "data_type": "TYPE_STRING", "dims": [1]},
                   {"name": "COUNT", "data_type": "TYPE_INT32", "dims": [1]}]})
    return repo


def listener_doc(n: int, gap_s: float, mode: str = "sync", **parameters: object) -> dict:
    return {"inputs": [{"name": "N", "datatype": "INT32", "shape": [1], "data": [n]}],
            "parameters": {"gap_s": gap_s, "mode": mode, **parameters}}
