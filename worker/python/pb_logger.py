"""`pb_utils.Logger`: lines from model code in the worker's log, naming the model whose code the thread
runs (`running_model`, set by worker/python/python_model.py around each call). pb_utils re-exports every name."""

from __future__ import annotations

import enum
import logging
import threading

from .pb_errors import TritonModelException

log = logging.getLogger("ringserve.worker.model")
_local = threading.local()  # the model whose code runs in this thread: Logger's lines name it


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
