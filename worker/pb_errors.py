"""The errors of Triton's `triton_python_backend_utils` (pb_utils re-exports them under Triton's names): a
leaf module, so that pb_utils' parts (pb_metrics) raise them without importing pb_utils back."""

from __future__ import annotations


class TritonError(Exception):
    """An error a model answers a request with (InferenceResponse(error=...)), or raises."""

    UNKNOWN, INTERNAL, NOT_FOUND, INVALID_ARG, UNAVAILABLE, UNSUPPORTED, ALREADY_EXISTS, CANCELLED = range(8)

    def __init__(self, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self._message = str(message)
        self.code_given = code is not None  # no code: the model refuses this request (400), see http_status
        self._code = TritonError.INTERNAL if code is None else code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code


class TritonModelException(Exception):
    """Raised by a model (in initialize, execute or finalize) about what it was given."""

    def message(self) -> str:
        return str(self)
