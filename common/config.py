"""Kept for code that still imports `ringserve.common.config`: the names now live in

- common/datatypes.py     KServe / Triton / ONNX datatype names, numpy dtypes
- common/model_config.py  Triton's config.json as dataclasses (ModelConfig and its parts)
- common/repository.py    the model repository: scan, versions, auto-complete from ONNX
"""
from __future__ import annotations

from ringserve.common.datatypes import KSERVE_DATATYPES, kserve_datatype_from_ort, numpy_dtype
from ringserve.common.errors import ConfigError
from ringserve.common.model_config import (BATCH_INPUT_KINDS, ONNX_PLATFORM, BatchInput, BatchInputKind,
                                           DynamicBatching, ModelConfig, Padding, QueuePolicy, TensorConfig,
                                           TimeoutAction)
from ringserve.common.repository import AUTO_MAX_BATCH_SIZE, RepositoryScan, load_model, scan_repository

__all__ = ["AUTO_MAX_BATCH_SIZE", "BATCH_INPUT_KINDS", "KSERVE_DATATYPES", "ONNX_PLATFORM", "BatchInput",
           "BatchInputKind", "ConfigError", "DynamicBatching", "ModelConfig", "Padding", "QueuePolicy",
           "RepositoryScan", "TensorConfig", "TimeoutAction", "kserve_datatype_from_ort", "load_model",
           "numpy_dtype", "scan_repository"]
