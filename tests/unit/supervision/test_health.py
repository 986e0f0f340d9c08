"""supervision/health.py: the HTTP probe against a tiny server, and what ServiceNotifier sends when."""
from __future__ import annotations

import json
import socket
import threading
import time
from contextlib import closing
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from ringserve.supervision.health import GatewayProbe, ServiceNotifier, http_get, probe_address, status_line
from ringserve.supervision.sdnotify import SdNotify

from tests.support.stack import poll_for

GATEWAY_STATUS = {
    "workers": [{"index": 0, "state": "ready"}, {"index": 1, "state": "starting"}],
    "models": {"mlp": {"queue_depth": 3}, "encoder": {"queue_depth": 2}},
}


class FakeProbe:
    """What GatewayProbe exposes, set by hand."""

    def __init__(self) -> None:
        self.live_at = 0.0
        self.ready = False
        self.ready_at = 0.0
        self.status = None
        self.timeout_s = 1.0

        self.stopped = False

    def start(self) -> None:
        pass

    def stop(self) -> None:
        self.stopped = True

    def is_alive(self) -> bool:
        return False


class Recorder(SdNotify):
    def __init__(self) -> None:
        super().__init__(None)
        self.sent: list[tuple[str, ...]] = []

    @property
    def enabled(self) -> bool:
        return True

    def notify(self, *lines: str) -> bool:
        self.sent.append(lines)
        return True

    def kinds(self) -> list[str]:
        return [lines[0].split("=")[0] for lines in self.sent]


@pytest.fixture
def notifier():
    recorder, probe = Recorder(), FakeProbe()
    return ServiceNotifier(recorder, watchdog_timeout_s=2.0, probe=probe), recorder, probe


def tick(n: ServiceNotifier, now: float, reload_pending: bool = False) -> None:
    n.tick(now, reload_pending=reload_pending, workers_total=2, restarts={"SIGKILL": 1})


def test_status_line_counts_ready_workers_restarts_and_queue():
    line = status_line("ready", 2, {"SIGKILL": 2, "reload": 1, "hung": 0}, GATEWAY_STATUS, True)

    assert line == "1/2 workers ready; restarts: SIGKILL=2, reload=1; 5 requests queued"


def test_status_line_when_the_gateway_does_not_answer():
    assert status_line("stopping", 1, {}, GATEWAY_STATUS, False) == (
        "draining; gateway not answering; restarts: none")


def test_ready_waits_for_the_gateway_to_say_ready(notifier):
    n, sent, probe = notifier
    probe.live_at = 10.0
    tick(n, 10.0)
    assert "READY" not in sent.kinds()

    probe.ready, probe.ready_at = True, 10.2
    tick(n, 10.3)

    assert sent.kinds().count("READY") == 1
    tick(n, 10.4)
    assert sent.kinds().count("READY") == 1  # once


def test_watchdog_only_while_the_gateway_answered_within_the_period(notifier):
    n, sent, probe = notifier  # timeout 2 s: ping every 1 s
    probe.live_at = 100.0
    tick(n, 100.0)
    tick(n, 100.5)  # not due yet
    assert sent.kinds().count("WATCHDOG") == 1

    tick(n, 101.0)  # due, and live 1.0 s ago
    assert sent.kinds().count("WATCHDOG") == 2

    tick(n, 102.5)  # due, but the gateway last answered 2.5 s ago: no ping
    tick(n, 103.0)
    assert sent.kinds().count("WATCHDOG") == 2

    probe.live_at = 103.1
    tick(n, 103.2)  # answers again: ping at once
    assert sent.kinds().count("WATCHDOG") == 3


def test_while_stopping_the_loop_alone_vouches_for_the_watchdog(notifier):
    n, sent, probe = notifier
    n.stopping()
    tick(n, 500.0)  # the gateway has closed its listener to drain

    assert sent.kinds()[:2] == ["STOPPING", "WATCHDOG"]
    assert probe.stopped


