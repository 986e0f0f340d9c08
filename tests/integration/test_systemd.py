"""ringserve as systemd runs it, against the real stack: sd_notify and the watchdog, SIGHUP reload,
SIGTERM drain, socket activation and worker recycling under load; the unit files; the dashboard.

systemd itself is not needed: a bound datagram socket stands in for its notify socket, and
a shell hands the listening socket over as fd 3 with LISTEN_FDS/LISTEN_PID, as systemd does.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import psutil
import pytest

from ringserve.common.repository.demo import build_slow_model
from ringserve.worker.faults import SLOW_FAULT_S

from tests.support import rawhttp
from tests.support.stack import Stack, poll_for

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
UNITS = REPO_ROOT / "systemd"
DASHBOARD = REPO_ROOT / "deploy" / "grafana" / "ringserve.json"
FAULTS = {"RINGSERVE_FAULT_INJECTION": "1"}
WATCHDOG_TIMEOUT_S = 1.0  # the WATCHDOG_USEC the stack gets: a ping every 0.5 s
ACCEPT_MARGIN_S = 0.25  # a request sent this long before SIGTERM has surely been read by the gateway
CLIENTS = 16


# -- stand-ins for systemd and for clients ---------------------------------------------------------
class NotifySocket:
    """systemd's notify socket, played by a bound datagram socket: every message, timed on arrival."""

    def __init__(self) -> None:
        # A short path: sun_path holds 108 bytes, pytest's tmp_path can be longer.
        self.dir = tempfile.mkdtemp(prefix="rs-notify-")
        self.path = os.path.join(self.dir, "notify.sock")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.05)
        self.messages: list[tuple[float, dict[str, str]]] = []
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stopped.is_set():
            try:
                data = self.sock.recv(65536)
            except socket.timeout:
                continue
            fields = dict(line.split("=", 1) for line in data.decode().split("\n") if "=" in line)
            self.messages.append((time.monotonic(), fields))

    def times(self, key: str, after: float = 0.0) -> list[float]:
        return [t for t, fields in list(self.messages) if key in fields and t > after]

    def first(self, key: str, after: float = 0.0, timeout_s: float = 60.0) -> float:
        return poll_for(lambda: (self.times(key, after) or [None])[0], timeout_s, what=f"{key} after {after:.2f}")

    def fields(self, key: str, after: float = 0.0) -> list[dict[str, str]]:
        return [fields for t, fields in list(self.messages) if key in fields and t > after]

    def statuses(self) -> list[str]:
        return [fields["STATUS"] for fields in self.fields("STATUS")]

    def close(self) -> None:
        self._stopped.set()
        self._thread.join(5)
        self.sock.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture
def notify():
    sock = NotifySocket()
    try:
        yield sock
    finally:
        sock.close()


@dataclass
class Outcome:
    started: float
    ended: float
    status: int  # 0: no HTTP answer (connection refused or closed)
    text: str


class Load:
    """`clients` threads posting one request back to back until stopped; every outcome recorded."""

    def __init__(self, url: str, path: str, body: dict, clients: int = CLIENTS, stop_on_failure: bool = False) -> None:
        self.url, self.path, self.body = url, path, body
        self.stop_on_failure = stop_on_failure
        self.outcomes: list[Outcome] = []
        self._stopped = threading.Event()
        self._threads = [threading.Thread(target=self._client, daemon=True) for _ in range(clients)]

    def start(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def _client(self) -> None:
        with httpx.Client(base_url=self.url, timeout=60) as http:
            while not self._stopped.is_set():
                started = time.monotonic()
                try:
                    response = http.post(self.path, json=self.body)
                    status, text = response.status_code, response.text
                except httpx.HTTPError as exc:
                    status, text = 0, f"{type(exc).__name__}: {exc}"
                self.outcomes.append(Outcome(started, time.monotonic(), status, text))
                if status != 200 and self.stop_on_failure:
                    return

    def count(self, status: int = 200, after: float = 0.0, before: float = float("inf")) -> int:
        return sum(1 for o in list(self.outcomes) if o.status == status and after < o.ended < before)

    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status != 200]

    def stop(self) -> None:
        self._stopped.set()
        for thread in self._threads:
            thread.join(70)


