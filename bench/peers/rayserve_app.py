"""Ray Serve serving an ONNX model with ONNX Runtime and @serve.batch, KServe-v2-shaped JSON.

Runs inside bench/.peers/rayserve/venv: python rayserve_app.py MODEL_PATH PORT MAX_BATCH BATCH_WAIT_S
SIGINT or SIGTERM shuts Serve and Ray down, so no Ray process outlives it.
"""
from __future__ import annotations

import signal
import sys
import time

import numpy as np
import ray
from ray import serve
from starlette.requests import Request


def build(model_path: str, max_batch: int, batch_wait_s: float):
    @serve.deployment(num_replicas=1, max_ongoing_requests=256, ray_actor_options={"num_cpus": 1})
    class Onnx:
        def __init__(self) -> None:
            import onnxruntime as ort

            options = ort.SessionOptions()
            options.intra_op_num_threads = 1  # as ringserve's worker: one thread, no spinning
            options.inter_op_num_threads = 1
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
            self.session = ort.InferenceSession(model_path, options, providers=["CPUExecutionProvider"])
            self.input_name = self.session.get_inputs()[0].name

        @serve.batch(max_batch_size=max_batch, batch_wait_timeout_s=batch_wait_s)
        async def infer(self, rows: list[np.ndarray]) -> list[np.ndarray]:
            y = self.session.run(None, {self.input_name: np.concatenate(rows)})[0]
            return [y[i:i + 1] for i in range(len(rows))]

        async def __call__(self, request: Request) -> dict:
            tensor = (await request.json())["inputs"][0]
            y = await self.infer(np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"]))
            return {"model_name": "mlp", "model_version": "1",
                    "outputs": [{"name": "y", "datatype": "FP32", "shape": list(y.shape), "data": y.ravel().tolist()}]}

    return Onnx.bind()


def main() -> None:
    model_path, port, max_batch, batch_wait_s = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    stop = []
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=100 * 2**20, log_to_driver=False)
    # After ray.init, which installs its own SIGTERM handler (it aborts the driver).
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(True))
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": port})
        serve.run(build(model_path, max_batch, batch_wait_s), name="mlp", route_prefix="/v2/models/mlp/infer")
        while not stop:
            time.sleep(0.2)
    finally:
        serve.shutdown()
        ray.shutdown()


if __name__ == "__main__":
    main()
