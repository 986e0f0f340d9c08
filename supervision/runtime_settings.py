"""The supervisor's side of the runtime log and trace settings (common/runtime_settings.py): it holds the one
state, takes each gateway's change, applies it to itself, saves it for the processes that start later and
tells every gateway (which tells the workers)."""

from __future__ import annotations

import logging
import os

from ringserve.common import runtime_settings
from ringserve.common.runtime_settings import ChangeRuntimeSettings

from .events import GatewayEvents

log = logging.getLogger(__name__)


class RuntimeSettingsKeeper:
    def __init__(self, runtime_dir: str, events: GatewayEvents) -> None:
        self.runtime_dir, self.events = runtime_dir, events
        # A given --runtime-dir may hold an earlier run's changes: this run starts from its flags.
        try:
            os.unlink(os.path.join(runtime_dir, runtime_settings.SAVED_FILE))
        except FileNotFoundError:
            pass

    def change(self, change: ChangeRuntimeSettings) -> None:
        try:
            state = runtime_settings.current.merged(change)
        except (TypeError, ValueError) as exc:  # (the gateway checked it: a bug, never a reason to stop serving)
            log.error("ignoring a runtime settings change from gateway %d: %s", change.gateway_index, exc)
            return
        runtime_settings.adopt(state.message())
        try:
            runtime_settings.save(self.runtime_dir, state)  # before the gateways hear: a worker they start reads it
        except OSError as exc:
            log.error("cannot save the runtime settings (a process started later keeps its flags'): %s", exc)
        self.events.send(state.message(change.token))