class HealthSampler(threading.Thread):
    """Asks /v2/health/live then /v2/health/ready, back to back; records (sent at, live, ready)."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.samples: list[tuple[float, int, int]] = []
        self._stopped = threading.Event()

    def run(self) -> None:
        with httpx.Client(base_url=self.url, timeout=2) as http:
            while not self._stopped.is_set():
                sent_at = time.monotonic()
                self.samples.append((sent_at, _code(http, "/v2/health/live"), _code(http, "/v2/health/ready")))

    def stop(self) -> None:
        self._stopped.set()
        self.join(10)


def _code(http: httpx.Client, path: str) -> int:
    try:
        return http.get(path).status_code
    except httpx.HTTPError:
        return 0


# -- helpers ----------------------------------------------------------------------------------------
def mlp_body(x: np.ndarray, **parameters: str) -> dict:
    body = {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    if parameters:
        body["parameters"] = parameters
    return body


def slow_loading_repo(demo_repo: Path, target: Path) -> Path:
    """mlp alone, loading for SLOW_FAULT_S (2 s) in every worker: new generations are slow to be ready."""
    repo = target / "models"
    shutil.copytree(demo_repo / "mlp", repo / "mlp")
    config_path = repo / "mlp" / "config.json"
    config = json.loads(config_path.read_text())
    config["parameters"] = {"ringserve_fault_on_load": {"string_value": "slow"}}
    config_path.write_text(json.dumps(config))
    return repo


def expected_mlp(demo_repo: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(demo_repo / "mlp/1/model.onnx"), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def child_pid(stack: Stack, module: str) -> int:
    """The pid of the supervisor's child running `python -P -m ringserve.<module>`."""
    for child in psutil.Process(stack.pid).children():
        cmdline = child.cmdline()
        if "-m" in cmdline and cmdline[cmdline.index("-m") + 1] == f"ringserve.{module}":
            return child.pid
    raise LookupError(f"no {module} process under {stack.pid}")


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def ready_code(stack: Stack) -> int:
    try:
        return stack.get("/v2/health/ready")[0]
    except OSError:
        return 0


def stop_and_check(stack: Stack) -> int | None:
    try:
        return stack.stop()
    finally:
        stack.kill_everything()
        stack.assert_nothing_left()


# -- sd_notify and the watchdog -----------------------------------------------------------------------
def test_notify_ready_watchdog_status_and_stopping(demo_repo: Path, tmp_path: Path, notify: NotifySocket) -> None:
    stack = Stack(slow_loading_repo(demo_repo, tmp_path), env={
        **FAULTS, "NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": str(int(WATCHDOG_TIMEOUT_S * 1e6))})
    sampler = HealthSampler(stack.url)
    sampler.start()
    try:
        stack.start()
        ready_at = notify.first("READY")
        sampler.stop()
        # READY=1 when an inference can succeed, not when the gateway merely listens.
        assert stack.post("/v2/models/mlp/infer", mlp_body(np.ones((1, 512), np.float32)))[0] == 200
        listening_not_ready = [sent for sent, live, ready in sampler.samples if live == 200 and ready != 200]
        assert listening_not_ready, "never saw the gateway live before its worker was ready: nothing was tested"
        assert max(listening_not_ready) < ready_at
        assert len(notify.times("READY")) == 1

        poll_for(lambda: len(notify.times("WATCHDOG", after=ready_at)) >= 4, 10, what="periodic WATCHDOG=1")
        assert notify.statuses()[-1] == "1/1 workers ready; restarts: none; 0 requests queued"

        os.kill(stack.worker_pid(), signal.SIGKILL)
        poll_for(lambda: "0/1 workers ready; restarts: SIGKILL=1; 0 requests queued" in notify.statuses(), 15,
                 what="a STATUS= with the worker down and the SIGKILL counted")
        poll_for(lambda: notify.statuses()[-1] == "1/1 workers ready; restarts: SIGKILL=1; 0 requests queued", 30,
                 what="a STATUS= with the replacement ready")

        gateway = child_pid(stack, "gateway")
        os.kill(gateway, signal.SIGSTOP)  # a wedged gateway: the stack must get restarted
        try:
            silence_s = 3 * WATCHDOG_TIMEOUT_S
            poll_for(lambda: time.monotonic() - notify.times("WATCHDOG")[-1] > silence_s, 15,
                     what="WATCHDOG=1 to stop while the gateway cannot answer")
        finally:
            os.kill(gateway, signal.SIGCONT)
        resumed_at = time.monotonic()
        notify.first("WATCHDOG", after=resumed_at, timeout_s=10)

        term_at = time.monotonic()
        assert stack.stop() == 0
        assert notify.times("STOPPING", after=term_at)
    finally:
        sampler.stop()
        stop_and_check(stack)


