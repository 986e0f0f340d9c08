"""The sequence models' state stores of one gateway (shm/states.py), each opened once, and what the
sequence queues (gateway/batching/sequences.py) call back into the scheduler through them.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
from collections.abc import Callable

from ringserve.common.repository.config import ModelConfig
from ringserve.gateway.core.errors import ModelFailed
from ringserve.shm.errors import ShmError
from ringserve.shm.states import StateStore

log = logging.getLogger(__name__)


class StateStores:
    """This gateway's state stores, one per sequence model version, each opened once (shm/states.py), and
    what the sequence queues call back into the scheduler (set by it: gateway/dispatch/scheduler.py)."""

    def __init__(self, prefix: str) -> None:
        # The supervisor's prefix (Settings.state_store_prefix: it unlinks them all at its stop); a gateway
        # built without one (a test) makes its own, with its pid first for the stale sweep.
        self.prefix = prefix or f"ringserve-{os.getpid()}-{secrets.token_hex(8)}-state-"
        self.opened: dict[str, StateStore] = {}
        self.finish: Callable[..., None] = _not_attached
        self.pump_soon: Callable[[], None] = lambda: None

    def open(self, config: ModelConfig) -> StateStore:
        sequence = config.sequences
        entries = sequence.candidate_slots(config.max_batch_size, config.lifecycle.instance_count)
        state_bytes = tuple(s.max_bytes for s in sequence.states)
        layout = f"{config.name}\0{config.version}\0{config.model_path}\0{entries}\0{state_bytes}"
        name = self.prefix + hashlib.blake2b(layout.encode(), digest_size=8).hexdigest()
        store = self.opened.get(name)
        if store is None:
            try:
                store = StateStore.open(name, entries, state_bytes)
            except (ShmError, OSError) as exc:
                raise ModelFailed(f"model {config.name!r}: its sequences' state store cannot be made: {exc}") from None
            self.opened[name] = store
            log.info(
                "model %s: sequences' state store %s (%d candidate slots, %d bytes)",
                config.key,
                "made" if store.created else "attached",
                entries,
                entries * store.entry_bytes,
            )
        return store

    def close(self) -> None:
        for store in self.opened.values():
            store.close()
        self.opened.clear()


def _not_attached(*args: object, **kwargs: object) -> None:
    raise RuntimeError("the sequence queues answer through the scheduler, which has not attached them")
