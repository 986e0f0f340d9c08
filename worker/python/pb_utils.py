"""`triton_python_backend_utils`, as a Python model imports it inside a ringserve worker.

    import triton_python_backend_utils as pb_utils

worker/python/python_model.py registers this module in `sys.modules` under Triton's name before it
imports a model.py, so Triton's models run unchanged while the wheel keeps its one import root
(`ringserve`): nothing named triton_python_backend_utils is installed. Only workers import it;
the gateway and the supervisor never import a model.py (pyproject's import-linter contracts).

The surface is the one Triton's python_backend README documents: Tensor (pb_tensor.py), InferenceRequest
(Triton's positional order; inputs, requested_output_names, request_id, parameters, timeout,
get_response_sender, exec and async_exec for BLS), InferenceResponse, InferenceResponseSender, TritonError,
TritonModelException (pb_errors.py), Logger (with its LogLevel; pb_logger.py), MetricFamily (pb_metrics.py),
ModelConfig (pb_config.py) and the helper functions and constants (the datatype helpers in pb_tensor.py);
every name is importable from this module. What is not built raises `UnsupportedFeature` (a
TritonModelException) naming it, and any other name of the module raises AttributeError saying so.

BLS requests go to the worker's runtime (`set_runtime`, worker/bls.py), which runs the named
model of the repository in this process.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any, Protocol

from .pb_config import AutoCompleteConfig
from .pb_errors import TritonError as TritonError
from .pb_errors import TritonModelException as TritonModelException
from .pb_errors import UnsupportedFeature as UnsupportedFeature
from .pb_errors import http_status as http_status
from .pb_logger import Logger as Logger
from .pb_logger import LogLevel as LogLevel
from .pb_logger import running_model as running_model
from .pb_metrics import MetricFamily
from .pb_tensor import TRITON_STRING_TO_NUMPY as TRITON_STRING_TO_NUMPY
from .pb_tensor import Tensor as Tensor
from .pb_tensor import deserialize_bytes_tensor as deserialize_bytes_tensor
from .pb_tensor import numpy_to_triton_string as numpy_to_triton_string
from .pb_tensor import numpy_to_triton_type as numpy_to_triton_type
from .pb_tensor import serialize_byte_tensor as serialize_byte_tensor
from .pb_tensor import triton_string_to_numpy as triton_string_to_numpy
from .pb_tensor import triton_to_numpy_type as triton_to_numpy_type

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
    """A decoupled model's way to answer one request any number of times (worker/python/decoupled.py sends)."""

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

    def correlation_id(self) -> int | str:  # (Triton: a number or a string id)
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
        decoupled=True an iterator of a decoupled model's responses (worker/python/bls_stream.py)."""
        if _runtime is None:
            raise TritonModelException("BLS requests can be made only from execute()")
        return _runtime.stream(self) if decoupled else _runtime.infer(self)

    async def async_exec(self, decoupled: bool = False) -> InferenceResponse | Iterator[InferenceResponse]:
        """exec() for `async def execute`: awaitable (gather several); those to models of other lanes run
        at once, those to this worker's own models one after the other."""
        if decoupled or _runtime is None:
            return self.exec(decoupled)  # (a decoupled one's iterator, or the refusal)
        return await _runtime.infer_async(self)


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