def test_ready_and_status_with_an_api_key_on_every_route(demo_repo: Path, tmp_path: Path,
                                                          notify: NotifySocket) -> None:
    key_file = tmp_path / "api-key"
    key_file.write_text("s3cret\n")
    stack = Stack(demo_repo, "--api-key-file", str(key_file), "--api-key-everywhere",
                  env={"NOTIFY_SOCKET": notify.path})
    try:
        stack.start(wait_ready=False)  # the test's own readiness check has no key
        notify.first("READY", timeout_s=60)
        # (1/1, or 2/2 with a lane per demo model: supervision/lanes.py)
        poll_for(lambda: any(re.fullmatch(r"(\d)/\1 workers ready; restarts: none; 0 requests queued", s)
                             for s in notify.statuses()), 10,
                 what="a STATUS= built from /admin/status, which needs the key")
    finally:
        stop_and_check(stack)


# STATUS= is pushed on a worker's death. Before, it was built from /admin/status
# fetched every 1 s: the reap bumped the restart count at once, with the gateway's old document
# still calling the dead worker ready ("1/1 workers ready; restarts: SIGKILL=1"), and "0/1" came
# with the next fetch, 0 to 1 s later. Now the loop iteration that reaps the worker sends "0/1".
# That is a few ms when idle, and the loop must only wake on SIGCHLD and run one iteration; 0.5 s
# leaves room for a starved 2-core machine, while the old fetch missed it about half the time.
# The ordering assertions below are the exact ones: they failed the old code on every run.
STATUS_PUSHED_WITHIN_S = 0.5


def test_status_says_no_worker_is_ready_as_soon_as_the_only_one_is_killed(
        demo_repo: Path, tmp_path: Path, notify: NotifySocket) -> None:
    # Every load takes SLOW_FAULT_S: no replacement can be ready before that long after the kill.
    stack = Stack(slow_loading_repo(demo_repo, tmp_path), env={**FAULTS, "NOTIFY_SOCKET": notify.path}).start()
    try:
        all_ready = "1/1 workers ready; restarts: none; 0 requests queued"
        poll_for(lambda: notify.statuses()[-1:] == [all_ready], 10, what="STATUS= with the worker ready")
        worker = stack.worker_pid()
        killed_at = time.monotonic()
        os.kill(worker, signal.SIGKILL)
        poll_for(lambda: not psutil.pid_exists(worker), 10, 0.005, what="the supervisor to reap the worker")
        reaped_by = time.monotonic()
        poll_for(lambda: ready_code(stack) == 200 and stack.worker_pid() != worker, 30,
                 what="the replacement to serve")
        replaced = "1/1 workers ready; restarts: SIGKILL=1; 0 requests queued"
        poll_for(lambda: notify.statuses()[-1:] == [replaced], 10, what="STATUS= with the replacement ready")
    finally:
        stop_and_check(stack)
    after = [(t - killed_at, f["STATUS"]) for t, f in list(notify.messages) if "STATUS" in f and t > killed_at]
    counted = [(dt, text) for dt, text in after if "SIGKILL=1" in text]
    # The first STATUS= that knows of the death says that no worker is ready, and so does every
    # one until the replacement had time to load.
    assert counted[0][1] == "0/1 workers ready; restarts: SIGKILL=1; 0 requests queued", after
    assert [(dt, text) for dt, text in after if dt < SLOW_FAULT_S and not text.startswith("0/1 ")] == [], after
    # ... and it was pushed when the worker was reaped, not polled for.
    assert counted[0][0] < STATUS_PUSHED_WITHIN_S, (reaped_by - killed_at, after)


