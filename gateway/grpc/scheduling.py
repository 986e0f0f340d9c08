"""gRPC's helper threads give way to the gateway's event-loop thread: they run under SCHED_BATCH.

The loop thread does the gateway's work. Beside it, with gRPC on, grpcio's event-engine threads
(they read and write the connections) and the poller (gateway/grpc/core.py: it takes the core's
completions and hands them to the loop) mostly wake, hand something over and sleep. Under the
default policy a thread that wakes preempts the running one, and on two vCPUs that was the loop
thread, about once per gRPC request (0.94 involuntary switches a request at 64 clients, against 0.15
over HTTP); the woken thread then usually wanted the GIL the loop thread held, and waited for it. A
SCHED_BATCH thread does not preempt on waking (sched(7)): it runs on an idle CPU at once, else when
the running thread waits or its slice ends; same nice value, same share of the CPU. Measured with
perf_analyzer at 64 clients, the two revisions served side by side, alternating rounds: gRPC unary
+11 % infer/s (gateway CPU 186 against 210 µs a request), streaming +8 % (136 against 150 µs),
1 client unchanged (docs/performance.md, `protocols`). ZeroMQ's I/O thread, the one helper HTTP has,
keeps the default policy: under SCHED_BATCH HTTP gained nothing at 64 clients and read 2 % lower at 1.

Linux threads take their policy from the thread that creates them: grpcio's start with its first
server (grpc_init) and the poller with the server's start, both inside `helper_threads()`, after
which the calling thread, the loop's, has its own policy back. Where the policy cannot be set (not
Linux, a sandbox that refuses it) or the gateway runs under another one than the default (systemd's
CPUSchedulingPolicy=, chrt), nothing is changed.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator

log = logging.getLogger(__name__)

# (default, batch): Linux's; None where os has no SCHED_BATCH
_POLICIES: tuple[int, int] | None = (os.SCHED_OTHER, os.SCHED_BATCH) if hasattr(os, "SCHED_BATCH") else None


@contextlib.contextmanager
def helper_threads() -> Iterator[None]:
    """Threads started inside the block run under SCHED_BATCH; the calling thread keeps its policy."""
    switched = _to_batch()
    try:
        yield
    finally:
        if switched is not None:
            os.sched_setscheduler(0, switched, os.sched_param(0))


def _to_batch() -> int | None:
    """This thread (0) to SCHED_BATCH, if it runs under the default policy; the policy to go back to, or None."""
    if _POLICIES is None:
        return None
    default, batch = _POLICIES
    try:
        if os.sched_getscheduler(0) != default:
            return None
        os.sched_setscheduler(0, batch, os.sched_param(0))
    except OSError as exc:  # (a sandbox that refuses it: the threads run under the default policy)
        log.info("helper threads keep the default scheduling policy: %s", exc)
        return None
    return default
