"""ONNX Runtime sessions: provider choice (CUDA when it really loads, else CPU), options, reshape.

Provider options come from the server (--gpus gives each worker its device_id,
--cuda-arena-extend-strategy, --cudnn-conv-algo-search) and may be overridden per model with
the `parameters` Triton's ORT backend reads (cudnn_conv_algo_search 0|1|2,
arena_extend_strategy 0|1, gpu_mem_limit, intra_op_thread_count, inter_op_thread_count,
enable_mem_arena). An instance_group of KIND_CPU keeps a model on the CPU provider.

Triton's `reshape` is applied around each run (common/repository/reshape.py): inputs go to the graph in
their reshape's shape, outputs come back in their config dims, so every caller (a batch, a fused batch, BLS,
warm-up: worker/warmup.py) sees the client's shapes.
"""

from __future__ import annotations

import ctypes
import logging
import os
from dataclasses import dataclass

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

from ringserve.common.repository.config import ModelConfig
from ringserve.common.repository.reshape import refill
from ringserve.common.settings import Settings

from .arena import OutsizedRuns

log = logging.getLogger(__name__)

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
# ORT logger severities: 0 verbose .. 3 error, 4 fatal.
_ORT_SEVERITY_FATAL = 4
_ORT_SEVERITY_WARNING = 2


@dataclass(frozen=True)
class SessionSettings:
    """ONNX Runtime's options of one worker; the user's come from common/settings.py (`from_settings`),
    where their defaults are written."""

    intra_op_threads: int
    use_cuda: bool
    cuda_device_id: int
    cuda_arena_extend_strategy: str  # "" = ORT's default (kNextPowerOfTwo) or kSameAsRequested
    cudnn_conv_algo_search: str  # "" = ORT's default (EXHAUSTIVE), HEURISTIC or DEFAULT
    inter_op_threads: int = 1  # (not the user's: one execution at a time per worker)
    # ORT's intra-op pool spin-waits by default, burning a core the gateway needs.
    allow_spinning: bool = False

    @classmethod
    def from_settings(cls, settings: Settings, index: int) -> SessionSettings:
        """Worker `index`'s; the CPUs are split as the supervisor's affinity allows (a child inherits it)."""
        return cls(
            intra_op_threads=settings.worker_intra_op_threads(),
            use_cuda=not settings.cpu_only,
            cuda_device_id=settings.worker_device_id(index),
            cuda_arena_extend_strategy=settings.cuda_arena_extend_strategy,
            cudnn_conv_algo_search=settings.cudnn_conv_algo_search,
        )


# Triton's ORT backend spells these options as numbers in model config parameters.
_CUDNN_SEARCH = {"0": "EXHAUSTIVE", "1": "HEURISTIC", "2": "DEFAULT"}
_ARENA_EXTEND = {"0": "kNextPowerOfTwo", "1": "kSameAsRequested"}


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


def cuda_options(settings: SessionSettings) -> dict[str, str]:
    options = {"device_id": str(settings.cuda_device_id)}
    if settings.cuda_arena_extend_strategy:
        options["arena_extend_strategy"] = settings.cuda_arena_extend_strategy
    if settings.cudnn_conv_algo_search:
        options["cudnn_conv_algo_search"] = settings.cudnn_conv_algo_search
    return options


def choose_providers(settings: SessionSettings, announce: bool = True) -> list[str | tuple[str, dict]]:
    """CUDA when its provider really loads, else CPU. Why CPU is said at INFO only when `announce`
    (worker 0's first generation: once per server start, worker/__main__.py), else at DEBUG: the
    reason is the same for every worker and every restart (it is the machine's, not the device's)."""
    level = logging.INFO if announce else logging.DEBUG
    if settings.use_cuda:
        reason = cuda_unavailable_reason()
        if reason is None:
            return [(CUDA, cuda_options(settings)), CPU]
        log.log(level, "execution provider: CPU (CUDA not usable: %s)", reason)
    else:
        log.log(level, "execution provider: CPU (CUDA disabled by configuration)")
    return [CPU]


def session_options(settings: SessionSettings) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.intra_op_num_threads = settings.intra_op_threads
    options.inter_op_num_threads = settings.inter_op_threads
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if settings.allow_spinning else "0")
    options.add_session_config_entry("session.inter_op.allow_spinning", "1" if settings.allow_spinning else "0")
    return options


