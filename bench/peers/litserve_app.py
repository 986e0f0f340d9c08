"""LitServe serving an ONNX model with ONNX Runtime, KServe-v2-shaped JSON in and out.

Runs inside bench/.peers/litserve/venv: python litserve_app.py MODEL_PATH PORT MAX_BATCH BATCH_TIMEOUT_S
"""
from __future__ import annotations

import sys

import litserve as ls
import numpy as np
import onnxruntime as ort


class OnnxApi(ls.LitAPI):
    def __init__(self, model_path: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.model_path = model_path  # travels with the API object into LitServe's worker process

    def setup(self, device) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1  # as ringserve's worker: one thread, no spinning
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(self.model_path, options, providers=["CPUExecutionProvider"])
        self.input_name = self.session.get_inputs()[0].name

    def decode_request(self, request):
        tensor = request["inputs"][0]
        return np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"])

    def batch(self, inputs):
        return np.concatenate(inputs)

    def predict(self, x):
        return self.session.run(None, {self.input_name: x})[0]

    def unbatch(self, output):
        return [row[None, :] for row in output]

    def encode_response(self, y):
        return {"model_name": "mlp", "model_version": "1",
                "outputs": [{"name": "y", "datatype": "FP32", "shape": list(y.shape), "data": y.ravel().tolist()}]}


if __name__ == "__main__":
    model_path, port, max_batch, batch_timeout_s = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    api = OnnxApi(model_path, max_batch_size=max_batch, batch_timeout=batch_timeout_s, api_path="/v2/models/mlp/infer")
    # fast_queue: LitServe's ZeroMQ queue between the API server and the inference worker,
    # its documented option for throughput.
    server = ls.LitServer(api, accelerator="cpu", workers_per_device=1, fast_queue=True)
    server.run(host="127.0.0.1", port=port, num_api_servers=1, generate_client_file=False, log_level="warning")
