"""A worker's beats and the calls into model code they report, judged: a worker that stopped beating
is killed as hung, one whose call is past its bound is killed with that call's reason, one that ignored
SIGTERM past its grace is killed, and the gateways hear when a worker is silent (not ready) and beats
again. Held by the fleet (supervision/workers.py); run in the supervisor process only."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from ringserve.common import supervisor_messages
from ringserve.common.exits import CALL_TIMEOUT_REASONS, REASON_HUNG, REASON_RETIRED, REASON_STOPPING
from ringserve.common.settings import Settings
from ringserve.common.vocabulary import KillReason

from .children import Child, kill
from .events import GatewayEvents

# The fleet's log: these lines were the worker fleet's before the watch had a module of its own.
log = logging.getLogger("ringserve.supervision.workers")

WORKER_STOP_GRACE_S = 5.0
# A worker that has not beaten for this long (four of its 0.25 s beats) is wedged to readiness: the gateways
# stop counting it ready (WorkerSilent) until it beats again, or its successor is ready after the hang kill.
WORKER_SILENCE_S = 1.0


class HangWatch:
    """Judges each worker process from its last heartbeat; `kill_for` is the fleet's (it logs and kills once)."""

    def __init__(
        self, settings: Settings, events: GatewayEvents, kill_for: Callable[[Child, KillReason], None]
    ) -> None:
        self.settings = settings
        self.events = events
        self.kill_for = kill_for

    def beat(self, child: Child, heartbeat: supervisor_messages.Heartbeat) -> None:
        """`child`'s heartbeat arrived: what it reports (readiness, batches, calls into model code)."""
        child.last_heartbeat = time.monotonic()
        child.heard = True
        child.ready = heartbeat.ready
        child.batches_done = heartbeat.batches
        child.calls = heartbeat.calls
        if child.silent:
            self._tell_silent(child, False)

    def check(self, child: Child, now: float) -> None:
        """Kill `child` if it is hung, past a call's bound or past its stop grace; tell the gateways if silent."""
        s = self.settings
        if child.process.poll() is not None:
            return
        if child.kill_reason in (REASON_STOPPING, REASON_RETIRED):
            if now - child.stop_started_at > WORKER_STOP_GRACE_S:
                log.warning(
                    "worker %d (pid %d) ignored SIGTERM for %.0f s; killing it",
                    child.index,
                    child.process.pid,
                    WORKER_STOP_GRACE_S,
                )
                kill(child.process)
                child.stop_started_at = float("inf")  # killed once; the reaper takes it from here
        elif now - child.last_heartbeat > (
            s.hang_timeout_s if child.heard else max(s.hang_timeout_s, s.worker_start_timeout_s)
        ):
            self.kill_for(child, REASON_HUNG)
        elif child.kill_reason is None:
            self._judge_calls(child, now)
            if child.heard and not child.silent and now - child.last_heartbeat > WORKER_SILENCE_S:
                self._tell_silent(child, True)

    def _tell_silent(self, child: Child, silent: bool) -> None:
        child.silent = silent
        log.log(
            logging.WARNING if silent else logging.INFO,
            "worker %d (pid %d) %s",
            child.index,
            child.process.pid,
            f"has not beaten for {WORKER_SILENCE_S:g} s: not ready until it does" if silent else "beats again",
        )
        self.events.send(supervisor_messages.WorkerSilent(child.index, child.generation, silent))

    def _judge_calls(self, child: Child, now: float) -> None:
        """Kill a worker whose call into model code (as its last heartbeat reported it) is past its bound:
        its heartbeat thread beats through a Python loop, but the thread that runs the model's code
        does not progress. Judged from the call's start, so a call whose beats stopped is judged too."""
        for hook, model, since, bound_s in child.calls:
            if now - since > bound_s:
                log.error(
                    "worker %d (pid %d): model %s's %s has run %.1f s, past its bound of %g s",
                    child.index,
                    child.process.pid,
                    model,
                    hook,
                    now - since,
                    bound_s,
                )
                child.kill_bound_s = bound_s
                self.kill_for(child, CALL_TIMEOUT_REASONS.get(hook, REASON_HUNG))
                return
