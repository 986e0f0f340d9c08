"""MLServer custom runtime serving an ONNX model with ONNX Runtime (MLServer has none built in).

Runs inside bench/.peers/mlserver/venv. MLServer's adaptive batching (max_batch_size,
max_batch_time in model-settings.json) merges requests before predict() sees them.
"""
from __future__ import annotations

import onnxruntime as ort
from mlserver import MLModel
from mlserver.codecs import NumpyCodec
from mlserver.types import InferenceRequest, InferenceResponse
from mlserver.utils import get_model_uri


class OnnxModel(MLModel):
    async def load(self) -> bool:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1  # as ringserve's worker: one thread, no spinning
        options.inter_op_num_threads = 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.session = ort.InferenceSession(await get_model_uri(self.settings), options,
                                            providers=["CPUExecutionProvider"])
        self.input_name = self.session.get_inputs()[0].name
        self.output_name = self.session.get_outputs()[0].name
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        x = NumpyCodec.decode_input(payload.inputs[0])
        (y,) = self.session.run([self.output_name], {self.input_name: x})
        return InferenceResponse(model_name=self.name, outputs=[NumpyCodec.encode_output(self.output_name, y)])
