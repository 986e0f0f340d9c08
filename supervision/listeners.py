"""The listening sockets the supervisor hands to every gateway: systemd's, or bound here, and --metrics-port's.

Every gateway accepts on the same socket (`--fd`): connections queue in the kernel while one
restarts. With --reuse-port each gateway binds its own instead (common/listen.py), and none
is handed down. Run in the supervisor process only.
"""

from __future__ import annotations

import logging
import os
import socket

from ringserve.common.listen import listen_socket
from ringserve.common.settings import Settings
from ringserve.supervision.sdnotify import listen_fds

log = logging.getLogger(__name__)


class Listeners:
    """Our copies of the listening sockets, kept to hand to each gateway started, closed when the stop begins."""

    def __init__(self) -> None:
        self.listen_fd: int | None = None
        self._listener: socket.socket | None = None  # the listening socket we bound ourselves
        # --metrics-port's socket, shared by the gateways as the main one is (None: off, or --reuse-port)
        self._metrics_listener: socket.socket | None = None

    def open(self, settings: Settings) -> None:
        """Take systemd's socket (call before its variables are unset), or bind one; and --metrics-port's."""
        fds = listen_fds()
        if len(fds) > 1:
            log.warning("systemd passed %d sockets; serving on the first (fd %d) only", len(fds), fds[0])
        self.listen_fd = fds[0] if fds else None
        if self.listen_fd is None and not settings.reuse_port:
            # One socket for every gateway, bound here: connections queue in the kernel while one restarts.
            self._listener = listen_socket(settings.host, settings.port)
            self.listen_fd = self._listener.fileno()
        elif self.listen_fd is not None and settings.reuse_port:
            log.warning("--reuse-port is ignored under socket activation: every gateway accepts on systemd's socket")
        if settings.metrics_port and not settings.reuse_port:
            self._metrics_listener = listen_socket(settings.host, settings.metrics_port)

    def gateway_args(self) -> tuple[list[str], tuple[int, ...]]:
        """A gateway's arguments naming the sockets it inherits, and their fds (Popen's pass_fds)."""
        args: list[str] = []
        pass_fds: tuple[int, ...] = ()
        if self.listen_fd is not None:  # the one listening socket (systemd's or ours): queued across restarts
            args += ["--fd", str(self.listen_fd)]
            pass_fds += (self.listen_fd,)
        if self._metrics_listener is not None:  # --metrics-port: shared the same way
            args += ["--metrics-fd", str(self._metrics_listener.fileno())]
            pass_fds += (self._metrics_listener.fileno(),)
        return args, pass_fds

    def close(self) -> None:
        """Close our copy of the listening socket (systemd's, or ours): no gateway will be started on it again.

        We kept it to hand to a restarted gateway. Left open while stopping, the kernel kept
        queueing connections on it that nobody would accept: they hung until we exited, then
        were reset. Closed, not shut down: shutdown() would stop systemd's own copy listening
        too (systemd then fails the socket unit: "Got POLLHUP on a listening socket"), and the
        draining gateways' copies of ours.
        """
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        elif self.listen_fd is not None:
            os.close(self.listen_fd)
        self.listen_fd = None
        if self._metrics_listener is not None:
            self._metrics_listener.close()
            self._metrics_listener = None
