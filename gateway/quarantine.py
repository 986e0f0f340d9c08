"""Which models are quarantined, and counting the poison requests that quarantine a model.

Two sources: the supervisor (3 worker deaths while loading a model, MODEL_QUARANTINED) and
the gateway itself (`quarantine_poison_requests` requests isolated as crashing a worker on
their own within `quarantine_window_s`). A repository load lifts both.
"""
from __future__ import annotations

import time


class Quarantine:
    def __init__(self, poison_requests: int, window_s: float) -> None:
        self.poison_requests = poison_requests
        self.window_s = window_s
        self.reasons: dict[str, str] = {}  # model key -> why it is quarantined
        self._poison_times: dict[str, list[float]] = {}

    def count_poison(self, model: str, reason: str | None) -> str | None:
        """One more request of `model` crashed a worker alone; why to quarantine it, or None."""
        now = time.monotonic()
        times = [t for t in self._poison_times.get(model, []) if now - t < self.window_s] + [now]
        self._poison_times[model] = times
        if len(times) < self.poison_requests:
            return None
        return (f"{len(times)} of its requests crashed the worker on their own within {self.window_s:.0f} s "
                f"(last: {reason}); restart the server to retry it")
