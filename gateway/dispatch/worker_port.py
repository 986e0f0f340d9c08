"""What the scheduler needs from the sockets: the gateway↔worker boundary as a typing.Protocol.

gateway/dispatch/link.py implements it over ZeroMQ; unit tests pass a fake that records the messages.
Sends never block the event loop and never raise: a worker that cannot be reached answers False.
"""

from __future__ import annotations

from typing import Protocol, Union

from ringserve.common.messages import Attach, Batch, Cancel, Load, Unload
from ringserve.common.runtime_settings import ChangeRuntimeSettings, RuntimeSettings
from ringserve.common.supervisor_messages import (
    KillWorker,
    QuarantineModel,
    ReloadRepository,
    ReloadWorkers,
    Unquarantine,
    WorkerRetired,
)

LoaderMessage = Union[Load, Unload, RuntimeSettings]
WorkerMessage = Attach  # to a worker's batch loop, besides BATCH
SupervisorMessage = Union[
    KillWorker, WorkerRetired, QuarantineModel, Unquarantine, ReloadWorkers, ReloadRepository, ChangeRuntimeSettings
]


class WorkerPort(Protocol):
    def send_batch(self, index: int, generation: int, batch: Batch) -> bool:
        """To the batch loop of worker (index, generation); False when its socket is gone."""

    def send_to_worker(self, index: int, generation: int, message: WorkerMessage) -> bool:
        """ATTACH to the batch loop of worker (index, generation), on the pipe its BATCHes take (so it
        comes first); False when its socket is gone."""

    def send_to_loader(self, index: int, generation: int, message: LoaderMessage) -> bool:
        """To the model loader thread of worker (index, generation); False when it is not connected (yet)."""

    def send_to_courier(self, index: int, generation: int, message: Cancel) -> bool:
        """CANCEL to the courier thread of worker (index, generation) (worker/python/decoupled.py); False when it
        is not connected."""

    def tell_supervisor(self, message: SupervisorMessage) -> None:
        """A control message to the supervisor; logged, not raised, when it cannot go."""
