"""One child process of the supervisor (a gateway or a worker), what outlives it, and the table of them all.

`Child` is one process; `RestartRecord` what its index keeps across processes (counters,
backoff); `Children` every child not yet reaped, in the order started (the order the loop
reaps them in), and how a child is started. Run in the supervisor process only.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from multiprocessing import resource_tracker

from ringserve.common import supervisor_messages
from ringserve.common.vocabulary import ChildRole, KillReason, StopReason
from ringserve.shm.segment import Segment

log = logging.getLogger(__name__)


RESTART_IMMEDIATE = 3  # consecutive crashes restarted at once (isolating a poison request takes a few)
RESTART_BACKOFF_FIRST_S = 0.1
RESTART_BACKOFF_MAX_S = 10.0
STABLE_AFTER_S = 10.0  # a worker or gateway up this long resets its backoff
CGROUP_MEMORY_EVENTS = "/sys/fs/cgroup/memory.events"


@dataclass(eq=False)
class Child:
    role: str  # "gateway" | "worker" | "spare" (a spare that takes over becomes a "worker")
    index: int
    generation: int
    process: subprocess.Popen
    started_at: float
    last_heartbeat: float  # its start until the first one comes
    heard: bool = False  # a heartbeat came: from now on silence means a hang
    ready: bool = False  # a worker: its eager models are loaded (heartbeat); a spare: primed (ready to take over)
    kill_reason: KillReason | StopReason | None = None  # set when we killed or stopped it ourselves
    stop_started_at: float = 0.0  # when it got SIGTERM from us
    replaces: int | None = None  # a successor: the generation it takes over from, until that one retires
    successor: Child | None = None  # the next generation, starting while this one serves
    batches_done: int = 0  # as its heartbeats report
    calls: tuple = ()  # a worker's calls into model code running at its last heartbeat (worker/progress.py)
    silent: bool = False  # a worker whose beats stopped for WORKER_SILENCE_S: the gateways were told
    kill_bound_s: float = 0.0  # killed for a call past its bound: that bound (the quarantine's window grows by it)
    rss_bytes: int = 0
    uss_bytes: int = 0  # its own pages (what stopping it would free): a lane's cost beside the shared ones
    segment: Segment | None = None  # a gateway's ring: made for this incarnation, unlinked once it is reaped
    # A worker being replaced: gateway index -> the incarnation (generation) of that gateway whose
    # WORKER_RETIRED is still awaited. A gateway that dies meanwhile counts as having sent it.
    retire_votes: dict[int, int] | None = None


@dataclass
class RestartRecord:
    """What outlives one worker (or gateway) process: its restart counters and backoff."""

    generation: int = 0
    restarts: dict[str, int] = field(default_factory=dict)
    consecutive_crashes: int = 0
    restart_at: float | None = None
    last_exit: supervisor_messages.ExitInfo | None = None
    recycle_not_before: float = 0.0

    def count_crash(self, reason: str, started_at: float, now: float) -> None:
        """One more death for `reason`; the run of consecutive crashes restarts after a stable run."""
        self.restarts[reason] = self.restarts.get(reason, 0) + 1
        if now - started_at > STABLE_AFTER_S:
            self.consecutive_crashes = 0
        self.consecutive_crashes += 1


class Children:
    """Every child process not yet reaped, in the order started, and the files they share with us.

    `runtime_dir` and `settings_path` are set once the supervisor made them (setup).
    """

    def __init__(self) -> None:
        self.all: list[Child] = []
        self.runtime_dir = ""
        self.settings_path = ""

    def args(self, module: str) -> list[str]:
        """What every child gets: the settings file, and what only this run of the supervisor knows."""
        return [*child_python(module), "--settings", self.settings_path, "--parent-pid", str(os.getpid())]

    def start(
        self,
        role: ChildRole,
        index: int,
        generation: int,
        args: list[str],
        pass_fds: tuple[int, ...] = (),
        stdin: int | None = None,
    ) -> Child:
        # A new session: a terminal's Ctrl-C reaches only us, and we decide the order of stopping.
        process = subprocess.Popen(args, start_new_session=True, pass_fds=pass_fds, stdin=stdin)
        now = time.monotonic()
        child = Child(role, index, generation, process, now, now)
        self.all.append(child)
        log.info("started %s %d generation %d (pid %d)", role, index, generation, process.pid)
        return child

    def add(self, child: Child) -> None:
        self.all.append(child)

    def role(self, role: ChildRole) -> list[Child]:
        return [c for c in self.all if c.role == role]

    def reaped(self) -> Iterator[tuple[Child, int]]:
        """Each child that has exited, with its return code, taken off the table as it is yielded."""
        for child in list(self.all):
            returncode = child.process.poll()
            if returncode is None:
                continue
            self.all.remove(child)
            kill_group(child.process.pid)  # what its code forked goes with it, whatever its end
            yield child, returncode

    def kill_all(self) -> None:
        for child in self.all:
            kill(child.process)


def child_python(module: str) -> list[str]:
    """The command that runs `module` of this installation in a child process.

    `-P` (Python 3.11's safe path): `-m` would otherwise put the working directory first on
    sys.path, and a `worker/` or `common/` folder where the user stands would run instead of
    ours (seen: a stray common/__init__.py crash-looped the gateway).
    """
    return [sys.executable, "-P", "-m", module]


def exit_reason(returncode: int) -> str:
    if returncode < 0:
        try:
            return signal.Signals(-returncode).name
        except ValueError:
            return f"signal_{-returncode}"
    return f"exit_{returncode}"


def backoff_s(consecutive_crashes: int) -> float:
    """The first few restarts at once; then 0.1 s doubling up to 10 s."""
    if consecutive_crashes <= RESTART_IMMEDIATE:
        return 0.0
    return min(RESTART_BACKOFF_MAX_S, RESTART_BACKOFF_FIRST_S * 2 ** (consecutive_crashes - RESTART_IMMEDIATE - 1))


def oom_kill_count() -> int:
    """The kernel's OOM-kill count for our cgroup (v2); 0 where it cannot be read."""
    try:
        with open(CGROUP_MEMORY_EVENTS) as f:
            for line in f:
                key, value = line.split()
                if key == "oom_kill":
                    return int(value)
    except (OSError, ValueError):
        pass
    return 0


def kill(process: subprocess.Popen) -> None:
    """SIGKILL it and its process group, unless it has exited already (then `reaped` kills the group)."""
    if process.poll() is None:
        try:
            process.kill()  # first: a process that leads no group (a test's stand-in) still goes
        except ProcessLookupError:
            pass
        kill_group(process.pid)  # not reaped yet, so its group ID is still its own


def kill_group(pid: int) -> None:
    """SIGKILL every process left in the group of the child `pid`: it leads one of its own (Popen's
    start_new_session), and the processes a model's code forks inherit it, so they die with their
    worker. PR_SET_PDEATHSIG would not do: the kernel clears it in a fork's child. A group ID is not
    reused while a member lives, so after the reap this reaches only those members (none: ESRCH).
    A process that leaves the group itself (setsid, setpgid) escapes, as it would Triton's stub."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def stop_resource_tracker() -> None:
    """Stop the resource tracker that creating the ring started, and wait for it: called last.

    It stays for the whole run because it unlinks the ring if we are SIGKILLed. Left running,
    it would exit only on the EOF of our exit, after us: systemd (KillMode=mixed) SIGKILLs
    it then, on every stop. `_stop` is private, but present from 3.8 on (CPython's own tests
    call it); without it we fall back to that EOF.
    """
    stop = getattr(resource_tracker._resource_tracker, "_stop", None)
    if stop is not None:
        stop()


def gateway_name(index: int, gateway_count: int) -> str:
    return "the gateway" if gateway_count == 1 else f"gateway {index}"
