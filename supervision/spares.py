"""The warm spares: per worker device, one worker process set up but for its models (worker/spare.py).

When a worker index needs a new process (a death of any kind, a recycle, a reload), `Workers.spawn`
asks `take` first: the device's spare becomes that worker (same Child, now role "worker", with the
index and generation a fresh process would get) and reads its TakeOver on stdin; only a device
without a spare starts a fresh process (and so does one whose spare went silent: it is killed as
hung, see SPARE_SILENCE_S). A spare still importing is taken too: it is ahead of a fresh
start by however far it got. The device's next spare starts once no worker of that device is
starting (its heartbeat says its models are loaded), so it never takes the CPU from a takeover or
from a boot. A spare that dies itself is started again with the workers' backoff; its deaths are
counted apart (`SpareInfo.deaths`), never as worker restarts. Run in the supervisor process only.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import subprocess
import time
from dataclasses import dataclass, field

import psutil

from ringserve.common import supervisor_messages
from ringserve.common.exits import REASON_HUNG, REASON_STOPPING
from ringserve.common.settings import Settings

from .children import Child, Children, RestartRecord, backoff_s, exit_reason, kill

log = logging.getLogger(__name__)

SPARE_STOP_GRACE_S = 2.0  # a spare holds nothing to finish: SIGTERM, then SIGKILL after this
# A primed spare silent this long is not handed a takeover (it is killed as hung, and a fresh worker
# starts): 4 of its 0.25 s beats (worker/threads.py: HEARTBEAT_INTERVAL_S), so that a beat late on a
# loaded host still passes. Not --hang-timeout-s (5 s): a SIGSTOPped spare taken within it cost its
# index up to --worker-start-timeout-s (60 s) of 503s, where passing over a live one costs a fresh
# start (about a second).
SPARE_SILENCE_S = 1.0


@dataclass(eq=False)
class SpareGroup:
    """The workers of one device and their spare: its process (None while there is none) and its counters."""

    device: int
    record: RestartRecord = field(default_factory=RestartRecord)  # restarts: the spare's own deaths
    child: Child | None = None
    takeovers: int = 0


class Spares:
    """One warm spare per worker device (--warm-spare); none at all when it is off."""

    def __init__(self, settings: Settings, children: Children) -> None:
        self.settings = settings
        self.children = children
        indexes = range(settings.workers + settings.standby_workers)
        devices = sorted({settings.spare_device(i) for i in indexes}) if settings.warm_spare else []
        self.groups = {device: SpareGroup(device) for device in devices}

    def all(self) -> list[Child]:
        return self.children.role("spare")

    def infos(self) -> tuple[supervisor_messages.SpareInfo, ...]:
        """One per device, for the Snapshot."""
        infos = []
        for group in self.groups.values():
            child = group.child
            state = "none" if child is None else "ready" if child.ready else "starting"
            infos.append(
                supervisor_messages.SpareInfo(
                    device=group.device,
                    pid=0 if child is None else child.process.pid,
                    state=state,
                    rss_bytes=0 if child is None else child.rss_bytes,
                    takeovers=group.takeovers,
                    deaths=dict(group.record.restarts),
                )
            )
        return tuple(infos)

    # -- starting and taking over ---------------------------------------------------------------
    def start_due(self, starting_devices: set[int]) -> None:
        """Start the spare of each device that has none, once its backoff is over and no worker of it starts."""
        now = time.monotonic()
        for group in self.groups.values():
            record = group.record
            if group.child is not None or group.device in starting_devices:
                continue
            if record.restart_at is not None and now < record.restart_at:
                continue
            record.restart_at = None
            record.generation += 1
            args = [*self.children.args("ringserve.worker"), "--spare-device", str(group.device)]
            group.child = self.children.start("spare", group.device, record.generation, args, stdin=subprocess.PIPE)

    def take(self, index: int, generation: int) -> Child | None:
        """The spare of worker `index`'s device, made worker (index, generation); None when it has none.

        Its TakeOver goes out with `hand_over`, once the gateways have been told of the new worker.
        A spare that has beaten before but not within SPARE_SILENCE_S (stopped, wedged) is killed
        as hung instead, and a fresh worker takes the place: its death is counted as a spare's.
        """
        group = self.groups.get(self.settings.spare_device(index))
        if (
            group is None
            or group.child is None
            or group.child.kill_reason is not None
            or group.child.process.poll() is not None
        ):
            return None  # (a dead one is reaped, and counted, as a spare)
        child = group.child
        now = time.monotonic()
        if child.heard and now - child.last_heartbeat > SPARE_SILENCE_S:
            log.error(
                "worker %d generation %d: the spare (pid %d) has been silent for %.1f s; passed over and killed",
                index,
                generation,
                child.process.pid,
                now - child.last_heartbeat,
            )
            child.kill_reason = REASON_HUNG
            kill(child.process)
            return None
        group.child = None
        group.takeovers += 1
        log.info(
            "worker %d generation %d: the spare (pid %d) takes over%s",
            index,
            generation,
            child.process.pid,
            "" if child.ready else ", still starting",
        )
        # Its heartbeats end at the TakeOver: until the worker's own first one (after the repository
        # scan, which runs a Python model's auto_complete_config) it has a fresh worker's
        # --worker-start-timeout-s, from now.
        child.role, child.index, child.generation = "worker", index, generation
        child.started_at = child.last_heartbeat = now
        child.heard, child.ready, child.rss_bytes = False, False, 0
        return child

    @staticmethod
    def hand_over(child: Child, order: supervisor_messages.TakeOver) -> None:
        """Write the TakeOver to the former spare; one that died meanwhile is reaped as that worker."""
        pipe = child.process.stdin
        try:
            pipe.write(order.encode_line())  # one short line: a pipe takes it whole, at once
            pipe.flush()
        except OSError as exc:
            log.error(
                "worker %d: its spare (pid %d) did not take the takeover: %s",
                order.worker_index,
                child.process.pid,
                exc,
            )
        finally:
            with contextlib.suppress(OSError):
                pipe.close()

    # -- heartbeats, deaths, stopping -----------------------------------------------------------
    def heard(self, beat: supervisor_messages.SpareHeartbeat) -> None:
        for child in self.all():
            if child.process.pid == beat.pid:
                child.last_heartbeat, child.heard = time.monotonic(), True
                child.ready = child.ready or beat.primed

    def exited(self, child: Child, returncode: int, *, stopping: bool) -> None:
        """A spare died before taking over: counted as a spare death, started again with backoff."""
        with contextlib.suppress(OSError):
            child.process.stdin.close()
        group = self.groups.get(child.index)
        if group is not None and group.child is child:
            group.child = None
        if stopping or child.kill_reason == REASON_STOPPING or group is None:
            log.info(
                "the spare of device %d (pid %d) stopped (%s)", child.index, child.process.pid, exit_reason(returncode)
            )
            return
        reason = child.kill_reason or exit_reason(returncode)
        now = time.monotonic()
        group.record.count_crash(reason, child.started_at, now)
        group.record.restart_at = now + backoff_s(group.record.consecutive_crashes)
        log.error(
            "the spare of device %d (pid %d) died: %s; another starts in %.1f s",
            child.index,
            child.process.pid,
            reason,
            group.record.restart_at - now,
        )

    def murder_hung(self) -> None:
        """Kill a spare that stopped beating (as a worker: --hang-timeout-s once heard), or ignored SIGTERM."""
        now, s = time.monotonic(), self.settings
        for child in self.all():
            if child.process.poll() is not None:
                continue
            if child.kill_reason == REASON_STOPPING:
                if now - child.stop_started_at > SPARE_STOP_GRACE_S:
                    kill(child.process)
                    child.stop_started_at = float("inf")
            elif now - child.last_heartbeat > (
                s.hang_timeout_s if child.heard else max(s.hang_timeout_s, s.worker_start_timeout_s)
            ):
                log.error("killing the spare of device %d (pid %d): hung", child.index, child.process.pid)
                child.kill_reason = REASON_HUNG
                kill(child.process)

    def stop_all(self) -> None:
        for child in self.all():
            if child.kill_reason is None:
                child.kill_reason, child.stop_started_at = REASON_STOPPING, time.monotonic()
                with contextlib.suppress(ProcessLookupError):
                    child.process.send_signal(signal.SIGTERM)

    def sample_memory(self) -> None:
        for child in self.all():
            try:
                child.rss_bytes = psutil.Process(child.process.pid).memory_info().rss
            except psutil.Error:
                pass  # exited since; the reaper handles it