# -- SIGHUP: reload and zero-downtime replacement --------------------------------------------------------
def test_sighup_under_load_replaces_the_worker_and_no_request_fails(
        demo_repo: Path, tmp_path: Path, notify: NotifySocket) -> None:
    stack = Stack(slow_loading_repo(demo_repo, tmp_path), env={**FAULTS, "NOTIFY_SOCKET": notify.path}).start()
    x = np.random.default_rng(17).standard_normal((1, 512)).astype(np.float32)
    try:
        old_pid = stack.worker_pid()
        load = Load(stack.url, "/v2/models/mlp/infer", mlp_body(x)).start()
        try:
            poll_for(lambda: load.count(200) >= 50, 30, what="load to run")
            hup_at = time.monotonic()
            os.kill(stack.pid, signal.SIGHUP)
            poll_for(lambda: stack.status()["workers"][0]["pid"] != old_pid, 30, 0.01, what="the new generation")
            switched_at = time.monotonic()
            poll_for(lambda: gone(old_pid), 10, what="the old worker to exit")
            poll_for(lambda: load.count(200, after=switched_at) >= 50, 30, what="load on the new worker")
        finally:
            load.stop()
        worker = stack.status()["workers"][0]
        reloading_at = notify.first("RELOADING", after=hup_at, timeout_s=1)
        ready_again_at = notify.first("READY", after=reloading_at)
    finally:
        stop_and_check(stack)
    assert load.failures() == []
    # The old generation served while the new one loaded (2 s): the swap itself cost nothing.
    assert load.count(200, after=hup_at + 0.5, before=switched_at) >= 10
    (body,) = {o.text for o in load.outcomes}  # every answer the same, and right
    out = json.loads(body)["outputs"][0]
    np.testing.assert_allclose(np.asarray(out["data"], np.float32).reshape(out["shape"]), expected_mlp(demo_repo, x),
                               atol=1e-5)
    assert (worker["state"], worker["generation"], worker["restarts"]) == ("ready", 2, {"reload": 1})
    assert worker["pid"] != old_pid
    assert "MONOTONIC_USEC" in notify.fields("RELOADING")[0]
    assert ready_again_at >= switched_at - 0.5  # READY=1 again only once the new generation served


def test_sighup_reads_the_model_repository_again(demo_repo: Path, tmp_path: Path) -> None:
    repo = tmp_path / "models"
    shutil.copytree(demo_repo / "mlp", repo / "mlp")
    stack = Stack(repo).start()
    try:
        assert stack.get("/v2/models/encoder")[0] == 404
        shutil.copytree(demo_repo / "encoder", repo / "encoder")
        os.kill(stack.pid, signal.SIGHUP)
        poll_for(lambda: stack.get("/v2/models/encoder/ready")[0] == 200, 30, what="the added model to be served")
        ids = [[5, 6, 7, 0]]
        status, doc = stack.post("/v2/models/encoder/infer", {"inputs": [
            {"name": "input_ids", "shape": [1, 4], "datatype": "INT64", "data": ids},
            {"name": "attention_mask", "shape": [1, 4], "datatype": "INT64", "data": [[1, 1, 1, 0]]}]})
        assert status == 200, doc
        assert stack.post("/v2/models/mlp/infer", mlp_body(np.ones((1, 512), np.float32)))[0] == 200
        assert stack.status()["workers"][0]["restarts"] == {"reload": 1}
    finally:
        stop_and_check(stack)


