"""Errors raised inside the worker process."""

from __future__ import annotations


class WorkerError(Exception):
    """Root of worker errors."""


class StaleBatch(WorkerError):
    def __init__(self, slot: int, expected: int, found: int) -> None:
        super().__init__(f"slot {slot} holds generation {found}, BATCH named {expected}")


class OutputOverflow(WorkerError):
    def __init__(self, model: str, needed_bytes: int, capacity_bytes: int) -> None:
        super().__init__(
            f"model {model!r}: outputs need {needed_bytes} bytes, the slot has {capacity_bytes} left after the inputs"
        )


class OutputsDoNotFit(WorkerError):
    """Tensors need more bytes than the slot has left (worker/slots.py: write_packed); each caller says it
    its own way (OutputOverflow for an ONNX batch, a request's AnswerError for the models that answer each)."""

    def __init__(self, needed_bytes: int, left_bytes: int) -> None:
        self.needed_bytes, self.left_bytes = needed_bytes, left_bytes
        super().__init__(f"the tensors need {needed_bytes} bytes; the slot has {left_bytes} left")


def _mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


class BudgetExhausted(WorkerError):
    """A load that does not fit the memory budget, even after evicting every idle model."""

    def __init__(
        self, model: str, version: int, need_bytes: int, budget_bytes: int, held_bytes: int, holders: list[str]
    ) -> None:
        self.model, self.version = model, version
        self.need_bytes, self.budget_bytes, self.held_bytes = need_bytes, budget_bytes, held_bytes
        by = f" ({', '.join(holders)})" if holders else ""
        super().__init__(
            f"model memory budget exhausted: model {model!r} version {version} needs {need_bytes} bytes "
            f"({_mib(need_bytes)}); the budget is {budget_bytes} bytes ({_mib(budget_bytes)}) and "
            f"{held_bytes} bytes ({_mib(held_bytes)}) are held by models that cannot be evicted now{by}"
        )


class ModelLoadFailed(WorkerError):
    """The runtime could not load the model (kept as the model's `failed` reason)."""

    def __init__(self, model: str, version: int, reason: str) -> None:
        self.model, self.version, self.reason = model, version, reason
        super().__init__(f"model {model!r} version {version} failed to load: {reason}")


class ModelNotReady(WorkerError):
    """A model's code asked for a version not loaded while a load runs in its own thread (a BLS call in
    initialize): waiting would wait for itself, so it is answered at once, as Triton's "not ready"."""

    def __init__(self, model: str, version: int, state: str) -> None:
        self.model, self.version = model, version
        super().__init__(
            f"model {model!r} version {version} is not ready ({state}): a model's initialize may call only "
            "models loaded before it (eager ones load in name order), not load one"
        )


class ModelNotServed(WorkerError):
    def __init__(self, model: str, version: int | None) -> None:
        what = f"model {model!r}" + (f" version {version}" if version is not None else "")
        super().__init__(f"{what} is not served by this worker")


class NotText(WorkerError):
    """A BYTES input that is not UTF-8, for a runtime whose string tensors take text: ONNX Runtime's Python
    API passes str (bytes elements become their repr, and a numpy 'S' array stops at the first NUL), so
    these bytes cannot reach the model as they were sent. The gateway's bisection gives its request a 400."""

    def __init__(self, name: str, detail: str) -> None:
        super().__init__(
            f"input {name!r}: {detail}; ONNX Runtime's string tensors take UTF-8 text only "
            "(send the bytes as UINT8 to a model that reads them so)"
        )


class ModelCodeExited(WorkerError):
    """A model's own code raised a BaseException that is no Exception (sys.exit(), KeyboardInterrupt,
    GeneratorExit): the call it came from fails as if it had raised an error (a failed load, a failed
    batch), and the worker, its loader thread and the other models go on."""

    def __init__(self, hook: str, exc: BaseException) -> None:
        self.hook = hook
        super().__init__(f"{hook} raised {type(exc).__name__}: {exc}")


class StopRequested(SystemExit):
    """SIGTERM before the batch loop runs (worker/__main__.py): a stop, never mistaken for a model's sys.exit()."""
