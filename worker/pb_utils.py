"""`triton_python_backend_utils`, as a Python model imports it inside a ringserve worker.

    import triton_python_backend_utils as pb_utils

worker/python_model.py registers this module in `sys.modules` under Triton's name before it
imports a model.py, so Triton's models run unchanged while the wheel keeps its one import root
(`ringserve`): nothing named triton_python_backend_utils is installed. Only workers import it;
the gateway and the supervisor never import a model.py (pyproject's import-linter contracts).

The surface is the one Triton's python_backend README documents: Tensor, InferenceRequest
(Triton's positional order; inputs, requested_output_names, request_id, parameters, timeout,
get_response_sender, exec and async_exec for BLS), InferenceResponse, InferenceResponseSender,
TritonError, TritonModelException, Logger (with its LogLevel), MetricFamily (worker/pb_metrics.py),
ModelConfig (worker/pb_config.py) and the helper functions and constants. What is not built raises
`UnsupportedFeature` (a TritonModelException) naming it, and any other name of the module raises
AttributeError saying so.

BLS requests go to the worker's runtime (`set_runtime`, worker/bls.py), which runs the named
model of the repository in this process.
"""

from __future__ import annotations

import enum
import json
import logging
import threading
from collections.abc import Iterator
from typing import Any, Protocol

import numpy as np

from ringserve.common.wire import deserialize_bytes_tensor as deserialize_bytes
from ringserve.common.wire import serialize_bytes_tensor

from .pb_config import AutoCompleteConfig
from .pb_errors import TritonError, TritonModelException
from .pb_metrics import MetricFamily

# Triton's name for it: pb_utils.ModelConfig (the class is named apart from the server's ModelConfig)
ModelConfig = AutoCompleteConfig

__all__ = [
    "InferenceRequest",
    "InferenceResponse",
    "InferenceResponseSender",
    "LogLevel",
    "Logger",
    "MetricFamily",
    "ModelConfig",
    "Tensor",
    "TritonError",
    "TritonModelException",
    "UnsupportedFeature",
]

TRITONSERVER_REQUEST_FLAG_SEQUENCE_START = 1
TRITONSERVER_REQUEST_FLAG_SEQUENCE_END = 2
TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1
TRITONSERVER_REQUEST_RELEASE_ALL = 1
TRITONSERVER_REQUEST_RELEASE_RESCHEDULE = 2
TRITONSERVER_MEMORY_CPU = 0
TRITONSERVER_MEMORY_GPU = 2

TRITON_STRING_TO_NUMPY = {
    "TYPE_BOOL": bool,
    "TYPE_UINT8": np.uint8,
    "TYPE_UINT16": np.uint16,
    "TYPE_UINT32": np.uint32,
    "TYPE_UINT64": np.uint64,
    "TYPE_INT8": np.int8,
    "TYPE_INT16": np.int16,
    "TYPE_INT32": np.int32,
    "TYPE_INT64": np.int64,
    "TYPE_FP16": np.float16,
    "TYPE_FP32": np.float32,
    "TYPE_FP64": np.float64,
    "TYPE_STRING": np.object_,
}
# Triton's DataType enum numbers (model_config.proto), BOOL = 1 .. STRING = 13.
_TRITON_TYPE_NUMBERS = [
    np.bool_,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.float16,
    np.float32,
    np.float64,
    np.object_,
]

log = logging.getLogger("ringserve.worker.model")
_local = threading.local()  # the model whose code runs in this thread: Logger's lines name it


class UnsupportedFeature(TritonModelException):
    """A part of pb_utils that ringserve's Python models do not have."""

    def __init__(self, what: str) -> None:
        super().__init__(f"{what} is not supported by ringserve's Python models (docs/models.md lists what is)")


def http_status(error: BaseException) -> int:
    """The status a request failed by `error` is answered with: the model refusing what it was given
    (TritonModelException, a TritonError without a code or with an input's code) is 400; UNAVAILABLE
    503; CANCELLED 499; INTERNAL, UNKNOWN and any other exception, a bug in model.py, 500."""
    if isinstance(error, TritonError):
        if not error.code_given:
            return 400
        return {
            TritonError.INVALID_ARG: 400,
            TritonError.NOT_FOUND: 400,
            TritonError.UNSUPPORTED: 400,
            TritonError.ALREADY_EXISTS: 400,
            TritonError.UNAVAILABLE: 503,
            TritonError.CANCELLED: 499,
        }.get(error.code(), 500)
    return 400 if isinstance(error, TritonModelException) else 500