@pytest.mark.parametrize("flag, value, reason", [
    ("--max-batches-per-worker", "40", "recycled"),
    ("--worker-memory-limit", "1MiB", "memory"),  # below any worker's RSS: replaced as soon as allowed
])
def test_worker_recycling_replaces_the_worker_without_a_failed_request(
        demo_repo: Path, flag: str, value: str, reason: str) -> None:
    stack = Stack(demo_repo, flag, value).start()
    try:
        index = next(w["index"] for w in stack.status()["workers"] if "mlp" in w["models"])  # mlp's lane
        old_pid = stack.worker_pid(index)
        load = Load(stack.url, "/v2/models/mlp/infer", mlp_body(np.ones((1, 512), np.float32)), clients=4).start()
        try:
            poll_for(lambda: stack.worker_pid(index) != old_pid, 60, what=f"a {reason} replacement")
            switched_at = time.monotonic()
            poll_for(lambda: load.count(200, after=switched_at) >= 20, 30, what="load on the new worker")
        finally:
            load.stop()
        worker = stack.status()["workers"][index]
        assert load.failures() == []
        assert set(worker["restarts"]) == {reason}  # planned, never a crash
        assert stack.metric("ringserve_worker_restarts_total", reason=reason) >= 1
        poll_for(lambda: stack.metric("ringserve_worker_memory_bytes", worker=str(index)) > 2**20, 5,
                 what="the new worker's RSS in the metrics")
        poll_for(lambda: gone(old_pid), 10, what="the old worker to exit")
    finally:
        stop_and_check(stack)


# -- SIGTERM: drain --------------------------------------------------------------------------------------
def slow_batches_repo(target: Path) -> Path:
    """`slow` alone, in batches of at most 4 rows that take a while: at a SIGTERM under load, many
    requests wait in the gateway."""
    build_slow_model(target / "slow", width=1024, layers=1024)
    config_path = target / "slow" / "config.json"
    config = json.loads(config_path.read_text())
    config.update(max_batch_size=4, dynamic_batching={"max_queue_delay_microseconds": 0})
    config_path.write_text(json.dumps(config))
    return target


def test_sigterm_under_load_answers_every_request_accepted_before_it(tmp_path: Path) -> None:
    stack = Stack(slow_batches_repo(tmp_path), "--drain-timeout-s", "30").start()
    x = np.random.default_rng(3).standard_normal((1, 1024)).astype(np.float32)
    load = Load(stack.url, "/v2/models/slow/infer", mlp_body(x), stop_on_failure=True).start()
    try:
        poll_for(lambda: load.count(200) >= CLIENTS, 60, what="a first round of answers")
        term_at = time.monotonic()
        stack.process.send_signal(signal.SIGTERM)
        poll_for(lambda: ready_code(stack) != 200, 1.0, 0.01, what="ready to go false at once")
        exit_code = stack.process.wait(60)
    finally:
        load.stop()
        stop_and_check(stack)
    assert exit_code == 0
    accepted = [o for o in load.outcomes if o.started < term_at - ACCEPT_MARGIN_S]
    assert [o for o in accepted if o.status != 200] == []
    # The drain is shown by requests sent before the signal and answered 200 after it. (The margin
    # above is only for "accepted": a request sent just before the signal may not have reached
    # the gateway yet; counting only those older than it made this flaky when batches are fast.)
    drained = [o for o in load.outcomes if o.started < term_at < o.ended and o.status == 200]
    assert len(drained) >= CLIENTS // 2, "too few requests were in flight at the signal to test the drain"
    after = [o for o in load.outcomes if o.started >= term_at - ACCEPT_MARGIN_S]
    assert {o.status for o in after} <= {200, 503, 0}, [(o.status, o.text) for o in after]


