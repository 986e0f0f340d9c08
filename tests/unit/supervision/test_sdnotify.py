"""supervision/sdnotify.py: datagrams to a socket standing in for systemd's, and the protocol's variables."""
from __future__ import annotations

import os
import socket
import time
import uuid
from contextlib import closing
from pathlib import Path

import pytest

from ringserve.supervision.sdnotify import SdNotify, listen_fds, monotonic_usec, unset_environment, watchdog_timeout_s


@pytest.fixture
def manager(tmp_path: Path):
    """A bound datagram socket, as systemd's notify socket; yields (NOTIFY_SOCKET value, socket)."""
    path = tmp_path / "notify.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(2)
    try:
        yield str(path), sock
    finally:
        sock.close()


def received(sock: socket.socket) -> list[str]:
    return sock.recv(4096).decode().split("\n")


def test_ready_is_one_datagram_with_the_status_line(manager):
    address, sock = manager
    with closing(SdNotify(address)) as notify:
        assert notify.ready("1/1 workers ready")

    assert received(sock) == ["READY=1", "STATUS=1/1 workers ready"]


def test_status_is_always_a_single_line(manager):
    address, sock = manager

    with closing(SdNotify(address)) as notify:
        notify.status("draining:\n  3 requests\tleft")

    assert received(sock) == ["STATUS=draining: 3 requests left"]


def test_abstract_socket_named_with_at(tmp_path):
    name = f"ringserve-test-{uuid.uuid4().hex}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(2)
    try:
        with closing(SdNotify("@" + name)) as notify:
            assert notify.watchdog()
        assert received(sock) == ["WATCHDOG=1"]
    finally:
        sock.close()


def test_reloading_carries_the_monotonic_clock(manager):
    address, sock = manager
    before = monotonic_usec()

    with closing(SdNotify(address)) as notify:
        notify.reloading()

    lines = received(sock)
    assert lines[0] == "RELOADING=1"
    assert lines[1].startswith("MONOTONIC_USEC=")
    sent = int(lines[1].split("=")[1])
    assert before <= sent <= monotonic_usec()
    assert abs(sent - time.monotonic() * 1e6) < 1e6  # the clock systemd compares with: CLOCK_MONOTONIC


def test_stopping(manager):
    address, sock = manager

    with closing(SdNotify(address)) as notify:
        notify.stopping()

    assert received(sock) == ["STOPPING=1"]


def test_without_notify_socket_everything_is_a_no_op():
    notify = SdNotify.from_environment({})

    assert not notify.enabled
    assert not notify.ready() and not notify.watchdog() and not notify.status("x")


def test_a_vanished_manager_never_raises(tmp_path):
    with closing(SdNotify(str(tmp_path / "gone.sock"))) as notify:
        assert notify.enabled
        assert not notify.ready()


@pytest.mark.parametrize("environ, expected", [
    ({}, None),
    ({"WATCHDOG_USEC": "0"}, None),
    ({"WATCHDOG_USEC": "junk"}, None),
    ({"WATCHDOG_USEC": "30000000"}, 30.0),
    ({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "4242"}, 2.0),
    ({"WATCHDOG_USEC": "2000000", "WATCHDOG_PID": "4243"}, None),  # meant for another process
])
def test_watchdog_timeout_from_the_environment(environ, expected):
    assert watchdog_timeout_s(environ, pid=4242) == expected


@pytest.mark.parametrize("environ, expected", [
    ({}, []),
    ({"LISTEN_FDS": "1"}, []),  # without LISTEN_PID nobody knows whom it is for
    ({"LISTEN_FDS": "1", "LISTEN_PID": "4243"}, []),
    ({"LISTEN_FDS": "1", "LISTEN_PID": "4242"}, [3]),
    ({"LISTEN_FDS": "2", "LISTEN_PID": "4242", "LISTEN_FDNAMES": "http:admin"}, [3, 4]),
])
def test_listen_fds_only_for_our_pid(environ, expected):
    assert listen_fds(environ, pid=4242) == expected


def test_unset_environment_hides_the_protocol_from_children():
    environ = {"NOTIFY_SOCKET": "/run/systemd/notify", "WATCHDOG_USEC": "1", "WATCHDOG_PID": "1",
               "LISTEN_FDS": "1", "LISTEN_PID": "1", "LISTEN_FDNAMES": "x", "PATH": "/usr/bin"}

    unset_environment(environ)

    assert environ == {"PATH": "/usr/bin"}


def test_own_pid_is_the_default(monkeypatch):
    monkeypatch.setenv("WATCHDOG_USEC", "1000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))

    assert watchdog_timeout_s() == 1.0
