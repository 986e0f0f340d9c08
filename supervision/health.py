"""What the supervisor tells systemd, and the gateway health probe it is decided from.

Runs in the supervisor. `GatewayProbe` is a thread that asks the gateway over plain
HTTP (a blocking call, kept out of the supervisor loop so reaping stays prompt) whether
it is live and ready and what it holds. `ServiceNotifier` is driven by the supervisor
loop on every tick and turns that into sd_notify messages:

    READY=1     the gateway answers /v2/health/ready with 200: it listens, a worker is
                ready and every model was loaded (once at start; again after a reload)
    WATCHDOG=1  every half WATCHDOG_USEC, only while the loop ticks and the gateway
                answered /v2/health/live within that half; while stopping, the loop alone
                (the gateway closes its listener to drain, and the probe stops)
    STATUS=     one line: workers ready/total, restarts by reason, requests queued; sent
                again in the loop iteration that reaps a worker (a ready worker counts only
                while its process lives), and fetched again at once when a worker is started
                or the gateway's readiness changes (otherwise every STATUS_INTERVAL_S)
    RELOADING=1 + MONOTONIC_USEC on SIGHUP, then READY=1 when the new generation serves
    STOPPING=1  on SIGTERM
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Collection
from typing import Any, Union

from ringserve.common.vocabulary import ServiceState

from .sdnotify import SdNotify

log = logging.getLogger(__name__)

PROBE_INTERVAL_S = 0.25  # how often the gateway is asked; well below any sane watchdog period
PROBE_TIMEOUT_S = 1.0  # a gateway that takes longer than this to say it is live is not
PROBE_JOIN_S = 0.1  # at exit, a probe still waiting on a request is left behind (a daemon thread)
STATUS_INTERVAL_S = 1.0  # /admin/status is fetched this often (it feeds STATUS= only)
MAX_RESPONSE_BYTES = 4 * 1024 * 1024

Address = Union[tuple[str, int], str]  # (host, port) or an AF_UNIX path


def http_get(address: Address, path: str, timeout_s: float, api_key: str | None = None) -> tuple[int, bytes]:
    """GET over HTTP/1.0 with one deadline for connect, send and read. Raises OSError."""
    deadline = time.monotonic() + timeout_s
    if isinstance(address, str):
        family = socket.AF_UNIX
    else:
        family = socket.AF_INET6 if ":" in address[0] else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC) as sock:
        sock.settimeout(timeout_s)
        sock.connect(address)
        auth = f"Authorization: Bearer {api_key}\r\n" if api_key else ""
        sock.sendall(f"GET {path} HTTP/1.0\r\nHost: ringserve\r\n{auth}Connection: close\r\n\r\n".encode())
        chunks, size = [], 0
        while True:
            sock.settimeout(max(0.001, deadline - time.monotonic()))
            chunk = sock.recv(65536)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > MAX_RESPONSE_BYTES:
                raise OSError(f"response to GET {path} is larger than {MAX_RESPONSE_BYTES} bytes")
    head, _, body = b"".join(chunks).partition(b"\r\n\r\n")
    try:
        return int(head.split(b" ", 2)[1]), body
    except (IndexError, ValueError):
        raise OSError(f"not an HTTP response to GET {path}: {head[:80]!r}") from None


def probe_address(host: str, port: int) -> tuple[str, int]:
    """Where to reach a gateway bound to host:port from this machine (wildcards -> loopback)."""
    if host in ("", "0.0.0.0"):
        return "127.0.0.1", port
    if host == "::":
        return "::1", port
    return host, port


def socket_address(fd: int) -> Address:
    """Where to reach the listening socket behind an inherited fd."""
    sock = socket.socket(fileno=fd)
    try:
        name = sock.getsockname()
    finally:
        sock.detach()  # the fd stays open: it is the listener we pass on
    if isinstance(name, str):
        return name
    return probe_address(name[0], name[1])


class GatewayProbe(threading.Thread):
    """Polls the gateway's health endpoints; the supervisor loop reads the last answers.

    Plain attribute writes only (atomic under the GIL): `live_at` and `ready_at` are
    monotonic times of the last 200 answers, `status` the last /admin/status document.
    """

    def __init__(
        self,
        address: Address,
        interval_s: float = PROBE_INTERVAL_S,
        timeout_s: float = PROBE_TIMEOUT_S,
        api_key: str | None = None,
    ) -> None:
        super().__init__(name="gateway-probe", daemon=True)
        self.address, self.interval_s, self.timeout_s = address, interval_s, timeout_s
        self.api_key = api_key
        self.live_at = 0.0
        self.ready = False
        self.ready_at = 0.0
        self.status: dict[str, Any] | None = None
        self._status_due = 0.0
        self._stopped = threading.Event()
        self._wake = threading.Event()

    def run(self) -> None:
        while not self._stopped.is_set():
            self.probe_once()
            self._wake.wait(self.interval_s)
            self._wake.clear()

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()

    def refresh(self) -> None:
        """Probe now and fetch /admin/status again: a worker came or went."""
        self._status_due = 0.0
        self._wake.set()

    def probe_once(self) -> None:
        if self._get("/v2/health/live")[0] == 200:
            self.live_at = time.monotonic()
        code, _ = self._get("/v2/health/ready")
        if (code == 200) != self.ready:  # a worker became ready, or the last one went
            self._status_due = 0.0
        self.ready = code == 200
        if self.ready:
            self.ready_at = time.monotonic()
        now = time.monotonic()
        if now >= self._status_due:
            self._status_due = now + STATUS_INTERVAL_S
            code, body = self._get("/admin/status")
            if code == 200:
                try:
                    self.status = json.loads(body)
                except ValueError:
                    self.status = None

    def _get(self, path: str) -> tuple[int, bytes]:
        if self._stopped.is_set():  # not the round's next GETs either
            return 0, b""
        try:
            return http_get(self.address, path, self.timeout_s, self.api_key)
        except OSError:
            return 0, b""  # not listening yet, draining, or wedged: all mean "no answer"


def status_line(
    state: ServiceState,
    workers_total: int,
    restarts: dict[str, int],
    gateway_status: dict[str, Any] | None,
    gateway_answers: bool,
    worker_pids: Collection[int] | None = None,
) -> str:
    """The one-line STATUS= text, e.g. '1/1 workers ready; restarts: SIGKILL=1; 0 requests queued'.

    `worker_pids`: the worker processes alive now (the supervisor's view, current to the
    last reap). The gateway's document may be up to a second old: a worker it calls ready
    counts only while its process lives.
    """
    parts = []
    if state in ("reloading", "stopping"):
        parts.append({"reloading": "reloading", "stopping": "draining"}[state])
    if gateway_status is None or not gateway_answers:
        parts.append("gateway not answering")
    else:
        ready = sum(
            1
            for w in gateway_status.get("workers", [])
            if w.get("state") == "ready" and (worker_pids is None or w.get("pid") in worker_pids)
        )
        parts.append(f"{ready}/{workers_total} workers ready")
    counted = {reason: n for reason, n in sorted(restarts.items()) if n}
    parts.append("restarts: " + (", ".join(f"{k}={v}" for k, v in counted.items()) if counted else "none"))
    if gateway_status is not None and gateway_answers:
        queued = sum(m.get("queue_depth", 0) for m in gateway_status.get("models", {}).values())
        parts.append(f"{queued} requests queued")
        kept = (gateway_status.get("reload") or {}).get("kept_models")
        if kept:  # a reload's new generation failed these: the old one serves them on
            parts.append(f"reload failed for {', '.join(sorted(kept))}: the old generation serves on")
    return "; ".join(parts)


class ServiceNotifier:
    """Decides READY/WATCHDOG/STATUS/RELOADING/STOPPING for the supervisor; silent without systemd."""

    def __init__(self, notify: SdNotify, watchdog_timeout_s: float | None, probe: GatewayProbe | None) -> None:
        self.notify = notify
        self.probe = probe
        self.watchdog_period_s = watchdog_timeout_s / 2 if watchdog_timeout_s else None
        self.state: ServiceState = "starting"
        self._next_ping = 0.0
        self._last_status: str | None = None
        self._reload_asked_at = 0.0

    @property
    def enabled(self) -> bool:
        return self.notify.enabled and self.probe is not None

    def start(self) -> None:
        if self.enabled:
            self.probe.start()
            if self.watchdog_period_s:
                log.info("systemd watchdog on: pinging every %.1f s while the gateway is live", self.watchdog_period_s)

    def close(self) -> None:
        if self.probe is not None and self.probe.is_alive():
            self.probe.stop()
            # Not its whole timeout: a connect that systemd's socket queues waits for it, and
            # the supervisor's exit (hence a restart) would wait too.
            self.probe.join(timeout=PROBE_JOIN_S)
        self.notify.close()

    def reloading(self) -> None:
        if self.enabled and self.state != "stopping":
            self.state = "reloading"
            self._reload_asked_at = time.monotonic()
            self.notify.reloading("reloading: starting a new worker generation")

    def stopping(self) -> None:
        if self.enabled and self.state != "stopping":
            self.state = "stopping"
            self.notify.stopping("draining: finishing accepted requests")
            # The gateway stops listening to drain: from now on a probe only waits for its timeout.
            self.probe.stop()

    def worker_changed(self) -> None:
        """A worker was started or reaped: fetch the gateway's view again now, not in up to a second."""
        if self.enabled:
            self.probe.refresh()

    def tick(
        self,
        now: float,
        *,
        reload_pending: bool,
        workers_total: int,
        restarts: dict[str, int],
        worker_pids: Collection[int] | None = None,
    ) -> None:
        """Called by the supervisor loop on every iteration, after it reaped and restarted children."""
        if not self.enabled:
            return
        probe = self.probe
        if (
            self.state in ("starting", "reloading")
            and not reload_pending
            and probe.ready
            and probe.ready_at > self._reload_asked_at
        ):
            self.state = "ready"
            self.notify.ready()
            log.info("told systemd: READY=1")
        if self.watchdog_period_s and now >= self._next_ping:
            # While stopping the gateway closes its listener on purpose: the loop alone vouches.
            if self.state == "stopping" or now - probe.live_at <= self.watchdog_period_s:
                self.notify.watchdog()
                self._next_ping = now + self.watchdog_period_s
        answers = now - probe.live_at <= max(self.watchdog_period_s or 0.0, 2 * STATUS_INTERVAL_S)
        text = status_line(self.state, workers_total, restarts, probe.status, answers, worker_pids)
        if text != self._last_status:
            self._last_status = text
            self.notify.status(text)
