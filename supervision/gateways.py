"""The gateways: G indexes, each one process at a time, each incarnation with a ring of its own.

A gateway's death restarts that gateway alone, with the workers' backoff, counted per index;
the workers serve the others on. The handlers return the exit code the server must stop
with, or None: the supervisor owns the stop. Run in the supervisor process only.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time

from ringserve.common import supervisor_messages
from ringserve.common.exits import EXIT_BOOT_ERROR, EXIT_GATEWAY_CRASH_LOOP, EXIT_NO_SHARED_MEMORY
from ringserve.common.settings import Settings
from ringserve.shm.errors import SharedMemoryFull
from ringserve.shm.segment import Segment

from .children import STABLE_AFTER_S, Child, Children, RestartRecord, backoff_s, exit_reason, gateway_name
from .listeners import Listeners
from .ring_fit import RingSize, choose_rings, free_shared_memory_bytes, repository_slot_bytes

log = logging.getLogger(__name__)

# A restart whose ring finds no room waits this long for it, retrying: a worker still running a batch of the
# dead gateway maps the old ring until that batch ends (ring_fit.py), and the rings are fitted for G, not G + 1.
RING_WAIT_S = 60.0
RING_RETRY_S = 0.2
GATEWAY_GIVE_UP_CRASHES = 5  # one gateway index dying this often in a row, each before STABLE_AFTER_S: stop the server


class Rings:
    """The gateways' rings: one per incarnation, made by us, unlinked by us once it is reaped.

    `made` holds the rings made ahead, at setup, for each index's first incarnation: when
    /dev/shm cannot hold them, nothing else has been made yet to undo. `size` is the configured
    one until `make_ahead` fits it to /dev/shm (supervision/ring_fit.py).
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.made: dict[int, Segment] = {}  # gateway index -> the ring made for its next incarnation
        self.size = RingSize(settings.slot_count, settings.slot_mb * 1024 * 1024)

    def make(self) -> Segment:
        """A gateway's ring: a new name each time, its pages reserved (SharedMemoryFull when they cannot be)."""
        return Segment.create_unique(str(os.getpid()), slot_count=self.size.slot_count, slot_bytes=self.size.slot_bytes)

    def make_ahead(self, count: int) -> None:
        """The first incarnations' rings, made before anything else, cut to the free shared memory
        (RingsDoNotFit when not even one slot of the largest model fits; SharedMemoryFull when the
        space went to someone else meanwhile)."""
        self.size = choose_rings(
            self.size,
            count,
            lambda: repository_slot_bytes(self.settings.model_repository),
            free_shared_memory_bytes(),
        )
        for index in range(count):
            self.made[index] = self.make()

    def take(self, index: int) -> Segment:
        return self.made.pop(index, None) or self.make()

    @staticmethod
    def drop(child: Child) -> None:
        """Unlink a reaped gateway's ring: workers still running its batches write into a name nobody reads."""
        if child.segment is not None:
            child.segment.close()
            with contextlib.suppress(FileNotFoundError):  # (a stale sweep, or RemoveIPC=, got there first)
                child.segment.unlink()
            child.segment = None

    def drop_unused(self) -> None:
        for ring in self.made.values():
            ring.close()
            with contextlib.suppress(FileNotFoundError):
                ring.unlink()
        self.made.clear()