def test_the_supervisor_does_not_wait_at_exit_for_a_probe_queued_on_a_listener_nobody_accepts():
    # Under systemd the socket unit's copy of the listener still queues connections after the
    # gateway closed its own: the probe's connect succeeds and its GET waits for the timeout.
    server = TinyServer(None)
    n = ServiceNotifier(Recorder(), watchdog_timeout_s=None, probe=GatewayProbe(server.address, timeout_s=1.0))
    try:
        n.start()
        poll_for(lambda: server.requests, 5, what="the probe's first GET")
        n.stopping()
        started = time.monotonic()
        n.close()
        assert time.monotonic() - started < 0.5
        assert not n.probe.is_alive() or poll_for(lambda: not n.probe.is_alive(), 2, what="the probe to end")
        assert len(server.requests) == 1  # no GET after the stop began
    finally:
        server.close()


def test_reload_sends_reloading_then_ready_when_the_new_generation_serves(notifier):
    n, sent, probe = notifier
    probe.live_at, probe.ready, probe.ready_at = 1.0, True, 1.0
    tick(n, 1.0)
    n.reloading()
    probe.ready_at = 1e12  # the old generation keeps the gateway ready throughout
    tick(n, 2.0, reload_pending=True)
    assert sent.kinds().count("READY") == 1

    tick(n, 3.0, reload_pending=False)

    kinds = [k for k in sent.kinds() if k in ("READY", "RELOADING")]
    assert kinds == ["READY", "RELOADING", "READY"]


def test_status_is_sent_only_when_it_changes(notifier):
    n, sent, probe = notifier
    probe.live_at, probe.status = 5.0, GATEWAY_STATUS
    tick(n, 5.0)
    tick(n, 5.1)
    statuses = [lines for lines in sent.sent if lines[0].startswith("STATUS=")]
    assert statuses == [("STATUS=1/2 workers ready; restarts: SIGKILL=1; 5 requests queued",)]


class TinyServer:
    """Answers each connection once with a canned response, or never (a wedged gateway)."""

    def __init__(self, response: bytes | None) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.address = self.sock.getsockname()
        self.response = response
        self.requests: list[bytes] = []
        self.conns: list[socket.socket] = []
        threading.Thread(target=self.serve, daemon=True).start()

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            self.requests.append(conn.recv(4096))
            if self.response is not None:
                conn.sendall(self.response)
                conn.close()

    def close(self) -> None:
        self.sock.close()
        for conn in self.conns:
            conn.close()


def test_http_get_reads_status_and_body():
    server = TinyServer(b'HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\r\n{"ready":false}')
    try:
        assert http_get(server.address, "/v2/health/ready", 2.0) == (503, b'{"ready":false}')
        assert server.requests[0].startswith(b"GET /v2/health/ready HTTP/1.0\r\n")
    finally:
        server.close()


def test_probe_sends_the_gateway_api_key():
    server = TinyServer(b"HTTP/1.1 200 OK\r\n\r\n{}")
    try:
        http_get(server.address, "/admin/status", 2.0, api_key="s3cret")
        assert b"\r\nAuthorization: Bearer s3cret\r\n" in server.requests[0]
    finally:
        server.close()


def test_a_wedged_gateway_counts_as_not_live():
    server = TinyServer(None)  # accepts (the kernel would, even for a stopped process), never answers
    probe = GatewayProbe(server.address, timeout_s=0.2)
    try:
        probe.probe_once()
        assert probe.live_at == 0.0 and not probe.ready
    finally:
        server.close()


def test_probe_records_live_ready_and_status():
    body = b'{"workers": [], "models": {}}'
    server = TinyServer(b"HTTP/1.1 200 OK\r\n\r\n" + body)
    probe = GatewayProbe(server.address, timeout_s=2.0)
    try:
        probe.probe_once()
        assert probe.live_at > 0 and probe.ready and probe.status == {"workers": [], "models": {}}
    finally:
        server.close()


def test_probe_over_a_unix_socket(tmp_path: Path):
    path = str(tmp_path / "gw.sock")
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)

    def answer() -> None:
        conn, _ = server.accept()
        conn.recv(4096)
        conn.sendall(b"HTTP/1.1 200 OK\r\n\r\n{}")
        conn.close()

    threading.Thread(target=answer, daemon=True).start()
    try:
        assert http_get(path, "/v2/health/live", 2.0) == (200, b"{}")
    finally:
        server.close()


