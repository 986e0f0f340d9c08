"""Native failures on demand, for chaos tests only.

Inert unless the worker runs with RINGSERVE_FAULT_INJECTION=1: then a request with
parameter `ringserve_fault` makes the worker fail natively while running its batch.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import time
from typing import TYPE_CHECKING

from ringserve.common.logfmt import batch_fields

FAULT_KINDS = ("segv", "abort", "exit", "hang", "oom", "slow")
ENABLED = os.environ.get("RINGSERVE_FAULT_INJECTION") == "1"
# Exit status of the `exit` fault, distinct from every status the worker uses itself.
FAULT_EXIT_CODE = 17
# The `slow` fault: a load or a batch that takes this long, GIL released (heartbeats go on).
SLOW_FAULT_S = 2.0


if TYPE_CHECKING:
    from ringserve.common.messages import Batch
    from ringserve.common.repository.config import ModelConfig

log = logging.getLogger(__name__)

LOAD_FAULT_PARAMETER = "ringserve_fault_on_load"


def trigger_on_load(config: ModelConfig) -> None:
    """A model whose config has parameters.ringserve_fault_on_load fails natively while loading."""
    if ENABLED:
        parameter = dict(config.extra.get("parameters", {})).get(LOAD_FAULT_PARAMETER)
        if parameter:
            trigger(parameter.get("string_value", ""))


def trigger_for_batch(batch: Batch) -> None:
    """The faults a batch's requests asked for, each announced first: a crash leaves no line of its own,
    and this one names the batch and its requests' ids."""
    for kind in batch.faults or ():
        if ENABLED:
            log.warning(
                "batch %d of model %s: injecting fault %r",
                batch.batch_id,
                batch.model,
                kind,
                extra=batch_fields(batch.batch_id, batch.request_ids),
            )
        trigger(kind)


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
