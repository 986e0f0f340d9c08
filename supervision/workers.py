"""The worker fleet: every worker index's process, started, watched, restarted and replaced.

A worker index is served by one process at a time, but for a zero-downtime replacement
(SIGHUP, a repository load, --max-batches-per-worker, --worker-memory-limit): the successor
(same index, next generation) starts while the old one serves; on its READY each gateway
sends it every new batch, lets the old one finish what it holds, then tells the supervisor
WORKER_RETIRED; once every gateway that was up when the replacement began has said so (or
died since), the old one gets SIGTERM. A death restarts its index with backoff; a death
while loading counts against that model (the quarantine). Every new process of an index is its
device's warm spare when one is there (supervision/spares.py); its heartbeats are judged by the
HangWatch it holds (supervision/hang_watch.py). Run in the supervisor process only.

The supervisor calls these while it is not stopping, but for `exited` (which logs a death
during the stop at info) and `stop_all`.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import Callable

import psutil

from ringserve.common import supervisor_messages
from ringserve.common.exits import (
    KILL_REASONS,
    REASON_MEMORY,
    REASON_OOM,
    REASON_RECYCLED,
    REASON_RELOAD,
    REASON_RETIRED,
    REASON_STOPPING,
)
from ringserve.common.settings import Settings
from ringserve.common.vocabulary import KillReason, ReplaceReason, StopReason

from .children import Child, Children, RestartRecord, backoff_s, exit_reason, kill, oom_kill_count
from .events import GatewayEvents
from .hang_watch import HangWatch
from .lanes import SHARED, Lane
from .quarantine import Quarantine
from .spares import Spares

log = logging.getLogger(__name__)

RECYCLE_MIN_UPTIME_S = 5.0  # never recycle a younger worker: a limit below its baseline would loop
RECYCLE_RETRY_S = 30.0  # after a successor failed, automatic recycling of that index waits this long


class Workers:
    """Every worker index (--workers, then --standby-workers): its processes and its RestartRecord.

    `changed` is called whenever a worker process is started (systemd's STATUS= fetches the
    gateway's view again at once).
    """

    def __init__(
        self,
        settings: Settings,
        children: Children,
        events: GatewayEvents,
        quarantine: Quarantine,
        changed: Callable[[], None],
        spares: Spares,
        lanes: list[Lane] | None = None,
    ) -> None:
        self.settings = settings
        self.children = children
        self.events = events
        self.quarantine = quarantine
        self.spares = spares  # (when a worker needs a new process, its device's spare is asked first)
        self.changed = changed
        self.records = [RestartRecord() for _ in range(settings.workers + settings.standby_workers)]
        # What each index serves (supervision/lanes.py); a standby index (past the lanes) serves every model.
        self.lanes = list(lanes or ()) + [SHARED] * (len(self.records) - len(lanes or ()))
        self._oom_kills = oom_kill_count()
        self.hangs = HangWatch(settings, events, self.kill_for)

    # -- who is who ------------------------------------------------------------------------
    def all(self) -> list[Child]:
        return self.children.role("worker")

    def serving(self) -> list[Child]:
        """Workers that serve (or start to serve) their index: not being stopped, not a pending successor."""
        return [c for c in self.all() if c.kill_reason is None and c.replaces is None]

    def find(self, index: int, generation: int) -> Child | None:
        """The worker process of this index and generation, if it still lives."""
        return next((c for c in self.all() if c.index == index and c.generation == generation), None)

    def reload_pending(self) -> bool:
        return any(c.successor for c in self.all())

    def restarts_by_reason(self) -> dict[str, int]:
        total: dict[str, int] = {}
        for record in self.records:
            for reason, count in record.restarts.items():
                total[reason] = total.get(reason, 0) + count
        return total

    def infos(self) -> tuple[supervisor_messages.WorkerInfo, ...]:
        """One per index, for the Snapshot."""
        serving = self.serving()
        self.sample_memory([c for c in serving if not c.rss_bytes])  # just took over: not sampled yet
        rss = {c.index: c.rss_bytes for c in serving}
        uss = {c.index: c.uss_bytes for c in serving}
        return tuple(
            supervisor_messages.WorkerInfo(
                worker_index=i,
                generation=r.generation,
                restarts=r.restarts,
                last_exit=r.last_exit,
                rss_bytes=rss.get(i, 0),
                uss_bytes=uss.get(i, 0),
            )
            for i, r in enumerate(self.records)
        )

    # -- starting --------------------------------------------------------------------------
    def spawn(self, index: int, replacing: Child | None = None, reason: ReplaceReason | None = None) -> Child:
        """A new process for worker `index`: its device's warm spare when there is one, else a fresh start."""
        record = self.records[index]
        record.generation += 1
        record.restart_at = None
        skip = list(self.quarantine.loading)  # changes while we run: not a setting
        child = spare = self.spares.take(index, record.generation)
        if child is None:
            args = [
                *self.children.args("ringserve.worker"),
                "--index",
                str(index),
                "--generation",
                str(record.generation),
            ]
            for model in skip:
                args += ["--skip-model", model]
            child = self.children.start("worker", index, record.generation, [*args, *self.lanes[index].args()])
        self.changed()
        if replacing is not None:
            child.replaces, replacing.successor = replacing.generation, child
            # Each gateway up now must retire the old generation (a gateway that dies meanwhile counts as done).
            replacing.retire_votes = {g.index: g.generation for g in self.children.role("gateway")}
        self.events.send(
            supervisor_messages.WorkerStarted(
                worker_index=index,
                pid=child.process.pid,
                generation=record.generation,
                restarts=record.restarts,
                replaces=child.replaces,
                reason=None if replacing is None else reason,
            )
        )
        if spare is not None:  # after WORKER_STARTED: the gateways know the new generation before its READY
            self.spares.hand_over(
                spare,
                supervisor_messages.TakeOver(
                    worker_index=index,
                    generation=record.generation,
                    skip_models=skip,
                    lane_models=list(self.lanes[index].models),
                    lane_excludes=list(self.lanes[index].excludes),
                    lane_rank=self.lanes[index].rank,
                ),
            )
        return child

    def starting_devices(self) -> set[int]:
        """The devices with a worker process that has not loaded its models yet (a spare waits for them)."""
        return {
            self.settings.spare_device(c.index)
            for c in self.all()
            if not c.ready and c.kill_reason is None and c.process.poll() is None
        }

    def restart_due(self) -> None:
        now = time.monotonic()
        for index, record in enumerate(self.records):
            if record.restart_at is not None and now >= record.restart_at:
                if record.consecutive_crashes > 1:
                    log.warning("worker %d is crash-looping: restart #%d", index, record.consecutive_crashes)
                self.spawn(index)

    # -- deaths ----------------------------------------------------------------------------
    def exited(self, child: Child, returncode: int, *, stopping: bool) -> None:
        if child.kill_reason == REASON_STOPPING:
            return
        if child.kill_reason == REASON_RETIRED:
            log.info(
                "worker %d generation %d (pid %d) stopped after retiring (%s)",
                child.index,
                child.generation,
                child.process.pid,
                exit_reason(returncode),
            )
            return
        reason = child.kill_reason if child.kill_reason in KILL_REASONS else exit_reason(returncode)
        oom_kills = oom_kill_count()
        if reason == "SIGKILL" and oom_kills > self._oom_kills:
            reason = REASON_OOM
        self._oom_kills = oom_kills
        record = self.records[child.index]
        level = logging.INFO if stopping else logging.ERROR
        log.log(
            level,
            "worker %d generation %d (pid %d) exited: %s",
            child.index,
            child.generation,
            child.process.pid,
            reason,
        )
        if stopping:
            return
        loading_model = self.quarantine.blame_loading_model(
            self.children.runtime_dir, child.index, child.generation, reason, child.kill_bound_s
        )
        self._hand_over(child, reason)
        now = time.monotonic()
        record.count_crash(reason, child.started_at, now)
        if not any(c.index == child.index and c.kill_reason is None for c in self.all()):
            record.restart_at = now + backoff_s(record.consecutive_crashes)  # nobody else serves this index
        exited = supervisor_messages.WorkerExited(
            worker_index=child.index,
            pid=child.process.pid,
            generation=child.generation,
            reason=reason,
            at=time.time(),
            restarts=record.restarts,
            loading_model=loading_model,
        )
        record.last_exit = exited.last_exit
        self.events.send(exited)

    def _hand_over(self, child: Child, reason: str) -> None:
        """A death during a replacement: the survivor of the pair serves; nothing new is started."""
        if child.successor is not None:  # its successor was starting: it simply takes over
            child.successor.replaces = None
            child.successor = None
            child.retire_votes = None
        if child.replaces is not None:  # a successor died before it took over: the old one keeps serving
            self._drop_successor(child)
            log.error(
                "the replacement of worker %d failed (%s); generation %d keeps serving",
                child.index,
                reason,
                child.replaces,
            )

    def _drop_successor(self, child: Child) -> None:
        """A successor that will not take over: its old generation serves on, recycled again only later."""
        for old in self.all():
            if old.successor is child:
                old.successor = None
                old.retire_votes = None
        self.records[child.index].recycle_not_before = time.monotonic() + RECYCLE_RETRY_S

    # -- killing and stopping --------------------------------------------------------------
    def heard(self, heartbeat: supervisor_messages.Heartbeat) -> None:
        if (child := self.find(heartbeat.worker_index, heartbeat.generation)) is not None:
            self.hangs.beat(child, heartbeat)

    def kill_for(self, child: Child, reason: KillReason) -> None:
        if child.kill_reason is None:
            log.error("killing worker %d (pid %d): %s", child.index, child.process.pid, reason)
            child.kill_reason = reason
            kill(child.process)

    def murder_hung(self) -> None:
        now = time.monotonic()
        for child in self.all():
            self.hangs.check(child, now)

    @staticmethod
    def stop(child: Child, reason: StopReason) -> None:
        """SIGTERM: a worker finishes the batch it runs, then exits 0 (murder_hung enforces a grace)."""
        child.kill_reason = reason
        child.stop_started_at = time.monotonic()
        child.process.send_signal(signal.SIGTERM)

    def stop_all(self) -> None:
        """The server stops (the gateways are gone): every worker not stopped yet gets SIGTERM."""
        for child in self.all():
            if child.kill_reason is None:
                self.stop(child, REASON_STOPPING)

    # -- zero-downtime replacement ----------------------------------------------------------
    def replace_serving(self) -> None:
        """Each serving worker gets a successor that reads the repository again (restart reason reload)."""
        for child in self.serving():
            if child.successor is None:
                self.recycle(child, REASON_RELOAD)

    def recycle(self, child: Child, reason: ReplaceReason) -> None:
        """Start the successor of a serving worker; the old one serves until the gateway retires it."""
        record = self.records[child.index]
        record.restarts[reason] = record.restarts.get(reason, 0) + 1
        log.info(
            "replacing worker %d generation %d (pid %d) without downtime: %s",
            child.index,
            child.generation,
            child.process.pid,
            reason,
        )
        self.spawn(child.index, replacing=child, reason=reason)

    def retired_by(self, child: Child, gateway: int) -> None:
        """Gateway `gateway` sends `child` nothing more and holds no batch of it.

        An old generation is stopped once every gateway that was up when its replacement began
        has said so, or died since (a new incarnation never sent it anything). A successor that a
        gateway refused (it failed a model the old one serves) is stopped at once: the gateways
        judge it from the same READY. Any other worker is serving: the message is stale, ignored.
        """
        if child.replaces is not None:
            self.retire(child)
        elif child.successor is not None and child.retire_votes is not None:
            child.retire_votes.pop(gateway, None)
            if not child.retire_votes:
                self.retire(child)
            else:
                log.info(
                    "worker %d generation %d: gateway %d retired it; waiting for gateway(s) %s",
                    child.index,
                    child.generation,
                    gateway,
                    ", ".join(map(str, sorted(child.retire_votes))),
                )
        else:
            log.warning(
                "gateway %d retired worker %d generation %d, which no replacement involves; ignored",
                gateway,
                child.index,
                child.generation,
            )

    def gateway_gone(self, index: int, generation: int) -> None:
        """A gateway incarnation died: it counts as having retired every worker it was to retire."""
        for child in self.all():
            votes = child.retire_votes
            if votes is not None and votes.get(index) == generation:
                del votes[index]
                if not votes and child.successor is not None:
                    self.retire(child)

    def retire(self, child: Child) -> None:
        """The gateways send it nothing more and it holds no batch: stop it."""
        if child.kill_reason is not None:
            return
        child.retire_votes = None
        if child.successor is not None:
            child.successor.replaces = None
            child.successor = None
        if child.replaces is not None:  # a successor the gateway refused: it failed a model the old one serves
            self._drop_successor(child)
            log.error(
                "the replacement of worker %d (generation %d) failed a model that generation %d serves; "
                "generation %d serves on (the gateway's log says which model)",
                child.index,
                child.generation,
                child.replaces,
                child.replaces,
            )
        else:
            log.info(
                "worker %d generation %d (pid %d) retired: its successor serves",
                child.index,
                child.generation,
                child.process.pid,
            )
        self.stop(child, REASON_RETIRED)

    def recycle_due(self) -> None:
        """Replace workers past --max-batches-per-worker or --worker-memory-limit."""
        s = self.settings
        if not (s.max_batches_per_worker or s.worker_memory_limit_bytes):
            return
        now = time.monotonic()
        for child in self.serving():
            if (
                child.successor is not None
                or now - child.started_at < RECYCLE_MIN_UPTIME_S
                or now < self.records[child.index].recycle_not_before
            ):
                continue
            if s.max_batches_per_worker and child.batches_done >= s.max_batches_per_worker:
                self.recycle(child, REASON_RECYCLED)
            elif s.worker_memory_limit_bytes and child.rss_bytes > s.worker_memory_limit_bytes:
                log.warning(
                    "worker %d uses %d MiB, over --worker-memory-limit %d MiB",
                    child.index,
                    child.rss_bytes >> 20,
                    s.worker_memory_limit_bytes >> 20,
                )
                self.recycle(child, REASON_MEMORY)

    def sample_memory(self, children: list[Child] | None = None) -> None:
        for child in self.all() if children is None else children:
            try:
                # (smaps_rollup: ~0.3 ms a process, once a second; USS says what a lane costs on its own)
                memory = psutil.Process(child.process.pid).memory_full_info()
                child.rss_bytes, child.uss_bytes = memory.rss, memory.uss
            except psutil.Error:
                pass  # exited since; the reaper handles it
