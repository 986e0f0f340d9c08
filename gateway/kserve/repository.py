"""Triton's model repository extension at the gateway: index, load, unload.

What this can do while workers load their models only at start (or on a SIGHUP reload):
- unload: the model answers 503 / not ready; requests already accepted still finish.
- load: re-reads `<repo>/<model>/config.json` into the gateway's config (batching
  settings take effect between batches), lifts an unload and a gateway quarantine.
  A version, tensor or file change on disk needs the workers to load the new weights:
  that is refused with a pointer to the SIGHUP reload.
  A model whose config failed at start-up and reads well now is served by new workers
  (gateway/dispatch/model_states.py's serve_fixed).
- index: every model in the repository with READY or UNAVAILABLE and why.

Triton's model control modes (--model-control-mode; common/repository/control.py): in explicit mode a load
or an unload changes the served repository and reloads the workers without downtime
(gateway/dispatch/model_control.py), and takes Triton's `config` override and `file:` contents; none and poll
refuse both in Triton's words. Without the flag, what is written above.

With several gateways, the one that took a load or unload tells the others (RepositoryChanged,
relayed by the supervisor), and each applies it to its own view (`follow`): the server answers
alike whichever gateway a client reaches. The workers are told once, by the gateway that took it.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from pathlib import Path
from typing import Any

from ringserve.common.errors import ConfigError
from ringserve.common.repository.config import ModelConfig
from ringserve.common.repository.control import LoadParameterError, ServedRepository, parse_load_parameters
from ringserve.common.repository.scan import AwaitingWorkerConfig, load_model
from ringserve.common.settings import SERVED_REPOSITORY_DIR
from ringserve.common.supervisor_messages import RepositoryChanged
from ringserve.common.vocabulary import RepositoryAction
from ringserve.gateway.core.errors import (
    BadRequest,
    GatewayError,
    LoadFailed,
    ModelControlDisabled,
    ModelNotFound,
    echo,
)
from ringserve.gateway.core.phrases import say
from ringserve.gateway.dispatch.dispatcher import Dispatcher
from ringserve.gateway.dispatch.model_control import ModelControl

log = logging.getLogger(__name__)

MODEL_VERSION = re.compile(r"[0-9]{1,19}")  # Triton's versions are int64
LOAD_WAIT_S = 10.0  # a load waits this long for the model's queue to empty before swapping its config
LOAD_OUTCOME_WAIT_S = 30.0  # a load that asked workers to load waits this long for their outcome
FIXED_LOAD_WAIT_S = 50.0  # a load of a model that failed at start-up waits this long for new workers
_IDLE_POLL_S = 0.01
UNLOADED_WHY = "unloaded through the repository API; load it to serve it again"


def check_model_name(name: str) -> None:
    """400 for a name that is empty or would leave the repository, before any lookup on disk.

    Triton's rule (core's ValidateModelName): the name, trimmed of white space, must not be empty,
    '..' or contain '/'; every other name is a name ('..my_model', '...', 'model..1', spaces and
    all), found or not. Beyond Triton: '.' (the repository itself) and NUL, which no file name holds.
    """
    trimmed = name.strip()
    if not trimmed:
        raise BadRequest(say("model_name_empty", "a model name is the name of its directory in the repository"))
    if trimmed in (".", "..") or "/" in trimmed or "\0" in name:
        raise BadRequest(
            say(
                "model_name_traversal",
                "a model name is one directory name: not '.' or '..', without '/' or NUL",
                model=echo(name, quoted=False),
            )
        )


def check_version(version: str) -> None:
    """400 for a version that is no number (or one past int64, whose int() Python may refuse), before any lookup."""
    if not MODEL_VERSION.fullmatch(version):
        raise BadRequest(f"model version {echo(version)} is not valid: versions are whole numbers of at most 19 digits")


def served_the_same(old: ModelConfig, new: ModelConfig) -> str | None:
    """Why workers that loaded `old` cannot serve `new` (None when they can)."""
    for what, a, b in (
        ("version", old.version, new.version),
        ("model file", old.model_path, new.model_path),
        ("inputs", old.inputs, new.inputs),
        ("outputs", old.outputs, new.outputs),
        ("max_batch_size", old.max_batch_size, new.max_batch_size),
    ):
        if a != b:
            return f"its {what} changed on disk ({a} -> {b})"
    return None


class Repository:
    def __init__(self, repo: str, configs: dict[str, ModelConfig], dispatcher: Dispatcher) -> None:
        self.repo = Path(repo) if repo else None
        self.configs = configs  # the dispatcher's dict: one view of what is served
        self.dispatcher = dispatcher
        self.unloaded: dict[str, str] = {}  # model -> why
        self.mode = ""  # Triton's model control mode ("": ringserve's own)
        self.control: ModelControl | None = None  # explicit mode's loads and unloads
        if dispatcher is not None:  # (None: the routes without a server, for the OpenAPI document and unit tests)
            dispatcher.on_repository_changed = self.follow
            self.mode = getattr(getattr(dispatcher, "settings", None), "model_control_mode", "")
        if self.mode == "explicit" and self.repo is not None:
            served = ServedRepository(Path(dispatcher.runtime_dir) / SERVED_REPOSITORY_DIR, self.repo)
            d = dispatcher
            self.control = ModelControl(
                served, d.catalog, d.fleet, lambda: d.scheduler.port, d.check_available, d.settings.gateway
            )

    def state(self, name: str) -> tuple[str, str]:
        """(READY | UNAVAILABLE, reason) of a served model."""
        d = self.dispatcher
        if name in self.unloaded:
            return "UNAVAILABLE", self.unloaded[name]
        try:
            d.check_available(name)
        except GatewayError as exc:
            return "UNAVAILABLE", str(exc)
        return "READY", ""

    def index(self, ready_only: bool) -> list[dict[str, Any]]:
        entries = []
        models = getattr(
            self.dispatcher, "models", None
        )  # gateway/dispatch/model_states.py: per version, from the workers
        for name in sorted(set(self.configs) | set(self._on_disk())):
            versions = models.index_entries(name, self.unloaded.get(name)) if models is not None else None
            if versions is not None:
                entries += [e for e in versions if e["state"] == "READY" or not ready_only]
                continue
            config = self.configs.get(name)
            if config is None:
                state, reason = "UNAVAILABLE", self._not_loaded_why(name)
            else:
                state, reason = self.state(name)
            if ready_only and state != "READY":
                continue
            entry = {"name": name, "state": state, "reason": reason}
            if config is not None:
                entry["version"] = str(config.version)
            entries.append(entry)
        return entries

    def _on_disk(self) -> list[str]:
        if self.repo is None or not self.repo.is_dir():
            return []
        return [
            p.name
            for p in self.repo.iterdir()
            if p.is_dir()
            and (
                (p / "config.json").is_file()
                or (p / "config.pbtxt").is_file()
                or any(d.name.isdigit() for d in p.iterdir() if d.is_dir())
            )
        ]

    def _not_loaded_why(self, name: str) -> str:
        if self.mode == "explicit":
            return "unloaded" if name in self.unloaded else "not loaded: load it through the repository API"
        return "added to the repository after the server started; restart or reload (SIGHUP) to serve it"

    async def unload_request(self, name: str, params: dict[str, Any]) -> None:
        """An unload as the front ends take it: refused in none and poll modes, explicit mode's (with Triton's
        `unload_dependents`), or ringserve's own."""
        if self.mode in ("none", "poll"):
            raise ModelControlDisabled(self.mode)
        if self.control is None:
            self.unload(name)
            return
        dependents = params.get("unload_dependents", False)
        if type(dependents) is not bool:
            raise BadRequest(f"'unload_dependents' must be true or false, got {echo(dependents)}")
        if name in self.configs:  # new requests get 503 at once; the reload then removes it (404)
            self.unloaded[name] = "unloaded"
            self._tell_others(name, "unload")
        for unloaded in await self.control.unload(name, dependents):
            self.unloaded[unloaded] = "unloaded"

    async def _load_controlled(self, name: str, params: dict[str, Any]) -> None:
        """Explicit mode's load: Triton's `config` and `file:` parameters; the served repository changes."""
        if self.mode in ("none", "poll"):
            raise ModelControlDisabled(self.mode)
        assert self.control is not None
        check_model_name(name)
        try:
            request = parse_load_parameters(params)
        except LoadParameterError as exc:
            raise BadRequest(str(exc)) from None
        for loaded in await self.control.load(name, request):
            self.unloaded.pop(loaded, None)
            self._tell_others(loaded, "load")

    def unload(self, name: str) -> None:
        if name not in self.configs:  # no name check, as Triton's unload: any name is just not served
            raise ModelNotFound(name, None, sorted(self.configs))
        self.unloaded[name] = UNLOADED_WHY
        log.info("model %s unloaded at the gateway", name)
        if getattr(self.dispatcher, "models", None) is not None:
            self.dispatcher.models.unload(name)  # the workers free its memory once it is idle
        self._tell_others(name, "unload")

    async def load(self, name: str, params: dict[str, Any]) -> None:
        if self.mode:
            await self._load_controlled(name, params)
            return
        failed_at_start = name not in self.configs and name in self.dispatcher.catalog.failed_configs
        old = None if failed_at_start else self._served(name)
        if params.get("config") is not None or any(k.startswith("file:") for k in params):
            raise LoadFailed(
                name,
                "a config or files in the load request are not supported; edit "
                f"{name}/config.json (or config.pbtxt) in the repository and load again",
            )
        if self.repo is None:
            raise LoadFailed(name, "this gateway was started without its repository path")
        try:
            new = await asyncio.get_running_loop().run_in_executor(None, load_model, self.repo, name)
        except AwaitingWorkerConfig as exc:  # a model.py completes it: the config in force is a worker's
            if old is None:
                raise LoadFailed(name, str(exc)) from None
            new = old
        except ConfigError as exc:
            raise LoadFailed(name, str(exc)) from None
        except OSError as exc:
            raise LoadFailed(name, f"cannot read it from {self.repo}: {exc}") from None
        if old is None:  # its config reads well now: new workers load it (gateway/dispatch/model_states.py)
            await self.dispatcher.models.serve_fixed(new, FIXED_LOAD_WAIT_S)
            self.unloaded.pop(name, None)
            log.info("model %s loaded: its config failed at start-up and reads well now", name)
            self._tell_others(name, "load")
            return
        why = served_the_same(old, new)
        if why is not None:
            raise LoadFailed(
                name,
                f"{why}; the workers still run the old one and load weights only at start or "
                "on a reload: send SIGHUP to the ringserve supervisor to roll it in",
            )
        if new != old:
            await self._swap_when_idle(name, new)
        self.unloaded.pop(name, None)
        models = getattr(self.dispatcher, "models", None)
        # The workers retry a failed load, and load eager versions again.
        asked = [] if models is None else models.load(name)
        lifted_at = time.monotonic()
        lifted = self.dispatcher.lift_quarantine(name)
        if lifted:  # the supervisor's too: its workers load the model again
            log.warning("model %s: quarantine lifted by a repository load", name)
        log.info("model %s loaded at the gateway (version %d)", name, new.version)
        self._tell_others(name, "load")
        if models is not None and asked:  # as Triton's: the answer is the load's outcome (initialize may fail it)
            why = await models.load_outcome(asked, LOAD_OUTCOME_WAIT_S)
            if why is not None:
                raise LoadFailed(name, why)
        elif models is not None and lifted:  # the answer is whether the workers that load it again do
            why = await models.lift_outcome(new, lifted_at, LOAD_OUTCOME_WAIT_S)
            if why is not None:
                raise LoadFailed(name, why)

    def _tell_others(self, name: str, action: RepositoryAction) -> None:
        scheduler = getattr(self.dispatcher, "scheduler", None)
        if scheduler is not None:
            scheduler.port.tell_supervisor(RepositoryChanged(name, action, scheduler.settings.gateway))

    def follow(self, change: RepositoryChanged) -> None:
        """Another gateway's load or unload, applied here (without telling the workers again)."""
        if change.action == "unload":
            if change.model in self.configs:
                self.unloaded[change.model] = UNLOADED_WHY
                log.info("model %s unloaded through gateway %d", change.model, change.gateway_index)
        elif change.action == "load" and self.mode == "explicit":
            self.unloaded.pop(change.model, None)  # the reload that gateway asked for brings the model here too
        elif change.action == "load":
            asyncio.get_running_loop().create_task(self._follow_load(change.model, change.gateway_index))

    async def _follow_load(self, name: str, gateway: int) -> None:
        """Read the config as the other gateway did; serve it as it does now."""
        if self.repo is None:
            return
        try:
            new = await asyncio.get_running_loop().run_in_executor(None, load_model, self.repo, name)
        except AwaitingWorkerConfig:  # a model.py completes it: the workers' READY brings it here too
            self.unloaded.pop(name, None)
            return
        except (ConfigError, OSError) as exc:  # it read well there a moment ago
            log.warning("model %s, loaded through gateway %d, cannot be read here: %s", name, gateway, exc)
            return
        old = self.configs.get(name)
        try:
            if old is None:
                if name in self.dispatcher.catalog.failed_configs:
                    self.dispatcher.catalog.add_fixed(new)  # the new workers that gateway asked for serve it
            elif served_the_same(old, new) is None and new != old:
                await self._swap_when_idle(name, new)
        except GatewayError as exc:
            log.warning("model %s, loaded through gateway %d, keeps its old config here: %s", name, gateway, exc)
        self.unloaded.pop(name, None)
        log.info("model %s loaded through gateway %d", name, gateway)

    def _served(self, name: str) -> ModelConfig:
        config = self.configs.get(name)
        if config is None:
            check_model_name(name)
            if name in self._on_disk():
                raise LoadFailed(
                    name,
                    "it was added to the repository after the server started; the workers "
                    "load new models only at start or on a reload (SIGHUP to the supervisor)",
                )
            raise ModelNotFound(name, None, sorted(self.configs), loading=True)
        return config

    async def _swap_when_idle(self, name: str, config: ModelConfig) -> None:
        """Swap between batches, as the dispatcher's reload does: one batch never mixes two configs."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + LOAD_WAIT_S
        queue = self.dispatcher.queues.get(name)
        while queue is not None and (queue.depth or queue.requeued):
            if loop.time() > deadline:
                raise LoadFailed(name, f"its queue did not empty within {LOAD_WAIT_S:g} s; retry the load")
            await asyncio.sleep(_IDLE_POLL_S)
            queue = self.dispatcher.queues.get(name)
        self.dispatcher.catalog.replace(name, config)