@pytest.mark.parametrize("host, expected", [
    ("0.0.0.0", ("127.0.0.1", 80)), ("::", ("::1", 80)), ("", ("127.0.0.1", 80)), ("10.1.2.3", ("10.1.2.3", 80)),
])
def test_wildcard_binds_are_probed_on_loopback(host, expected):
    assert probe_address(host, 80) == expected


# -- STATUS= follows worker events, not only the 1 s poll ---------------------------------------------
class FakeGateway(ThreadingHTTPServer):
    """Answers the probe's three paths from `answers` (path -> (code, document)); counts each path asked."""

    def __init__(self) -> None:
        self.answers: dict[str, tuple[int, object]] = {"/v2/health/live": (200, {}), "/v2/health/ready": (200, {}),
                                                       "/admin/status": (200, {"workers": [], "models": {}})}
        self.asked: list[str] = []
        super().__init__(("127.0.0.1", 0), GatewayHandler)
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def count(self, path: str) -> int:
        return self.asked.count(path)

    def close(self) -> None:
        self.shutdown()
        self.server_close()


class GatewayHandler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.server.asked.append(self.path)
        code, doc = self.server.answers[self.path]
        body = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def gateway():
    server = FakeGateway()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def systemd(tmp_path: Path):
    """A bound datagram socket standing in for systemd's notify socket; yields (address, socket)."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(tmp_path / "notify.sock"))
    sock.settimeout(2)
    with closing(sock):
        yield str(tmp_path / "notify.sock"), sock


def statuses(sock: socket.socket) -> list[str]:
    """The STATUS= lines received so far."""
    sock.setblocking(False)
    found = []
    try:
        while True:
            found += [line[7:] for line in sock.recv(4096).decode().split("\n") if line.startswith("STATUS=")]
    except BlockingIOError:
        return found
    finally:
        sock.settimeout(2)


def test_status_stops_counting_a_ready_worker_in_the_tick_that_reaps_it(systemd):
    address, sock = systemd
    probe = FakeProbe()
    probe.live_at = 1.0
    # The gateway's document, fetched before the death: it still calls the worker ready.
    probe.status = {"workers": [{"index": 0, "pid": 4242, "state": "ready"}], "models": {}}
    with closing(ServiceNotifier(SdNotify(address), watchdog_timeout_s=None, probe=probe)) as n:
        n.tick(1.0, reload_pending=False, workers_total=1, restarts={}, worker_pids={4242})
        assert statuses(sock) == ["1/1 workers ready; restarts: none; 0 requests queued"]

        n.tick(1.01, reload_pending=False, workers_total=1, restarts={"SIGKILL": 1}, worker_pids=set())

        assert statuses(sock) == ["0/1 workers ready; restarts: SIGKILL=1; 0 requests queued"]


def test_a_started_or_reaped_worker_makes_the_probe_fetch_the_status_at_once(gateway):
    probe = GatewayProbe(gateway.server_address, interval_s=60.0, timeout_s=2.0)
    n = ServiceNotifier(Recorder(), watchdog_timeout_s=None, probe=probe)
    n.start()  # the probe thread: one round now, the next in 60 s unless woken
    try:
        poll_for(lambda: gateway.count("/admin/status") == 1, 5, what="the first round")

        n.worker_changed()

        poll_for(lambda: gateway.count("/admin/status") == 2, 2, what="the status fetched again at once")
    finally:
        n.close()


def test_a_readiness_change_fetches_the_status_in_the_same_round(gateway):
    probe = GatewayProbe(gateway.server_address, timeout_s=2.0)
    gateway.answers["/v2/health/ready"] = (503, {})
    probe.probe_once()
    probe.probe_once()  # within STATUS_INTERVAL_S: no second fetch
    assert gateway.count("/admin/status") == 1

    gateway.answers["/v2/health/ready"] = (200, {})
    probe.probe_once()

    assert probe.ready and gateway.count("/admin/status") == 2
