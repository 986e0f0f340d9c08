"""The messages to and from the supervisor: heartbeats, a spare's take-over, its events and its control.

    worker  -> supervisor  Heartbeat                           (PUSH -> PULL heartbeat.sock)
    spare   -> supervisor  SpareHeartbeat                      (PUSH -> PULL heartbeat.sock)
    supervisor -> spare    TakeOver                            (one line on the spare's stdin)
    supervisor -> gateway  WorkerStarted, WorkerExited, WorkerSilent, ModelQuarantined,
                           ModelUnquarantined, Snapshot, Reload (PUSH -> PULL events-<k>.sock)
    gateway -> supervisor  KillWorker, WorkerRetired, QuarantineModel, Unquarantine,
                           ReloadWorkers, ReloadRepository,
                           RepositoryChanged                   (PUSH -> PULL control.sock)

Each derives from common/messages.py's `Message`, which says how every kind is written and read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from ringserve.common.messages import Message
from ringserve.common.vocabulary import KillReason, ReplaceReason, RepositoryAction, SpareState


# -- worker -> supervisor -------------------------------------------------------------------
@dataclass(frozen=True)
class Heartbeat(Message):
    KIND: ClassVar[str] = "HEARTBEAT"
    worker_index: int
    generation: int
    pid: int
    batches: int = 0  # batches done so far (for --max-batches-per-worker)
    ready: bool = False  # it has loaded its eager models and said READY (its device's next spare may start)
    # The calls into model code running now (worker/progress.py): [hook, model key, started at
    # (CLOCK_MONOTONIC), bound s]; the supervisor kills the worker once one is past its bound.
    calls: tuple[tuple[str, str, float, float], ...] = ()

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Heartbeat:
        return cls(**{**body, "calls": tuple(tuple(call) for call in body.get("calls", ()))})


# -- spare <-> supervisor -------------------------------------------------------------------
@dataclass(frozen=True)
class SpareHeartbeat(Message):
    """A warm spare (worker/spare.py) is alive; `primed` once its imports and the runtime's set-up are done."""

    KIND: ClassVar[str] = "SPARE_HEARTBEAT"
    device: int  # the CUDA device its runtime is set up for (0 on CPU): it replaces workers of that device
    pid: int
    primed: bool = False


@dataclass(frozen=True)
class TakeOver(Message):
    """Become worker `worker`, generation `generation`: what a fresh worker gets on its command line."""

    KIND: ClassVar[str] = "TAKE_OVER"
    worker_index: int
    generation: int
    skip_models: list[str] = field(default_factory=list)  # quarantined model keys (--skip-model)
    # its lane (supervision/lanes.py: --lane-model, --lane-exclude, --lane-rank): the models it serves
    lane_models: list[str] = field(default_factory=list)
    lane_excludes: list[str] = field(default_factory=list)
    lane_rank: int = 0


# -- supervisor -> gateway ------------------------------------------------------------------
@dataclass(frozen=True)
class WorkerStarted(Message):
    KIND: ClassVar[str] = "WORKER_STARTED"
    worker_index: int
    pid: int
    generation: int
    restarts: dict[str, int] = field(default_factory=dict)
    replaces: int | None = None  # a successor: the generation it takes over from
    reason: ReplaceReason | None = None  # a successor: why


@dataclass(frozen=True)
class ExitInfo:
    """How a worker process ended: `last_exit` in WorkerExited, Snapshot and /admin/status."""

    reason: str
    at: float  # wall-clock time
    pid: int
    generation: int


@dataclass(frozen=True)
class WorkerExited(Message):
    KIND: ClassVar[str] = "WORKER_EXITED"
    worker_index: int
    pid: int
    generation: int
    reason: str
    at: float
    restarts: dict[str, int] = field(default_factory=dict)
    loading_model: str | None = None  # it died loading this model: the load is blamed, not the batch

    @property
    def last_exit(self) -> ExitInfo:
        return ExitInfo(self.reason, self.at, self.pid, self.generation)


def _with_exit_info(body: dict[str, Any]) -> dict[str, Any]:
    """A process's info body with its `last_exit` (if any) as an ExitInfo."""
    last = body.get("last_exit")
    return {**body, "last_exit": None if last is None else ExitInfo(**last)}


@dataclass(frozen=True)
class WorkerInfo:
    """The supervisor's numbers for one worker index (in Snapshot)."""

    worker_index: int
    generation: int
    restarts: dict[str, int] = field(default_factory=dict)
    last_exit: ExitInfo | None = None
    rss_bytes: int = 0
    uss_bytes: int = 0  # its unique set: the pages no other process shares

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> WorkerInfo:
        return cls(**_with_exit_info(body))


