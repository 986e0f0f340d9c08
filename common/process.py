"""What every ringserve child process does first: logging, and dying with its parent."""

from __future__ import annotations

import ctypes
import io
import logging
import os
import signal
import sys
import threading
from types import TracebackType

from .logfmt import JsonFormatter, LineHandler, TextFormatter

_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
_PR_GET_NAME = 16
log = logging.getLogger(__name__)


def configure_logging(
    role: str, level: str = "INFO", log_format: str = "text", *, index: int | None = None, generation: int | None = None
) -> None:
    """Logging is configured again in every child: spawned processes inherit nothing.

    `role` is supervisor, gateway or worker; `index` which gateway or worker this is. Every
    logger propagates to the root's one handler (uvicorn's too: the gateway gives it no config of
    its own), so every line of the process has the one format. Python's warnings and uncaught
    exceptions become log lines as well: in json, so that stderr stays one JSON object a line; in
    both, so that a traceback leaves in one write (common/logfmt.py: LineHandler), not line by line
    between other processes' lines.
    """
    import multiprocessing  # noqa: PLC0415 - multiprocessing only for its resource tracker, when a child needs it

    multiprocessing.current_process().name = role if index is None else f"{role}-{index}"
    handler = LineHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(role, index, generation) if log_format == "json" else TextFormatter())
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
    if isinstance(sys.stdout, io.TextIOWrapper):  # (a pipe's is block-buffered: 8 KiB writes cut anywhere)
        sys.stdout.reconfigure(line_buffering=True)  # a model's print() leaves line by line, each whole
    logging.captureWarnings(True)
    sys.excepthook = _log_uncaught
    threading.excepthook = _log_thread_uncaught


def _log_thread_uncaught(args: threading.ExceptHookArgs) -> None:
    _log_uncaught(args.exc_type, args.exc_value or args.exc_type(), args.exc_traceback)


def _log_uncaught(exc_type: type[BaseException], exc_value: BaseException, traceback: TracebackType | None) -> None:
    if issubclass(exc_type, (KeyboardInterrupt, SystemExit)):
        sys.__excepthook__(exc_type, exc_value, traceback)
        return
    log.critical("uncaught exception", exc_info=(exc_type, exc_value, traceback))


def die_with_parent(parent_pid: int, sig: signal.Signals = signal.SIGKILL) -> None:
    """Ask Linux to send `sig` when our parent exits, so no child outlives a killed supervisor.

    The parent may already have died between our spawn and this call; then it is too
    late for the kernel to tell us, so check and go now.
    """
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if parent_pid and os.getppid() != parent_pid:
        os.kill(os.getpid(), sig)


def rename_process(name: str) -> str:
    """Set this process's short name (/proc/<pid>/comm, what top and `ps -o comm` show; at most 15
    bytes), returning the one it had. Call from the main thread (it names the calling thread)."""
    if not sys.platform.startswith("linux"):
        return name
    libc = ctypes.CDLL(None, use_errno=True)
    old = ctypes.create_string_buffer(16)
    libc.prctl(_PR_GET_NAME, old, 0, 0, 0)
    libc.prctl(_PR_SET_NAME, name.encode()[:15], 0, 0, 0)
    return old.value.decode(errors="replace")