# -- socket activation ----------------------------------------------------------------------------------------
def test_gateway_serves_on_the_inherited_listening_socket(demo_repo: Path, notify: NotifySocket) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    stack = Stack(demo_repo, env={"NOTIFY_SOCKET": notify.path}, listen_socket=listener)
    try:
        stack.start()
        listener.close()  # from now on only the stack holds it, as systemd's copy would be the only other one
        assert notify.first("READY", timeout_s=10)  # the health probe found the gateway through the fd too
        assert stack.post("/v2/models/mlp/infer", mlp_body(np.ones((1, 512), np.float32)))[0] == 200
        gateway = child_pid(stack, "gateway")
        assert Path(f"/proc/{gateway}/fd/3").exists()
        # While the gateway restarts, a connection waits in the kernel's backlog instead of being refused.
        os.kill(gateway, signal.SIGKILL)
        assert stack.get("/v2/health/live") == (200, {"live": True})
        assert child_pid(stack, "gateway") != gateway
        poll_for(stack.is_ready, 30, what="the restarted stack")
        assert stack.post("/v2/models/mlp/infer", mlp_body(np.ones((1, 512), np.float32)))[0] == 200
    finally:
        listener.close()
        stop_and_check(stack)


class ConnectionLoad:
    """Clients that each open a new connection per request (Connection: close), as a fresh
    client does; every outcome is recorded: an answer, or how the connection ended."""

    def __init__(self, port: int, body: dict, clients: int = 8, timeout_s: float = 10.0) -> None:
        self.port, self.body, self.timeout_s = port, json.dumps(body).encode(), timeout_s
        self.outcomes: list[tuple[float, float, str]] = []  # (started, ended, "200" | "refused" | ...)
        self._stopped = threading.Event()
        self._threads = [threading.Thread(target=self._client, daemon=True) for _ in range(clients)]
        for thread in self._threads:
            thread.start()

    def _client(self) -> None:
        while not self._stopped.is_set():
            started = time.monotonic()
            self.outcomes.append((started, time.monotonic(), self.send_one()))

    def send_one(self) -> str:
        try:
            answer = rawhttp.request(self.port, "POST", "/v2/models/mlp/infer", self.body,
                                     {"Content-Type": "application/json", "Connection": "close"},
                                     timeout_s=self.timeout_s)
        except ConnectionRefusedError:
            return "refused"
        except ConnectionResetError:
            return "reset"
        except TimeoutError:
            return "hung"
        return "closed" if answer.status is None else str(answer.status)

    def count(self, outcome: str) -> int:
        return sum(1 for _, _, o in list(self.outcomes) if o == outcome)

    def stop(self) -> None:
        self._stopped.set()
        for thread in self._threads:
            thread.join(self.timeout_s + 5)


