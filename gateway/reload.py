"""A reload (SIGHUP to the supervisor) at the gateway: the model repository, read again.

The supervisor sends RELOAD, then replaces every worker with a generation that loaded the
repository again. The gateway reads the repository off the event loop, and applies what
changed only once a worker of the reloaded generation serves: new models are added,
removed ones answer 404, and a changed config is swapped in when that model's queue is
empty, so one batch never mixes two configs.
"""
from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from ringserve.common.model_config import ModelConfig
from ringserve.common.repository import scan_repository

from .batcher import ModelQueue

if TYPE_CHECKING:
    from .dispatch import Dispatcher

log = logging.getLogger(__name__)


class RepositoryReload:
    """The configs a reload read, until they apply to the Dispatcher's `configs` and `queues`."""

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher
        self.configs: dict[str, ModelConfig] | None = None  # re-read on RELOAD, not yet applied
        self.promoted = False  # a worker of the reloaded generation serves
        self.pending: dict[str, ModelConfig | None] = {}  # applied when the model's queue is idle

    def on_reload(self, repository: str) -> None:
        """Read the repository off the event loop; it applies once a reloaded worker serves."""
        d = self.dispatcher

        def loaded(future: asyncio.Future) -> None:
            try:
                self.configs = d.models.on_repository_read(future.result())
            except Exception as exc:
                log.error("reload: cannot read the model repository %s (%s); keeping the model configs",
                          repository, exc)
                return
            self._apply()

        self.promoted = False
        d.loop.run_in_executor(None, scan_repository, Path(repository)).add_done_callback(loaded)

    def on_reloaded_worker_serves(self) -> None:
        self.promoted = True
        self._apply()

    def _apply(self) -> None:
        if self.configs is None or not self.promoted:
            return
        d = self.dispatcher
        configs, self.configs = self.configs, None
        d.models.apply_pending()
        for name in sorted(d.configs.keys() | configs.keys()):
            if configs.get(name) != d.configs.get(name):
                self.pending[name] = configs.get(name)
                self.swap_if_idle(name)

    def swap_if_idle(self, name: str) -> None:
        """A model's new config takes over between batches, so one batch never mixes two configs."""
        d = self.dispatcher
        queue = d.queues.get(name)
        if queue is not None and (queue.depth or queue.requeued):
            return
        config = self.pending.pop(name)
        if config is None:
            log.info("reload: model %s left the repository", name)
            del d.configs[name]  # its queue stays: requests running now still find it
            return
        log.info("reload: model %s %s", name, "changed" if name in d.configs else "added")
        d.configs[name] = config
        d.queues[name] = ModelQueue(config, d.segment.data_capacity)