class Gateways:
    """Every gateway index (--gateways): its process, its RestartRecord, and the rings of its incarnations."""

    def __init__(self, count: int, settings: Settings, children: Children, listeners: Listeners) -> None:
        self.children = children
        self.listeners = listeners
        self.count = count  # Settings.gateway_count(), resolved once by the supervisor
        self.records = [RestartRecord() for _ in range(self.count)]
        self.rings = Rings(settings)
        self.ring_wait_since: dict[int, float] = {}  # gateway index -> when its restart first found no room

    def name(self, index: int) -> str:
        return gateway_name(index, self.count)

    def infos(self) -> tuple[supervisor_messages.GatewayInfo, ...]:
        """One per index, up or not (pid 0 while it restarts): its restart counters must not vanish meanwhile."""
        pids = {c.index: c.process.pid for c in self.children.role("gateway")}
        return tuple(
            supervisor_messages.GatewayInfo(
                gateway_index=i, pid=pids.get(i, 0), generation=r.generation, restarts=r.restarts, last_exit=r.last_exit
            )
            for i, r in enumerate(self.records)
        )

    def spawn(self, index: int = 0, generation: int = 0) -> Child:
        """Gateway `index` with its own ring (made fresh for each incarnation: a worker still writing a
        dead incarnation's batch writes into the old ring, never into a slot the new one hands out)."""
        ring = self.rings.take(index)
        args = [*self.children.args("ringserve.gateway"), "--index", str(index), "--segment", ring.name]
        if generation:  # a restart: it accepts once a worker has announced itself to it
            args += ["--generation", str(generation)]
        listener_args, pass_fds = self.listeners.gateway_args()
        args += listener_args
        try:
            child = self.children.start("gateway", index, generation, args, pass_fds=pass_fds)
        except BaseException:
            ring.close()
            ring.unlink()
            raise
        child.segment = ring
        return child

    def exited(self, child: Child, returncode: int, *, stopping: bool) -> int | None:
        """A reaped gateway (its ring already dropped): the exit code to stop the server with, or None."""
        name = self.name(child.index)
        if stopping:
            log.info("%s stopped (%s)", name, exit_reason(returncode))
        elif returncode == EXIT_BOOT_ERROR:
            log.critical("%s could not boot; stopping (see its log above)", name)
            return EXIT_BOOT_ERROR
        else:
            return self._crashed(child, exit_reason(returncode))
        return None

    def _crashed(self, child: Child, reason: str) -> int | None:
        """Restart that gateway with the workers' backoff; give up on a crash loop at start-up.

        The workers are left alone: they drop the dead gateway's batches (its clients are gone)
        and serve the other gateways on, and the new incarnation learns them from their READYs.
        A gateway index that dies again and again soon after its start (a broken install, a
        module that fails at import) will not get better by restarting: the supervisor stops
        with a non-zero exit, so systemd sees a failed unit instead of a spinning one. Counted
        per index, and one index in such a loop is enough: the gateways run the same code on
        the same settings, so what kills one at start-up will kill the others at their next
        start, and a server that keeps a fraction of its gateways alive would hide it.
        """
        record = self.records[child.index]
        now = time.monotonic()
        record.last_exit = supervisor_messages.ExitInfo(
            reason=reason, at=time.time(), pid=child.process.pid, generation=child.generation
        )
        record.count_crash(reason, child.started_at, now)
        name = self.name(child.index)
        if record.consecutive_crashes >= GATEWAY_GIVE_UP_CRASHES:
            log.critical(
                "%s died %d times in a row, each within %.0f s of its start (last: %s); giving up: see its log above",
                name,
                record.consecutive_crashes,
                STABLE_AFTER_S,
                reason,
            )
            return EXIT_GATEWAY_CRASH_LOOP
        record.restart_at = now + backoff_s(record.consecutive_crashes)
        log.error(
            "%s died (%s); restarting it%s",
            name,
            reason,
            f" in {record.restart_at - now:.1f} s" if record.restart_at > now else "",
        )
        return None

    def restart_due(self) -> int | None:
        """Restart each gateway whose backoff is over; the exit code to stop with when no ring can be made."""
        now = time.monotonic()
        for index, record in enumerate(self.records):
            if record.restart_at is None or now < record.restart_at:
                continue
            record.restart_at = None
            try:
                self.spawn(index, record.generation + 1)
            except SharedMemoryFull as exc:
                waiting_since = self.ring_wait_since.setdefault(index, now)
                if now - waiting_since >= RING_WAIT_S:
                    log.critical("cannot make a ring for %s: %s; stopping", self.name(index), exc)
                    return EXIT_NO_SHARED_MEMORY
                if waiting_since == now:
                    log.warning(
                        "no room for %s's new ring yet (%s): a worker may still hold the old one; waiting up to %.0f s",
                        self.name(index),
                        exc,
                        RING_WAIT_S,
                    )
                record.restart_at = now + RING_RETRY_S
                continue
            record.generation += 1
            self.ring_wait_since.pop(index, None)
        return None