def test_sigterm_with_socket_activation_answers_or_refuses_every_connection_at_once(
        demo_repo: Path, notify: NotifySocket) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    stack = Stack(demo_repo, env={"NOTIFY_SOCKET": notify.path}, listen_socket=listener)
    load = None
    try:
        stack.start()
        listener.close()  # the stack's copies are the only ones left, as if systemd's socket unit stopped too
        load = ConnectionLoad(stack.port, mlp_body(np.ones((1, 512), np.float32)))
        poll_for(lambda: load.count("200") >= 20, 60, what="answers on fresh connections")
        gateway = child_pid(stack, "gateway")
        stack.process.send_signal(signal.SIGTERM)
        poll_for(lambda: gone(gateway), 30, 0.005, what="the gateway to drain and exit")
        gateway_gone_at = time.monotonic()
        # No process listens any more: a new connection is refused at once, never queued for nobody.
        late = ConnectionLoad.send_one(load)
        late_s = time.monotonic() - gateway_gone_at
        assert stack.process.wait(30) == 0
        exited_s = time.monotonic() - gateway_gone_at
    finally:
        if load is not None:
            load.stop()
        listener.close()
        stop_and_check(stack)
    assert (late, late_s < 0.5) == ("refused", True), (late, late_s)
    # Every connection got its answer, or was refused or reset, by the time the gateway was gone.
    outcomes = {o for _, _, o in load.outcomes}
    assert outcomes <= {"200", "503", "refused", "reset", "closed"}, outcomes
    assert [o for _, ended, o in load.outcomes if ended > gateway_gone_at + 0.5 and o != "refused"] == []
    # The supervisor only stops its worker then: it does not wait on a health probe.
    assert exited_s < 5.0


def test_with_socket_activation_a_connection_during_the_drain_is_refused_at_once(tmp_path: Path) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(128)
    stack = Stack(slow_batches_repo(tmp_path), "--drain-timeout-s", "30", listen_socket=listener)
    x = np.random.default_rng(5).standard_normal((1, 1024)).astype(np.float32)
    load = None
    try:
        stack.start()
        listener.close()
        load = Load(stack.url, "/v2/models/slow/infer", mlp_body(x), stop_on_failure=True).start()
        poll_for(lambda: load.count(200) >= CLIENTS, 60, what="a first round of answers")
        gateway = child_pid(stack, "gateway")
        stack.process.send_signal(signal.SIGTERM)
        # For up to one uvicorn tick (0.1 s) the gateway still answers, then it stops listening.
        client = ConnectionLoad(stack.port, {}, clients=0, timeout_s=5.0)
        tries: list[tuple[str, float]] = []

        def refused() -> bool:
            started = time.monotonic()
            tries.append((client.send_one(), time.monotonic() - started))
            return tries[-1][0] == "refused"

        poll_for(refused, 10, 0.01, what="a connection refused")
        draining = not gone(gateway)
        assert stack.process.wait(60) == 0
    finally:
        if load is not None:
            load.stop()
        listener.close()
        stop_and_check(stack)
    # Before, the gateway's inherited fd kept listening through the drain: a connection was queued,
    # unanswered, until the gateway exited and reset it.
    assert [(outcome, took_s) for outcome, took_s in tries if took_s > 0.5] == []
    assert draining, "the drain was over before the connection was tried: nothing was tested"