@dataclass(frozen=True)
class SpareInfo:
    """The supervisor's numbers for one worker device's warm spare (in Snapshot): its process, if any, and counters."""

    device: int
    pid: int = 0  # 0: none now (restarting, or waiting for a starting worker of its device)
    state: SpareState = "none"
    rss_bytes: int = 0
    takeovers: int = 0
    deaths: dict[str, int] = field(default_factory=dict)  # a spare's own deaths by reason (not worker restarts)


@dataclass(frozen=True)
class GatewayInfo:
    """The supervisor's numbers for one gateway process (in Snapshot): its restarts outlive it."""

    gateway_index: int
    pid: int
    generation: int
    restarts: dict[str, int] = field(default_factory=dict)
    last_exit: ExitInfo | None = None

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> GatewayInfo:
        return cls(**_with_exit_info(body))


@dataclass(frozen=True)
class WorkerSilent(Message):
    """A worker's heartbeats stopped (`silent`: a native call that holds the GIL, SIGSTOP), or came back.

    While silent it is wedged, not busy: readiness does not count it, until it beats again or is killed
    at --hang-timeout-s and its successor says READY (gateway/kserve/dataplane.py).
    """

    KIND: ClassVar[str] = "WORKER_SILENT"
    worker_index: int
    generation: int
    silent: bool = True


@dataclass(frozen=True)
class Snapshot(Message):
    KIND: ClassVar[str] = "SNAPSHOT"
    supervisor_pid: int
    workers: tuple[WorkerInfo, ...]
    quarantined: dict[str, str] = field(default_factory=dict)  # model -> why
    gateways: tuple[GatewayInfo, ...] = ()
    spares: tuple[SpareInfo, ...] = ()

    @classmethod
    def from_body(cls, body: dict[str, Any]) -> Snapshot:
        return cls(
            **{
                **body,
                "workers": tuple(WorkerInfo.from_body(w) for w in body["workers"]),
                "gateways": tuple(GatewayInfo.from_body(g) for g in body.get("gateways", ())),
                "spares": tuple(SpareInfo(**s) for s in body.get("spares", ())),
            }
        )


@dataclass(frozen=True)
class ModelQuarantined(Message):
    KIND: ClassVar[str] = "MODEL_QUARANTINED"
    model: str
    reason: str


@dataclass(frozen=True)
class ModelUnquarantined(Message):
    KIND: ClassVar[str] = "MODEL_UNQUARANTINED"
    model: str


@dataclass(frozen=True)
class Reload(Message):
    KIND: ClassVar[str] = "RELOAD"
    model_repository: str


# -- gateway -> supervisor ------------------------------------------------------------------
@dataclass(frozen=True)
class KillWorker(Message):
    KIND: ClassVar[str] = "KILL_WORKER"
    worker_index: int
    generation: int
    reason: KillReason


@dataclass(frozen=True)
class WorkerRetired(Message):
    KIND: ClassVar[str] = "WORKER_RETIRED"
    worker_index: int
    generation: int
    gateway_index: int = 0  # which gateway holds no batch of it any more (each must say so)


@dataclass(frozen=True)
class QuarantineModel(Message):
    """A gateway isolated enough poison requests of a model: the supervisor quarantines it in every gateway.

    With `poison_request`, one request of the model was just isolated as poison (`reason`: how it
    crashed the worker): the supervisor counts those from every gateway, and quarantines the model
    once `quarantine_poison_requests` of them fall within `quarantine_window_s`, as one gateway did.
    """

    KIND: ClassVar[str] = "QUARANTINE_MODEL"
    model: str
    reason: str
    poison_request: bool = False
    request_id: str | None = None  # the poison request's id (X-Request-ID), for the supervisor's log


@dataclass(frozen=True)
class RepositoryChanged(Message):
    """A repository load or unload that gateway `gateway` carried out (the workers were told once, by it).

    The supervisor passes it on to every other gateway, which applies it to its own view: an unloaded
    model answers 503 there too; a loaded one has its config read again and serves again.
    """

    KIND: ClassVar[str] = "REPOSITORY_CHANGED"
    model: str
    action: RepositoryAction
    gateway_index: int


@dataclass(frozen=True)
class Unquarantine(Message):
    KIND: ClassVar[str] = "UNQUARANTINE"
    model: str


@dataclass(frozen=True)
class ReloadWorkers(Message):
    """A repository load of a model whose config failed at start-up, now fixed: workers load models
    only when they start, so each is replaced without downtime by one that reads the repository."""

    KIND: ClassVar[str] = "RELOAD_WORKERS"
    model: str


@dataclass(frozen=True)
class ReloadRepository(Message):
    """Explicit mode: a gateway changed the served repository (a load or an unload of `model`). As on SIGHUP,
    every gateway reads it again and each worker is replaced without downtime by one that reads it."""

    KIND: ClassVar[str] = "RELOAD_REPOSITORY"
    model: str
    gateway_index: int
