"""Python models for the streaming front doors (Triton's generate extension, gRPC streams' final flags) and
for response parameters: a decoupled token streamer and a model that labels its answers."""
from __future__ import annotations

from pathlib import Path

from tests.support.python_models import write_python_model

# Decoupled: a thread per request sends N responses, TEXT = "tok<i>", each with parameters of Triton's four
# types (index: int, last: bool, word: string, score: double; asked: the request's parameter names),
# `first_delay_s` before the first and `delay_s`
# between them (request parameters), then the final flag alone (or on the last response when the request's
# `final_with_last` is true). Each request's id goes into <model folder>/started.log when its thread starts.
TOKENS = """
import os
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.log = os.path.join(args["model_repository"], "started.log")

    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self.respond, args=(request,), daemon=True).start()
        return None

    def respond(self, request):
        import json
        params = json.loads(request.parameters())
        n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy().reshape(-1)[0])
        with open(self.log, "a") as log:
            log.write(request.request_id() + "\\n")
        sender = request.get_response_sender()
        time.sleep(params.get("first_delay_s", 0))
        last_is_final = params.get("final_with_last", False)
        for i in range(n):
            if i:
                time.sleep(params.get("delay_s", 0))
            text = pb_utils.Tensor("TEXT", np.array([f"tok{i}".encode()], dtype=np.object_))
            labels = {"index": i, "last": i == n - 1, "word": "tok", "score": i + 0.5, "asked": ",".join(sorted(params))}
            final = last_is_final and i == n - 1
            sender.send(pb_utils.InferenceResponse([text], parameters=labels),
                        flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if final else 0)
        if not (last_is_final and n):
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

# Not decoupled: Y = X, each answer with parameters of Triton's four types.
LABELLED = """
import numpy as np
import triton_python_backend_utils as pb_utils

LABELS = {"flag": True, "count": 3, "name": "ok", "ratio": 0.25}


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())],
                                           parameters=LABELS) for r in requests]
"""
LABELS = {"flag": True, "count": 3, "name": "ok", "ratio": 0.25}


def build_tokens(repo: Path, name: str = "tokens") -> Path:
    return write_python_model(repo, name, TOKENS, {
        "max_batch_size": 0, "model_transaction_policy": {"decoupled": True},
        "input": [{"name": "N", "data_type": "TYPE_INT32", "dims": [1]}],
        "output": [{"name": "TEXT", "data_type": "TYPE_STRING", "dims": [1]}]})


def build_labelled(repo: Path, name: str = "labelled") -> Path:
    return write_python_model(repo, name, LABELLED, {
        "max_batch_size": 8,
        "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [1]}],
        "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [1]}]})


# A BLS caller: asks `labelled` for Y = X and answers the parameters of labelled's response (its JSON) as P.
ASKER = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        answers = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy().reshape(1, 1)
            called = pb_utils.InferenceRequest(model_name="labelled", inputs=[pb_utils.Tensor("X", x)],
                                               requested_output_names=["Y"]).exec()
            if called.has_error():
                raise pb_utils.TritonModelException(called.error().message())
            answers.append(pb_utils.InferenceResponse(
                [pb_utils.Tensor("P", np.array([called.parameters().encode()], dtype=np.object_))]))
        return answers
"""


def build_asker(repo: Path, name: str = "asker") -> Path:
    return write_python_model(repo, name, ASKER, {
        "max_batch_size": 0,
        "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [1]}],
        "output": [{"name": "P", "data_type": "TYPE_STRING", "dims": [1]}]})