# -- the unit files ----------------------------------------------------------------------------------------------
def test_units_pass_systemd_analyze_verify(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (Debian/Ubuntu: apt-get install systemd); units not verified")
    # verify checks that ExecStart= exists: point it at this checkout's venv instead of /opt/ringserve.
    install_bin = Path(sys.executable).parent
    assert (install_bin / "ringserve").exists(), f"no ringserve entry point next to {sys.executable}"
    for name in ("ringserve.service", "ringserve.socket"):
        text = (UNITS / name).read_text().replace("/opt/ringserve/.venv/bin", str(install_bin))
        (tmp_path / name).write_text(text)
    result = subprocess.run([analyze, "verify", "--man=no", "ringserve.socket", "ringserve.service"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=60)
    # verify exits 0 on unknown keys and bad values too: any word about our units is a failure.
    complaints = [line for line in (result.stdout + result.stderr).splitlines() if "ringserve" in line]
    assert result.returncode == 0 and complaints == [], result.stdout + result.stderr


def test_service_unit_holds_the_lifecycle_and_hardening_lines() -> None:
    service = (UNITS / "ringserve.service").read_text()
    for line in ("Type=notify", "Restart=on-failure", "KillMode=mixed", "RuntimeDirectory=ringserve",
                 "RuntimeDirectoryMode=0700", "NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes",
                 "PrivateTmp=yes", "ExecReload=/bin/kill -HUP $MAINPID", "#DeviceAllow=/dev/nvidia0 rw"):
        assert f"\n{line}\n" in service, line
    assert re.search(r"\nUser=\w+\n", service) and re.search(r"\nLimitNOFILE=\d+\n", service)
    watchdog_s = int(re.search(r"\nWatchdogSec=(\d+)s\n", service).group(1))
    stop_s = int(re.search(r"\nTimeoutStopSec=(\d+)s\n", service).group(1))
    env = (UNITS / "ringserve.env").read_text()
    drain_s = int(re.search(r"\nRINGSERVE_DRAIN_TIMEOUT_S=(\d+)\n", env).group(1))
    assert stop_s > drain_s + 5 and watchdog_s >= 10
    assert "${RINGSERVE_DRAIN_TIMEOUT_S}" in service and "${RINGSERVE_MODEL_REPOSITORY}" in service
    assert "\nListenStream=" in (UNITS / "ringserve.socket").read_text()


# -- the Grafana dashboard ---------------------------------------------------------------------------------------
def dashboard_metrics() -> set[str]:
    doc = json.loads(DASHBOARD.read_text())
    queries = [target["expr"] for panel in doc["panels"] for target in panel.get("targets", [])]
    queries += [v["definition"] for v in doc["templating"]["list"] if "definition" in v]
    return {name for query in queries for name in re.findall(r"\bringserve_[a-z0-9_]+", query)}


def exported_metrics(scrape: str) -> set[str]:
    """Series names a Prometheus scrape of this text can hold, from its # TYPE lines."""
    names = set()
    for match in re.finditer(r"^# TYPE (\S+) (\w+)$", scrape, re.M):
        name, kind = match.groups()
        suffixes = ("_bucket", "_sum", "_count") if kind == "histogram" else ("",)
        names |= {name + suffix for suffix in suffixes}
    return names


def test_every_metric_the_dashboard_queries_is_exported(demo_repo: Path) -> None:
    stack = Stack(demo_repo).start()
    try:
        assert stack.post("/v2/models/mlp/infer", mlp_body(np.ones((1, 512), np.float32)))[0] == 200
        scrape = stack.get("/metrics")[1]
    finally:
        stop_and_check(stack)
    queried = dashboard_metrics()
    exported = exported_metrics(scrape)
    # The model budget's: a refusal counter (none here) and the peak of batches holding a version.
    assert {"ringserve_model_budget_exhausted_total", "ringserve_model_peak_references"} <= exported
    assert 'ringserve_model_peak_references{model="mlp",version="1"} 1.0' in scrape
    assert len(queried) >= 10
    assert queried - exported == set()
    for panel in ("Latency p50 / p99 (accept to answer)", "Worker memory (RSS, models included)",
                  "Restarts by reason", "Queue depth", "Requests by code"):
        assert panel in {p["title"] for p in json.loads(DASHBOARD.read_text())["panels"]}


# -- a clean stop leaves nothing for systemd to kill -------------------------------------------------------------
RESOURCE_TRACKER = "from multiprocessing.resource_tracker import main"


def test_a_clean_stop_leaves_no_process_behind_not_even_the_resource_tracker(demo_repo: Path) -> None:
    stack = Stack(demo_repo).start()
    try:
        descendants = [psutil.Process(pid) for pid in stack.remember_children()]
        (tracker,) = [p for p in descendants if RESOURCE_TRACKER in " ".join(p.cmdline())]
        assert stack.stop() == 0
        # At once, as systemd (KillMode=mixed) looks when the main process exits: whatever
        # still runs then gets SIGKILL. The supervisor must have stopped and reaped the tracker:
        # an orphan (alive, or a zombie nobody reaped) exited after it, on its EOF.
        assert not psutil.pid_exists(tracker.pid), "the resource tracker outlived the supervisor"
        assert stack.leftovers()[0] == []
    finally:
        stop_and_check(stack)
