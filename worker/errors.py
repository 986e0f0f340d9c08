"""Errors raised inside the worker process."""
from __future__ import annotations


class WorkerError(Exception):
    """Root of worker errors."""


class ModelNotLoaded(WorkerError):
    def __init__(self, model: str) -> None:
        self.model = model
        super().__init__(f"model {model!r} is not loaded in this worker")


class StaleBatch(WorkerError):
    def __init__(self, slot: int, expected: int, found: int) -> None:
        super().__init__(f"slot {slot} holds generation {found}, BATCH named {expected}")


class OutputOverflow(WorkerError):
    def __init__(self, model: str, needed_bytes: int, capacity_bytes: int) -> None:
        super().__init__(
            f"model {model!r}: outputs need {needed_bytes} bytes, the slot has "
            f"{capacity_bytes} left after the inputs"
        )
