"""What every ringserve child process does first: logging, and dying with its parent."""
from __future__ import annotations

import ctypes
import logging
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1
LOG_FORMAT = "%(asctime)s %(levelname)s %(processName)s[%(process)d] %(name)s: %(message)s"


def configure_logging(role: str, level: str = "INFO") -> None:
    """Logging is configured again in every child: spawned processes inherit nothing."""
    import multiprocessing

    multiprocessing.current_process().name = role
    logging.basicConfig(level=level.upper(), format=LOG_FORMAT, stream=sys.stderr, force=True)


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
