"""Explicit mode's repository loads and unloads at the gateway (`--model-control-mode explicit`).

A load or an unload changes the served repository (common/repository/control.py: one link per model),
then asks the supervisor for a reload (ReloadRepository): as on SIGHUP, every gateway reads the served
repository again and each worker is replaced by a new generation that reads it, while the old one serves
(docs/architecture.md, "Replacing workers without downtime"). Other models answer throughout; the new
generation loads the model before it takes a batch. The call answers once that reload is served, with the
model's outcome: served, or why it is not.

One load or unload at a time per gateway (Triton serializes conflicting ones too): a reload that began
before a change was made would not carry it. One that another gateway began meanwhile may still miss it;
the call then asks once more.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from ringserve.common.repository.control import LoadRequest, ServedRepository
from ringserve.common.supervisor_messages import ReloadRepository
from ringserve.gateway.core.errors import BadRequest, GatewayError, LoadFailed, ModelFailed, ModelNotFound, Unavailable
from ringserve.gateway.core.phrases import say
from ringserve.gateway.dispatch.catalog import Catalog
from ringserve.gateway.dispatch.fleet import Fleet
from ringserve.gateway.dispatch.worker_port import WorkerPort

log = logging.getLogger(__name__)

RELOAD_WAIT_S = 120.0  # a load waits this long for the new worker generation (a worker start and every load)
_POLL_S = 0.05
_ASKS = 2  # reloads a load asks for at most (a second one when another gateway's reload missed it)


class ModelControl:
    """Loads and unloads of explicit mode: the served repository changed, then a reload waited for."""

    def __init__(
        self,
        served: ServedRepository,
        catalog: Catalog,
        fleet: Fleet,
        port: Callable[[], WorkerPort | None],
        check_available: Callable[[str], None],
        gateway_index: int,
    ) -> None:
        self.served, self.catalog, self.fleet = served, catalog, fleet
        self.port, self.check_available = port, check_available
        self.gateway_index = gateway_index
        self._lock: asyncio.Lock | None = None

    async def load(self, name: str, request: LoadRequest, wait_s: float = RELOAD_WAIT_S) -> list[str]:
        """Serve `name` (again) from the repository, or from the load's overrides; the names served by it
        (an ensemble's steps too). LoadFailed with why not."""
        if not request.overrides and not self.served.in_repository(name):
            raise ModelNotFound(name, None, self.served.names(), loading=True)
        async with self._serialized():
            loop = asyncio.get_running_loop()
            loaded = [name]
            try:
                if request.overrides:
                    await loop.run_in_executor(None, self.served.override, name, request)
                else:
                    self.served.link(name)
                    for step in self.served.ensemble_steps(name):  # Triton loads an ensemble's models with it
                        if step not in self.served.names() and self.served.in_repository(step):
                            self.served.link(step)
                            loaded.append(step)
            except OSError as exc:
                raise LoadFailed(name, f"cannot write its folder in the served repository: {exc}") from None
            for _ in range(_ASKS):
                await self._reload(name, wait_s)
                if self._known(name):
                    break
            self._outcome(name)
            return loaded

    async def unload(self, name: str, dependents: bool, wait_s: float = RELOAD_WAIT_S) -> list[str]:
        """Stop serving `name` (and, with `dependents`, the models of an ensemble that no other served
        ensemble needs); the names unloaded. A model not served is no error, as in Triton."""
        async with self._serialized():
            names = [name]
            if dependents:
                steps = self.served.ensemble_steps(name)
                others = {s for n in self.served.names() if n != name for s in self.served.ensemble_steps(n)}
                names += [s for s in dict.fromkeys(steps) if s not in others and s != name]
            unloaded = [n for n in names if self.served.remove(n)]
            if unloaded:
                await self._reload(name, wait_s)
            return unloaded

    def _serialized(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()  # made on the event loop that uses it
        return self._lock

    async def _reload(self, name: str, wait_s: float) -> None:
        """Ask the supervisor for a reload and wait until this gateway serves what it read."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while self.fleet.successors:  # a reload under way may have read the served repository before the change
            await self._sleep_until(deadline, name)
        begun = self.catalog.reloads_begun
        port = self.port()
        if port is None:  # (before the event loop attached the sockets)
            raise Unavailable(f"model {name!r}: this gateway is not connected to the supervisor yet")
        port.tell_supervisor(ReloadRepository(name, self.gateway_index))
        while not (
            self.catalog.reloads_begun > begun
            and not self.fleet.successors
            and (self.catalog.reload_applied or self.fleet.kept_models)
        ):
            await self._sleep_until(deadline, name)

    async def _sleep_until(self, deadline: float, name: str) -> None:
        if asyncio.get_running_loop().time() > deadline:
            raise Unavailable(
                f"model {name!r}: the new worker generation that loads it is not serving yet; "
                "its ready endpoint says when it is"
            )
        await asyncio.sleep(_POLL_S)

    def _known(self, name: str) -> bool:
        """Whether the last reload read `name`: it serves, failed, or awaits a worker's config."""
        c = self.catalog
        return name in c.configs or name in c.failed_configs or name in c.awaiting or name in self.fleet.kept_models

    def _outcome(self, name: str) -> None:
        """LoadFailed with Triton's words unless `name` serves now."""
        c = self.catalog
        why = c.failed_configs.get(name) or self.fleet.kept_models.get(name)
        if why is None and name not in c.configs and name not in c.awaiting:
            why = "the new worker generation did not read it from the served repository"
        if why is None:
            try:
                self.check_available(name)
            except ModelFailed as exc:
                why = str(exc)
            except GatewayError:
                return  # loading lazily, or awaiting a worker's config: it serves once that is done
        if why is not None:
            log.warning("model %s failed to load: %s", name, why)
            raise BadRequest(say("load_failed", model=name, why=why))
        log.info("model %s loaded", name)