class Tensor:
    """A named numpy array. Inputs of a request are read-only views of its rows in the batch's slot."""

    def __init__(self, name: str, data: Any, *_: Any) -> None:
        if not isinstance(data, np.ndarray):
            raise TritonModelException(f"Tensor {name!r}: expected a numpy array, got {type(data).__name__}")
        self._name, self._array = str(name), data

    def name(self) -> str:
        return self._name

    def as_numpy(self) -> np.ndarray:
        return self._array

    def shape(self) -> list[int]:
        return list(self._array.shape)

    def triton_dtype(self) -> int:
        return numpy_to_triton_type(self._array.dtype.type)

    def is_cpu(self) -> bool:
        return True

    def to_dlpack(self) -> Any:
        """A DLPack capsule of the array. numpy exports no read-only array: such one is copied first
        (a request's inputs are writable, over a private mapping of the slot: worker/requests.py)."""
        if self._array.dtype.hasobject:
            raise UnsupportedFeature(f"to_dlpack of BYTES tensor {self._name!r}")
        array = self._array if self._array.flags.writeable else self._array.copy()
        return array.__dlpack__()

    def __dlpack__(self, stream: Any = None) -> Any:
        return self.to_dlpack()

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)  # kDLCPU

    @staticmethod
    def from_dlpack(name: str, tensor: Any) -> Tensor:
        """From an object with __dlpack__ (a torch tensor, ...) or a DLPack capsule, on the CPU."""
        source = tensor if hasattr(tensor, "__dlpack__") else _Capsule(tensor)
        try:
            return Tensor(name, np.from_dlpack(source))
        except (BufferError, TypeError, RuntimeError) as exc:
            raise TritonModelException(
                f"Tensor.from_dlpack({name!r}): {exc} (only C-contiguous CPU tensors of numpy's types are accepted)"
            ) from None


class _Capsule:
    """A bare DLPack capsule as numpy.from_dlpack takes it (an object with __dlpack__)."""

    def __init__(self, capsule: Any) -> None:
        self.capsule = capsule

    def __dlpack__(self, stream: Any = None, **_: Any) -> Any:
        return self.capsule

    def __dlpack_device__(self) -> tuple[int, int]:
        return (1, 0)


