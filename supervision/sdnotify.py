"""The systemd service protocol without libsystemd: sd_notify datagrams and inherited sockets.

sd_notify(3): one datagram of newline-separated `KEY=VALUE` lines to the AF_UNIX
socket named by $NOTIFY_SOCKET (a path, or an abstract name written with a leading
'@'). Without $NOTIFY_SOCKET every call is a no-op, so the same code runs under a
terminal, a container or systemd. sd_watchdog_enabled(3): $WATCHDOG_USEC is the
timeout, $WATCHDOG_PID (when set) names the process that must ping. sd_listen_fds(3):
$LISTEN_FDS sockets start at fd 3, meant for the process named by $LISTEN_PID.

Runs in the supervisor only: it reads these variables once and removes them, so that
its children (gateway, workers) never talk to systemd behind its back.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
import time
from collections.abc import MutableMapping

log = logging.getLogger(__name__)

NOTIFY_ENV = ("NOTIFY_SOCKET",)
WATCHDOG_ENV = ("WATCHDOG_USEC", "WATCHDOG_PID")
LISTEN_ENV = ("LISTEN_FDS", "LISTEN_PID", "LISTEN_FDNAMES")
SD_LISTEN_FDS_START = 3  # the first inherited socket, by the protocol


class SdNotify:
    """Sends sd_notify messages; every method is a no-op when there is no $NOTIFY_SOCKET."""

    def __init__(self, address: str | None) -> None:
        self.address = _socket_address(address) if address else None
        self._socket: socket.socket | None = None
        if self.address is not None:
            self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
            self._socket.setblocking(False)

    @classmethod
    def from_environment(cls, environ: MutableMapping[str, str] = os.environ) -> SdNotify:
        return cls(environ.get("NOTIFY_SOCKET") or None)

    @property
    def enabled(self) -> bool:
        return self._socket is not None

    def notify(self, *lines: str) -> bool:
        """Send one datagram; False when disabled or when systemd could not take it now."""
        if self._socket is None or not lines:
            return False
        try:
            self._socket.sendto("\n".join(lines).encode(), self.address)
        except OSError as exc:
            # A full queue (EAGAIN) or a vanished manager must never stop the server.
            if exc.errno not in (errno.EAGAIN, errno.ENOENT, errno.ECONNREFUSED):
                log.warning("sd_notify to %r failed: %s", self.address, exc)
            return False
        return True

    def ready(self, status: str | None = None) -> bool:
        return self.notify("READY=1", *_status_line(status))

    def reloading(self, status: str | None = None) -> bool:
        # MONOTONIC_USEC lets systemd (>= 253, Type=notify-reload) tie this to the reload it asked for.
        return self.notify("RELOADING=1", f"MONOTONIC_USEC={monotonic_usec()}", *_status_line(status))

    def stopping(self, status: str | None = None) -> bool:
        return self.notify("STOPPING=1", *_status_line(status))

    def watchdog(self) -> bool:
        return self.notify("WATCHDOG=1")

    def status(self, text: str) -> bool:
        return self.notify(*_status_line(text))

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None


def _socket_address(address: str) -> str | bytes:
    if address.startswith("@"):
        return b"\0" + address[1:].encode()  # Linux abstract namespace
    return address


def _status_line(text: str | None) -> list[str]:
    return [] if text is None else ["STATUS=" + " ".join(text.split())]  # one line, always


def monotonic_usec() -> int:
    """CLOCK_MONOTONIC in microseconds, the clock systemd compares MONOTONIC_USEC with."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000


def watchdog_timeout_s(environ: MutableMapping[str, str] = os.environ, pid: int | None = None) -> float | None:
    """The watchdog timeout systemd expects us to keep, or None when the watchdog is off."""
    usec = environ.get("WATCHDOG_USEC", "")
    owner = environ.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    if owner and (not owner.isdigit() or int(owner) != (os.getpid() if pid is None else pid)):
        return None  # meant for another process
    return int(usec) / 1_000_000


def listen_fds(environ: MutableMapping[str, str] = os.environ, pid: int | None = None) -> list[int]:
    """File descriptors of the sockets systemd passed us (socket activation), else []."""
    count = environ.get("LISTEN_FDS", "")
    owner = environ.get("LISTEN_PID", "")
    if not count.isdigit() or not owner.isdigit() or int(owner) != (os.getpid() if pid is None else pid):
        return []
    return list(range(SD_LISTEN_FDS_START, SD_LISTEN_FDS_START + int(count)))


def unset_environment(environ: MutableMapping[str, str] = os.environ) -> None:
    """Forget the protocol variables, as sd_notify(unset_environment=1) does: children must not see them."""
    for name in (*NOTIFY_ENV, *WATCHDOG_ENV, *LISTEN_ENV):
        environ.pop(name, None)
