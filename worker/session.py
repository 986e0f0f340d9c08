"""ONNX Runtime sessions: provider choice (CUDA when it really loads, else CPU)."""
from __future__ import annotations

import ctypes
import logging
import os
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort

from common.config import ModelConfig

log = logging.getLogger(__name__)

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
# ORT logger severities: 0 verbose .. 3 error, 4 fatal.
_ORT_SEVERITY_FATAL = 4
_ORT_SEVERITY_WARNING = 2


@dataclass(frozen=True)
class SessionSettings:
    intra_op_threads: int = 1
    inter_op_threads: int = 1
    # ORT's intra-op pool spin-waits by default, burning a core the gateway needs.
    allow_spinning: bool = False
    use_cuda: bool = True
    cuda_device_id: int = 0


def cuda_unavailable_reason() -> str | None:
    """Why the CUDA provider cannot load here, in one line; None when it can.

    onnxruntime-gpu lists CUDA as available even without CUDA libraries and then
    prints a long error per session. Loading the provider library ourselves tells
    the real reason in one line, before any session tries it.
    """
    if CUDA not in ort.get_available_providers():
        return "this onnxruntime build has no CUDA provider"
    capi = os.path.join(os.path.dirname(ort.__file__), "capi")
    try:
        ctypes.CDLL(os.path.join(capi, "libonnxruntime_providers_shared.so"), mode=ctypes.RTLD_GLOBAL)
        ctypes.CDLL(os.path.join(capi, "libonnxruntime_providers_cuda.so"))
    except OSError as exc:
        return str(exc)
    return None


def choose_providers(settings: SessionSettings) -> list[str | tuple[str, dict]]:
    if settings.use_cuda:
        reason = cuda_unavailable_reason()
        if reason is None:
            return [(CUDA, {"device_id": settings.cuda_device_id}), CPU]
        log.info("execution provider: CPU (CUDA not usable: %s)", reason)
    else:
        log.info("execution provider: CPU (CUDA disabled by configuration)")
    return [CPU]


class ModelSession:
    """One loaded model version: an InferenceSession plus its config."""

    def __init__(self, config: ModelConfig, settings: SessionSettings,
                 providers: list[str | tuple[str, dict]]) -> None:
        self.config = config
        options = ort.SessionOptions()
        options.intra_op_num_threads = settings.intra_op_threads
        options.inter_op_num_threads = settings.inter_op_threads
        options.add_session_config_entry(
            "session.intra_op.allow_spinning", "1" if settings.allow_spinning else "0")
        options.add_session_config_entry(
            "session.inter_op.allow_spinning", "1" if settings.allow_spinning else "0")
        # A CUDA provider that fails at session creation must not spray its error:
        # the one-line reason was already logged by choose_providers.
        ort.set_default_logger_severity(_ORT_SEVERITY_FATAL)
        try:
            self.session = ort.InferenceSession(config.model_path, options, providers=providers)
        finally:
            ort.set_default_logger_severity(_ORT_SEVERITY_WARNING)
        self.provider = self.session.get_providers()[0]
        self.output_names = [o.name for o in self.session.get_outputs()]

    def run(self, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.session.run(self.output_names, inputs)