class InferenceResponse:
    """A model's answer to one request: output tensors, or an error."""

    def __init__(
        self,
        output_tensors: list[Tensor] | None = None,
        error: TritonError | None = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        self._outputs = list(output_tensors or [])
        self._error = TritonError(error) if isinstance(error, str) else error
        self._parameters = parameters  # written as JSON when asked for (per request, json.dumps costs µs)

    def output_tensors(self) -> list[Tensor]:
        return self._outputs

    def has_error(self) -> bool:
        return self._error is not None

    def error(self) -> TritonError | None:
        return self._error

    def parameters(self) -> str:
        return _json(self._parameters)


def _json(parameters: dict[str, Any] | str | None) -> str:
    return parameters if isinstance(parameters, str) else json.dumps(parameters or {})


class InferenceResponseSender:
    """A decoupled model's way to answer one request any number of times (worker/decoupled.py sends)."""

    def __init__(self, send: Any, cancelled: Any = None) -> None:
        self._send, self._cancelled = send, cancelled
        self.closed = False

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        if self.closed:
            raise TritonModelException(
                "this response sender has sent its final response "
                "(flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL); it cannot send again"
            )
        if response is None and flags != TRITONSERVER_RESPONSE_COMPLETE_FINAL:
            raise TritonModelException("send() needs a response, or flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL")
        final = flags == TRITONSERVER_RESPONSE_COMPLETE_FINAL
        self.closed = final
        self._send(response, final)

    def is_cancelled(self) -> bool:
        return bool(self._cancelled and self._cancelled())


class BlsRunner(Protocol):
    """What runs BLS requests: the worker's models (worker/bls.py)."""

    def infer(self, request: InferenceRequest) -> InferenceResponse: ...

    def stream(self, request: InferenceRequest) -> Iterator[InferenceResponse]: ...

    async def infer_async(self, request: InferenceRequest) -> InferenceResponse: ...

    def is_model_ready(self, model_name: str, model_version: str) -> bool: ...


_runtime: BlsRunner | None = None


def set_runtime(runtime: BlsRunner | None) -> None:
    global _runtime
    _runtime = runtime


class InferenceRequest:
    """One request: a client's (execute gets one per request of the batch), or a BLS request a model makes."""

    # Triton's positional order (pb_stub.cc binds request_id, correlation_id, inputs,
    # requested_output_names, model_name, model_version, flags, timeout, preferred_memory, trace,
    # parameters); Triton requires inputs, requested_output_names and model_name, here they default.
    def __init__(
        self,
        request_id: str = "",
        correlation_id: int | str = 0,
        inputs: list[Tensor] | None = None,
        requested_output_names: list[str] | None = None,
        model_name: str | bytes = "",
        model_version: int = -1,
        flags: int = 0,
        timeout: int = 0,
        preferred_memory: Any = None,
        trace: Any = None,
        parameters: dict[str, Any] | str | None = None,
    ) -> None:
        # A name read from a BYTES tensor is bytes, as in Triton's own BLS example.
        self.model_name = model_name.decode() if isinstance(model_name, bytes) else str(model_name)
        self.model_version = int(model_version)
        self._inputs = list(inputs or [])
        self._requested = list(requested_output_names or [])
        self._request_id, self._correlation_id, self._flags = str(request_id or ""), correlation_id, flags
        self._timeout_us = int(timeout)
        self._parameters = parameters
        self._sender: InferenceResponseSender | None = None  # set for a decoupled model's requests
        self._cancelled: Any = None

    def inputs(self) -> list[Tensor]:
        return self._inputs

    def requested_output_names(self) -> list[str]:
        return self._requested

    def request_id(self) -> str:
        return self._request_id

    def correlation_id(self) -> int:
        return self._correlation_id

    def flags(self) -> int:
        return self._flags

    def parameters(self) -> str:
        return _json(self._parameters)

    def timeout(self) -> int:
        """The request's timeout in microseconds (a client's `timeout` parameter); 0: none."""
        return self._timeout_us

    def is_cancelled(self) -> bool:
        return bool(self._cancelled and self._cancelled())

    def get_response_sender(self) -> InferenceResponseSender:
        if self._sender is None:
            raise UnsupportedFeature(
                "get_response_sender() of a model that is not decoupled (set "
                "model_transaction_policy { decoupled: true })"
            )
        return self._sender

    def set_release_flags(self, flags: int) -> None:
        raise UnsupportedFeature("request rescheduling (set_release_flags)")

    def exec(self, decoupled: bool = False) -> InferenceResponse | Iterator[InferenceResponse]:
        """Run this request on the named model of the repository, in this worker (BLS); with
        decoupled=True an iterator of a decoupled model's responses (worker/bls_stream.py)."""
        if _runtime is None:
            raise TritonModelException("BLS requests can be made only from execute()")
        return _runtime.stream(self) if decoupled else _runtime.infer(self)

    async def async_exec(self, decoupled: bool = False) -> InferenceResponse | Iterator[InferenceResponse]:
        """exec() for `async def execute`: awaitable (gather several); those to models of other lanes run
        at once, those to this worker's own models one after the other."""
        if decoupled or _runtime is None:
            return self.exec(decoupled)  # (a decoupled one's iterator, or the refusal)
        return await _runtime.infer_async(self)


class LogLevel(enum.IntEnum):
    """Triton's pb_utils.Logger.LogLevel (its numbers: INFO 0, WARNING 1, ERROR 2, VERBOSE 3)."""

    INFO = 0
    WARNING = 1
    ERROR = 2
    VERBOSE = 3


_LOG_LEVELS = {
    LogLevel.INFO: logging.INFO,
    LogLevel.WARNING: logging.WARNING,
    LogLevel.ERROR: logging.ERROR,
    LogLevel.VERBOSE: logging.DEBUG,
}


class Logger:
    """Lines from model code, in the worker's log, naming the model (pb_utils.Logger.log_info(...)).
    Levels as Triton's: `Logger.log(msg, Logger.LogLevel.WARNING)`, or `Logger.WARNING` (exported);
    VERBOSE lines show with --log-level DEBUG."""

    LogLevel = LogLevel
    INFO, WARNING, ERROR, VERBOSE = LogLevel.INFO, LogLevel.WARNING, LogLevel.ERROR, LogLevel.VERBOSE

    @staticmethod
    def log(message: str, level: int = LogLevel.INFO) -> None:  # (a LogLevel is an int)
        try:
            python_level = _LOG_LEVELS[LogLevel(level)]
        except ValueError:
            raise TritonModelException(f"Logger.log: level {level!r} is not one of Logger.LogLevel") from None
        log.log(python_level, "model %s: %s", getattr(_local, "model", "?"), message)

    @staticmethod
    def log_info(message: str) -> None:
        Logger.log(message, LogLevel.INFO)

    @staticmethod
    def log_warn(message: str) -> None:
        Logger.log(message, LogLevel.WARNING)

    @staticmethod
    def log_error(message: str) -> None:
        Logger.log(message, LogLevel.ERROR)

    @staticmethod
    def log_verbose(message: str) -> None:
        Logger.log(message, LogLevel.VERBOSE)


def running_model(name: str | None) -> str | None:
    """Name the model whose code this thread runs now (Logger's lines carry it); the one named before
    (a BLS call runs another model's execute inside the caller's, which goes on afterwards)."""
    previous, _local.model = getattr(_local, "model", None), name
    return previous


# -- the helpers ------------------------------------------------------------------------------
def get_input_tensor_by_name(inference_request: InferenceRequest, name: str) -> Tensor | None:
    return next((t for t in inference_request.inputs() if t.name() == name), None)


def get_output_tensor_by_name(inference_response: InferenceResponse, name: str) -> Tensor | None:
    return next((t for t in inference_response.output_tensors() if t.name() == name), None)


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((t for t in model_config.get("input", ()) if t["name"] == name), None)


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    return next((t for t in model_config.get("output", ()) if t["name"] == name), None)


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    return bool((model_config.get("model_transaction_policy") or {}).get("decoupled", False))


def triton_string_to_numpy(triton_type_string: str) -> Any:
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def numpy_to_triton_string(data_type: Any) -> str:
    """'TYPE_FP32' for np.float32 (object and bytes_ arrays: 'TYPE_STRING')."""
    dtype = np.dtype(data_type)
    if dtype.hasobject or dtype.kind == "S":
        return "TYPE_STRING"
    return next(t for t, n in TRITON_STRING_TO_NUMPY.items() if np.dtype(n) == dtype)


def triton_to_numpy_type(data_type: int) -> Any:
    return _TRITON_TYPE_NUMBERS[data_type - 1] if 1 <= data_type <= len(_TRITON_TYPE_NUMBERS) else None


def numpy_to_triton_type(data_type: Any) -> int | None:
    dtype = np.dtype(data_type)
    if dtype.hasobject or dtype.kind == "S":
        return 13
    return next((i + 1 for i, n in enumerate(_TRITON_TYPE_NUMBERS) if np.dtype(n) == dtype), None)


def serialize_byte_tensor(input_tensor: np.ndarray) -> np.ndarray:
    return np.frombuffer(serialize_bytes_tensor(input_tensor), np.uint8)


def deserialize_bytes_tensor(encoded_tensor: Any) -> np.ndarray:
    """Every element of KServe's binary BYTES form, as a 1-D object array of bytes."""
    view, count, offset = memoryview(encoded_tensor).cast("B"), 0, 0
    while offset + 4 <= len(view):  # (the element count is not written down: walk the lengths once)
        offset += 4 + int.from_bytes(view[offset : offset + 4], "little")
        count += 1
    return deserialize_bytes(view, (count,))


def load_model(*_: Any, **__: Any) -> None:
    raise UnsupportedFeature("loading models from a model (pb_utils.load_model): use the repository API")


def unload_model(*_: Any, **__: Any) -> None:
    raise UnsupportedFeature("unloading models from a model (pb_utils.unload_model): use the repository API")


def is_model_ready(model_name: str, model_version: str = "") -> bool:
    if _runtime is None:
        raise TritonModelException("is_model_ready can be asked only from execute()")
    return _runtime.is_model_ready(model_name, model_version)


def PreferredMemory(*_: Any, **__: Any) -> Any:  # noqa: N802 - Triton's class name
    raise UnsupportedFeature("preferred_memory of BLS requests (pb_utils.PreferredMemory)")


def __getattr__(name: str) -> Any:
    raise AttributeError(
        f"triton_python_backend_utils.{name} is not supported by ringserve's Python models "
        "(docs/models.md lists what is)"
    )