def prime_runtime(settings: SessionSettings, providers: list[str | tuple[str, dict]]) -> None:
    """Create and run one tiny session before any model loads, so that the runtime's one-time
    setup (allocators, kernel registries; on CUDA the device context) is not measured as part of
    the first model's footprint."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "prime", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    ort.set_default_logger_severity(_ORT_SEVERITY_FATAL)
    try:
        session = ort.InferenceSession(model.SerializeToString(), session_options(settings), providers=providers)
        session.run(None, {"x": np.zeros(1, np.float32)})
    finally:
        ort.set_default_logger_severity(_ORT_SEVERITY_WARNING)


class ModelSession:
    """One loaded model version: an InferenceSession plus its config."""

    def __init__(
        self,
        config: ModelConfig,
        settings: SessionSettings,
        providers: list[str | tuple[str, dict]],
        device_id: int | None = None,
    ) -> None:
        self.config = config
        params = model_parameters(config)
        providers = model_providers(config, params, providers, device_id)
        options = session_options(settings)
        options.intra_op_num_threads = int(params.get("intra_op_thread_count", settings.intra_op_threads))
        options.inter_op_num_threads = int(params.get("inter_op_thread_count", settings.inter_op_threads))
        if "enable_mem_arena" in params:
            options.enable_cpu_mem_arena = params["enable_mem_arena"] not in ("0", "false", "False")
        # A CUDA provider that fails at session creation must not spray its error:
        # the one-line reason was already logged by choose_providers.
        ort.set_default_logger_severity(_ORT_SEVERITY_FATAL)
        try:
            self.session = ort.InferenceSession(config.model_path, options, providers=providers)
        finally:
            ort.set_default_logger_severity(_ORT_SEVERITY_WARNING)
        self.provider = self.session.get_providers()[0]
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.outsized = OutsizedRuns()  # an outsized run hands its arena memory back (worker/arena.py)
        # name -> (its dims as laid out, as the other side wants them); ragged inputs and batch outputs keep theirs
        self._input_reshapes = {
            t.name: (t.dims, t.reshape) for t in config.inputs if t.reshape is not None and not t.allow_ragged_batch
        }
        self._output_reshapes = {
            t.name: (t.reshape, t.dims)
            for t in config.outputs
            if t.reshape is not None and t.name not in config.batch_output_sources
        }

    def run(self, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
        if self._input_reshapes:
            inputs = {name: self._reshaped(name, array, self._input_reshapes) for name, array in inputs.items()}
        results = self.session.run(self.output_names, inputs, self.outsized.options_for(inputs))
        if self._output_reshapes:
            results = [self._reshaped(name, r, self._output_reshapes) for name, r in zip(self.output_names, results)]
        return results

    def _reshaped(self, name: str, array: np.ndarray, reshapes: dict) -> np.ndarray:
        if name not in reshapes:
            return array
        from_dims, to_dims = reshapes[name]
        return array.reshape(refill(array.shape, from_dims, to_dims, self.config.max_batch_size > 0))


def model_parameters(config: ModelConfig) -> dict[str, str]:
    """Triton-style `parameters` of the config: {"key": {"string_value": "v"}} -> {"key": "v"}."""
    raw = config.extra.get("parameters") or {}
    return {k: str(v.get("string_value", "")) if isinstance(v, dict) else str(v) for k, v in raw.items()}


def model_providers(
    config: ModelConfig, params: dict[str, str], providers: list[str | tuple[str, dict]], device_id: int | None = None
) -> list[str | tuple[str, dict]]:
    """The server's providers, narrowed to CPU for KIND_CPU models, with per-model CUDA options
    (its device, from instance_group gpus, and Triton's ORT parameters)."""
    if config.lifecycle.cpu_only:
        return [CPU]
    overrides = {} if device_id is None else {"device_id": str(device_id)}
    if "cudnn_conv_algo_search" in params:
        overrides["cudnn_conv_algo_search"] = _CUDNN_SEARCH.get(
            params["cudnn_conv_algo_search"], params["cudnn_conv_algo_search"]
        )
    if "arena_extend_strategy" in params:
        overrides["arena_extend_strategy"] = _ARENA_EXTEND.get(
            params["arena_extend_strategy"], params["arena_extend_strategy"]
        )
    if "gpu_mem_limit" in params:
        overrides["gpu_mem_limit"] = params["gpu_mem_limit"]
    if not overrides:
        return providers
    return [(p[0], {**p[1], **overrides}) if isinstance(p, tuple) and p[0] == CUDA else p for p in providers]
