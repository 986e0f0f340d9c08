"""Native failures on demand, for chaos tests only.

Inert unless the worker runs with RINGSERVE_FAULT_INJECTION=1: then a request with
parameter `ringserve_fault` makes the worker fail natively while running its batch.
"""
from __future__ import annotations

import ctypes
import os
import signal
import time
from typing import TYPE_CHECKING

FAULT_KINDS = ("segv", "abort", "exit", "hang", "oom", "slow")
ENABLED = os.environ.get("RINGSERVE_FAULT_INJECTION") == "1"
# Exit status of the `exit` fault, distinct from every status the worker uses itself.
FAULT_EXIT_CODE = 17
# The `slow` fault: a load or a batch that takes this long, GIL released (heartbeats go on).
SLOW_FAULT_S = 2.0


if TYPE_CHECKING:
    from ringserve.common.model_config import ModelConfig

LOAD_FAULT_PARAMETER = "ringserve_fault_on_load"


def trigger_on_load(config: ModelConfig) -> None:
    """A model whose config has parameters.ringserve_fault_on_load fails natively while loading."""
    if ENABLED:
        parameter = dict(config.extra.get("parameters", {})).get(LOAD_FAULT_PARAMETER)
        if parameter:
            trigger(parameter.get("string_value", ""))


def trigger(kind: str) -> None:
    if not ENABLED:
        return
    if kind == "segv":
        ctypes.string_at(0)  # a real invalid read: the kernel sends SIGSEGV
    elif kind == "abort":
        os.abort()
    elif kind == "exit":
        os._exit(FAULT_EXIT_CODE)
    elif kind == "hang":
        # PyDLL keeps the GIL during the call, so the heartbeat thread stops too:
        # to the supervisor this is a wedged native call.
        ctypes.PyDLL(None).sleep(3600)
    elif kind == "slow":
        time.sleep(SLOW_FAULT_S)
    elif kind == "oom":
        # Stand-in for the kernel OOM killer: same signal, reported as SIGKILL.
        os.kill(os.getpid(), signal.SIGKILL)
