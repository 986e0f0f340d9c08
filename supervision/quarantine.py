"""The models the server will not serve, and why: the supervisor's side of the quarantine.

Two kinds, one table each. A model that crashed the workers while loading (`loading`) is
skipped by every new worker (--skip-model). A model whose requests a gateway isolated as
poison (`poisoned`) is still loaded, but every gateway answers it 503. A repository load
lifts either. Run in the supervisor process only; every change is told to every gateway.
"""

from __future__ import annotations

import logging
import os
import time

from ringserve.common import supervisor_messages
from ringserve.common.settings import Settings

from .events import GatewayEvents

log = logging.getLogger(__name__)

QUARANTINE_CRASHES = 3  # a model that kills the worker this often while loading...
QUARANTINE_WINDOW_S = 60.0  # ...within this window is quarantined


class Quarantine:
    """Both tables, the crashes and poison requests counted towards them, and lifting them."""

    def __init__(self, settings: Settings, events: GatewayEvents) -> None:
        self.settings = settings
        self.events = events
        self.loading: dict[str, str] = {}  # model -> why (crashed workers while loading: they skip it)
        self.poisoned: dict[str, str] = {}  # model -> why (a gateway isolated poison requests: 503 in every gateway)
        self._load_crashes: dict[str, list[float]] = {}
        self._poison_times: dict[str, list[float]] = {}  # model -> when gateways isolated its poison requests

    def everything(self) -> dict[str, str]:
        """Every quarantined model and why, as the Snapshot carries it."""
        return {**self.poisoned, **self.loading}

    def blame_loading_model(
        self, runtime_dir: str, index: int, generation: int, reason: str, bound_s: float = 0.0
    ) -> str | None:
        """A worker that died while loading a model: count it against that model; returns its key.

        `bound_s`: it was killed for a load (or warm-up) past this bound. Such deaths come at least that
        far apart, so the window grows by it for each: three hangs in a row quarantine the model, as
        three crashes do, whatever its bound."""
        marker = os.path.join(runtime_dir, f"loading-w{index}.g{generation}")
        try:
            with open(marker) as f:
                model = f.read().strip()
            os.unlink(marker)
        except OSError:
            return None
        now = time.monotonic()
        window_s = QUARANTINE_WINDOW_S + QUARANTINE_CRASHES * bound_s
        crashes = [t for t in self._load_crashes.get(model, []) if now - t < window_s] + [now]
        self._load_crashes[model] = crashes
        log.error("worker %d died (%s) while loading model %s", index, reason, model)
        if len(crashes) >= QUARANTINE_CRASHES and model not in self.loading:
            why = (
                f"it crashed the worker {len(crashes)} times within {window_s:.0f} s while "
                f"loading (last: {reason}); restart the server or load it again to retry"
            )
            self.loading[model] = why
            log.error("model %s quarantined: %s", model, why)
            self.events.send(supervisor_messages.ModelQuarantined(model=model, reason=why))
        return model

    def count_poison_request(self, model: str, how: str, request_id: str | None, *, stopping: bool) -> None:
        """A gateway isolated a request of `model` that crashed the worker on its own: so many within the
        window, through whichever gateways, quarantine it (as they did with one gateway)."""
        now = time.monotonic()
        window = self.settings.quarantine_window_s
        times = [t for t in self._poison_times.get(model, []) if now - t < window] + [now]
        self._poison_times[model] = times
        log.info(
            "model %s: a gateway isolated a poison request (%s; %d within %.0f s)",
            model,
            how,
            len(times),
            window,
            extra={"request_id": request_id},
        )
        if len(times) >= self.settings.quarantine_poison_requests:
            which = f", request id {request_id}" if request_id else ""
            self.quarantine_poisoned(
                model,
                f"{len(times)} of its requests crashed the worker on their own within "
                f"{window:.0f} s (last: {how}{which}); restart the server or load it "
                "again to retry it",
                stopping=stopping,
            )

    def quarantine_poisoned(self, model: str, why: str, *, stopping: bool) -> None:
        """A gateway isolated enough poison requests of `model`: every gateway answers it 503 from now on.

        The meaning of the gateway's own quarantine, made server-wide: the workers still load
        the model (it crashed them at inference, not at load), a repository load lifts it, and
        a restarted gateway learns it from the next Snapshot.
        """
        if stopping or model in self.poisoned or model in self.loading:
            return
        self.poisoned[model] = why
        log.error("model %s quarantined in every gateway: %s", model, why)
        self.events.send(supervisor_messages.ModelQuarantined(model=model, reason=why))

    def lift(self, model: str) -> bool:
        """A repository load of a quarantined model: forget its crashes. True: new workers must load it again.

        The serving workers were started with --skip-model for a model that crashed them while
        loading, so the caller replaces each without downtime (as on SIGHUP) by one that loads it
        again; if it crashes while loading again, three times within the window, it is quarantined
        again. A poison quarantine (crashes at inference) only ends: the workers hold the model.
        """
        poisoned = self.poisoned.pop(model, None) is not None
        self._poison_times.pop(model, None)
        if self.loading.pop(model, None) is None:
            if poisoned:
                log.warning("model %s: quarantine lifted by a repository load", model)
                self.events.send(supervisor_messages.ModelUnquarantined(model=model))
            return False
        self._load_crashes.pop(model, None)
        log.warning("model %s: quarantine lifted by a repository load; new workers will load it again", model)
        self.events.send(supervisor_messages.ModelUnquarantined(model=model))
        return True
