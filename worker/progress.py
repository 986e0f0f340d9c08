"""The calls into model code running now, for the supervisor's liveness judgement.

The heartbeat thread beats whatever the model's code does (a Python loop lets it run), so a beat
says only that the process lives. Progress is what the threads that run model code say: each
records a call (load, warmup, execute, finalize) when it starts it, with its model and its bound
(common/repository/call_bounds.py), and drops it when the call returns. Every heartbeat carries
the calls running then (`Heartbeat.calls`), and the supervisor kills a worker whose call is past
its bound (supervision/workers.py: reason `load_timeout`, ...), from the call's start as written
here (CLOCK_MONOTONIC is the machine's), even when the beats stop.

One record per thread and nesting level: a BLS call from `execute` that loads a lazy model records
the load under the execute, and both bounds hold. Plain dict operations: atomic under the GIL.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

from ringserve.common.repository.call_bounds import Hook
from ringserve.common.repository.config import ModelConfig
from ringserve.common.settings import Settings

# Kinds whose execute the server-wide default bounds: their code may loop in Python.
DEFAULT_EXECUTE_KINDS = ("python", "ensemble")


class Progress:
    def __init__(self) -> None:
        self.defaults: dict[Hook, float] = {}  # the flags' bounds (Settings); none until configured
        self._calls: dict[tuple[int, int], tuple[str, str, float, float]] = {}
        self._depth: dict[int, int] = {}

    def configure(self, settings: Settings) -> None:
        self.defaults = {
            "load": settings.load_timeout_s,
            "warmup": settings.warmup_timeout_s,
            "execute": settings.execute_timeout_s,
            "finalize": settings.finalize_timeout_s,
        }

    def bound_s(self, config: ModelConfig, hook: Hook) -> float:
        """The model's own bound on `hook`, else the flag's (for execute: Python models and ensembles only,
        a decoupled model's streams aside: they end when the model says); 0 = unbounded."""
        own = config.call_bounds.get(hook)
        if own is not None:
            return own
        if hook == "execute" and (config.kind not in DEFAULT_EXECUTE_KINDS or config.decoupled):
            return 0.0
        return self.defaults.get(hook, 0.0)

    @contextlib.contextmanager
    def call(self, config: ModelConfig, hook: Hook) -> Iterator[None]:
        """Around one call into `config`'s code in this thread."""
        bound = self.bound_s(config, hook)
        if not bound:
            yield
            return
        thread = threading.get_ident()
        depth = self._depth.get(thread, 0)
        key = (thread, depth)
        self._depth[thread] = depth + 1
        self._calls[key] = (hook, config.key, time.monotonic(), bound)
        try:
            yield
        finally:
            del self._calls[key]
            self._depth[thread] = depth

    def running(self) -> list[tuple[str, str, float, float]]:
        """(hook, model key, started at (monotonic), bound s) of each call running now."""
        return list(self._calls.values())


CALLS = Progress()  # this worker's (one per process)
