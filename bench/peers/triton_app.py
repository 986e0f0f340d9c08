"""Triton Inference Server through PyTriton: the same ONNX model, Triton's dynamic batcher in front.

Runs inside bench/.peers/triton/venv (Python 3.13: the tritonserver bundled in the nvidia-pytriton
wheel embeds libpython3.13 in its Python backend stub, so the venv's interpreter must be 3.13):
    python triton_app.py MODEL_PATH HTTP_PORT GRPC_PORT METRICS_PORT MAX_BATCH QUEUE_DELAY_S

What serves: the real `tritonserver` binary (C++ HTTP front end, KServe v2 JSON and binary tensors,
dynamic batcher with max_batch_size MAX_BATCH and max_queue_delay QUEUE_DELAY_S), whose Python
backend hands each batch to this process, which runs it through ONNX Runtime (CPU, one intra-op
thread, spinning off, as ringserve's worker). SIGINT or SIGTERM stops Triton and this process.
"""
from __future__ import annotations

import signal
import sys

import numpy as np
import onnxruntime as ort
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig


def main() -> None:
    model_path = sys.argv[1]
    http_port, grpc_port, metrics_port, max_batch = (int(v) for v in sys.argv[2:6])
    queue_delay_s = float(sys.argv[6])
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])
    input_name = session.get_inputs()[0].name
    output_name = session.get_outputs()[0].name

    @batch
    def infer(x: np.ndarray) -> dict[str, np.ndarray]:
        return {"y": session.run([output_name], {input_name: x.astype(np.float32, copy=False)})[0]}

    config = TritonConfig(http_address="127.0.0.1", http_port=http_port, grpc_address="127.0.0.1",
                          grpc_port=grpc_port, metrics_port=metrics_port, log_verbose=0)
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))
    # PyTriton guards the statistics (and shared-memory, repository) endpoints with a token it makes up;
    # perf_analyzer reads the statistics after every window (bench protocols), so nothing is restricted.
    with Triton(config=config, security_config=TritonSecurityConfig(restricted_endpoints=[])) as triton:
        triton.bind(model_name="mlp", infer_func=infer,
                    inputs=[Tensor(name="x", dtype=np.float32, shape=(512,))],
                    outputs=[Tensor(name="y", dtype=np.float32, shape=(10,))],
                    config=ModelConfig(max_batch_size=max_batch, batcher=DynamicBatcher(
                        max_queue_delay_microseconds=int(queue_delay_s * 1e6))),
                    strict=False)
        try:
            triton.serve()
        except KeyboardInterrupt:
            pass


if __name__ == "__main__":
    main()
