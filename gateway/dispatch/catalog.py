"""What the gateway serves: model configs, their versions, one queue per model key, a reload's swaps.

Queues are by model key: 'm' for the default version, 'm/2' for version 2 (ModelConfig.key),
so `/v2/models/m/versions/2/infer` reaches version 2 and no other. `configs` holds the
default versions by name; it is the very dict the HTTP routes look models up in, so a
reload or a repository load that changes it changes what the routes see.

A reload (SIGHUP to the supervisor) reads the repository again. What it read is staged
here and applies only once a worker of the reloaded generation serves (the dispatcher says
when): new models are added, removed ones answer 404, and a changed config is swapped in
when that model's queue is empty, so one batch never mixes two configs.

A version's key can change: removing versions 2 and 3 makes version 1 the default, 'm/1' becomes
'm'. Whatever the gateway files by key from the workers' reports (gateway/dispatch/fleet.py) is filed
again each time (`on_keys_changed`), or a worker that holds version 1 would hold no 'm'.

A Python model's config may be completed by its model.py (auto_complete_config), which only
workers import: until a worker's READY brings it (`adopt`), such a model is `awaiting` (503 with
Retry-After), and the config a worker reports is the one served from then on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from ringserve.common.errors import ConfigError
from ringserve.common.messages import CompletedConfig
from ringserve.common.repository.config import ModelConfig
from ringserve.common.repository.scan import RepositoryScan
from ringserve.gateway.batching.queues import ModelQueue
from ringserve.gateway.batching.sequences import model_queue
from ringserve.gateway.batching.state_stores import StateStores
from ringserve.gateway.core.errors import ModelFailed, ModelVersionNotFound, Unavailable
from ringserve.gateway.core.phrases import say

log = logging.getLogger(__name__)


class Catalog:
    """Configs by name and version, queues by model key, and a reload's configs until they apply."""

    def __init__(
        self, configs: dict[str, ModelConfig], slot_capacity_bytes: int, stores: StateStores | None = None
    ) -> None:
        self.configs = configs  # default versions by name (shared with the routes)
        self.slot_capacity_bytes = slot_capacity_bytes
        # Sequence models' queues and state (gateway/batching/sequences.py); a test may leave it out.
        self.stores = stores if stores is not None else StateStores("")
        self.queues = {name: self.new_queue(cfg) for name, cfg in configs.items()}
        self.others: dict[str, dict[int, ModelConfig]] = {}  # model -> its non-default served versions
        self.failed_configs: dict[str, str] = {}  # model key -> why its config could not be built
        self.awaiting: dict[str, str] = {}  # model key -> why: a config only a worker completes (model.py)
        self.pending: dict[str, ModelConfig | None] = {}  # a reload's changes, applied when the queue is idle
        self._staged: RepositoryScan | None = None  # a reload's repository, until a reloaded worker serves
        self._reloaded_worker_serves = False
        self.reloads_begun = 0  # reloads this gateway has heard of (explicit mode's loads wait for theirs)
        self.on_keys_changed: Callable[[], None] | None = None  # the fleet files its reports again

    # -- versions --------------------------------------------------------------------------------
    def add_repository(self, scan: RepositoryScan) -> None:
        """Serve every non-default version of `scan` (the default ones are in `configs`)."""
        self.failed_configs = dict(scan.failed)
        self.awaiting = {key: why for key, why in scan.awaiting.items() if key not in self.queues}
        self.others = {}
        for config in scan.all_versions():
            if config.default_version:
                continue
            self.others.setdefault(config.name, {})[config.version] = config
            queue = self.queues.get(config.key)
            if queue is None or (queue.config != config and not busy(queue)):
                self.queues[config.key] = self.new_queue(config)
        self._keys_changed()

    def served_versions(self, name: str) -> list[ModelConfig]:
        default = self.configs.get(name)
        versions = dict(self.others.get(name, {}))
        if default is not None:
            versions[default.version] = default
        return [versions[v] for v in sorted(versions)]

    def version(self, default: ModelConfig, version: str) -> ModelConfig:
        """The config of `version` of the model whose default version is `default` (routes)."""
        found = self.others.get(default.name, {}).get(int(version)) if version.isdigit() else None
        if found is not None:
            return found
        why = self.failed_configs.get(f"{default.name}/{version}")
        if why is not None:
            raise ModelFailed(
                say(
                    "version_not_ready",
                    f"model {default.name!r} version {version} cannot be served: {why}",
                    model=default.name,
                    version=version,
                )
            )
        if f"{default.name}/{version}" in self.awaiting:
            raise Unavailable(
                f"model {default.name!r} version {version} is not served yet: "
                f"{self.awaiting[f'{default.name}/{version}']}"
            )
        served = ", ".join(str(c.version) for c in self.served_versions(default.name))
        raise ModelVersionNotFound(default.name, version, served)

    def check_failed(self, name: str) -> None:
        """503 with the reason for a model whose config could not be built (else it is a 404)."""
        why = self.failed_configs.get(name)
        if why is not None:
            raise ModelFailed(say("no_available_versions", f"model {name!r} cannot be served: {why}", model=name))
        if name in self.awaiting:
            raise Unavailable(f"model {name!r} is not served yet: {self.awaiting[name]}")

    def key_of(self, model: str, version: int) -> str | None:
        default = self.configs.get(model)
        if default is not None and default.version == version:
            return model
        found = self.others.get(model, {}).get(version)
        return None if found is None else found.key

    def key_for(self, model: str, version: int) -> str:
        """The key a worker's report on (model, version) is filed under: the served version's, else the
        non-default form ('m/4', a version a reload adds before it applies here), never the bare name,
        which is the default version's and may be another one's here."""
        return self.key_of(model, version) or f"{model}/{version}"

    def new_queue(self, config: ModelConfig) -> ModelQueue:
        return model_queue(config, self.slot_capacity_bytes, self.stores)

    def config_of(self, key: str) -> ModelConfig | None:
        queue = self.queues.get(key)
        return None if queue is None else queue.config

    def replace(self, name: str, config: ModelConfig) -> None:
        """Serve `config` as the default version of `name` from now on (its queue must be idle)."""
        self.configs[name] = config
        self.queues[name] = self.new_queue(config)
        self._keys_changed()

    def _keys_changed(self) -> None:
        if self.on_keys_changed is not None:
            self.on_keys_changed()

    def add_fixed(self, config: ModelConfig) -> None:
        """Serve `config`, the default version of a model whose config could not be built before."""
        self.failed_configs.pop(config.name, None)
        self.replace(config.name, config)

    def adopt(self, completed: tuple[CompletedConfig, ...]) -> None:
        """A worker's READY: its Python models' configs as it read them (completed by model.py).
        A model awaiting its config serves from now on; a served one whose config differs takes
        the worker's when its queue is idle (as a reload's change does)."""
        for report in completed:
            name = report.key.split("/")[0]
            try:
                config = ModelConfig.from_json(
                    name,
                    report.config,
                    version=report.version,
                    model_path=report.model_path,
                    default_version=report.key == name,
                )
            except ConfigError as exc:
                log.error("model %s: the config a worker completed cannot be served: %s", report.key, exc)
                continue
            waited = self.awaiting.pop(report.key, None) is not None
            if not config.default_version:
                if self.others.get(name, {}).get(config.version) != config:
                    self.others.setdefault(name, {})[config.version] = config
                    queue = self.queues.get(config.key)
                    if queue is None or not busy(queue):
                        self.queues[config.key] = self.new_queue(config)
            elif name not in self.configs:
                self.replace(name, config)
            elif self.configs[name] != config:
                self.pending[name] = config
                self.swap_if_idle(name)
            else:
                continue
            log.info(
                "model %s: serving the config a worker %s (max_batch_size %d)",
                report.key,
                "completed" if waited else "read",
                config.max_batch_size,
            )

    # -- a reload --------------------------------------------------------------------------------
    def stage(self, scan: RepositoryScan) -> None:
        """A reload read the repository; it applies once a worker of the reloaded generation serves."""
        self._staged = scan
        self._apply_staged()

    def expect_reloaded_worker(self) -> None:
        """A reload began: what it reads waits for a worker of the new generation."""
        self._reloaded_worker_serves = False
        self.reloads_begun += 1

    @property
    def reload_applied(self) -> bool:
        """The last reload's repository is served: a worker of its generation serves and its scan applied."""
        return self._reloaded_worker_serves and self._staged is None

    def reloaded_worker_serves(self) -> None:
        self._reloaded_worker_serves = True
        self._apply_staged()

    def _apply_staged(self) -> None:
        if self._staged is None or not self._reloaded_worker_serves:
            return
        scan, self._staged = self._staged, None
        self.add_repository(scan)
        configs = scan.defaults()
        for name in sorted(self.configs.keys() | configs.keys()):
            if name in scan.awaiting and name in self.configs:
                continue  # a Python model's config that only the reloaded workers complete: their READY brings it
            if name in scan.failed and name in self.configs:
                log.error(
                    "reload: model %s keeps its config: the repository's cannot be built (%s)", name, scan.failed[name]
                )
                continue
            if configs.get(name) != self.configs.get(name):
                self.pending[name] = configs.get(name)
                self.swap_if_idle(name)

    def swap_if_idle(self, name: str) -> None:
        """A model's new config takes over between batches, so one batch never mixes two configs."""
        queue = self.queues.get(name)
        if queue is not None and busy(queue):
            return
        config = self.pending.pop(name)
        if config is None:
            log.info("reload: model %s left the repository", name)
            del self.configs[name]  # its queue stays: requests running now still find it
            self._keys_changed()
            return
        log.info("reload: model %s %s", name, "changed" if name in self.configs else "added")
        self.replace(name, config)


def busy(queue: ModelQueue) -> bool:
    """Requests wait in it, or batches to send again."""
    return bool(queue.depth or queue.requeued)
