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
