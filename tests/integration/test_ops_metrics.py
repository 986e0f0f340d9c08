"""Metrics an operator expects, in a real scrape of a real stack (2 gateways, 2 workers, --metrics-port):
build info, every process once with the right numbers, the version label, and the metrics port
serving /metrics and nothing else."""
from __future__ import annotations

import platform
import shutil
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import onnxruntime
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from ringserve.common.exits import EXIT_BOOT_ERROR

from tests.support.lifecycle_models import build_versioned, infer_body
from tests.support.stack import Stack, free_port, poll_for, running_stack

pytestmark = pytest.mark.integration

PROCESS_FAMILIES = ("process_cpu_seconds_total", "process_resident_memory_bytes", "process_virtual_memory_bytes",
                    "process_start_time_seconds", "process_open_fds", "process_max_fds")


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory, demo_repo: Path) -> Path:
    repo = tmp_path_factory.mktemp("opsmetrics")
    shutil.copytree(demo_repo / "mlp", repo / "mlp")
    build_versioned(repo, "multi", (1, 2), version_policy={"latest": {"num_versions": 2}}, weight_bytes=64)
    return repo


@pytest.fixture(scope="module")
def metrics_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def stack(repo: Path, metrics_port: int):
    # (two workers in all, each with every model: --lanes shared; with lanes each model would have two)
    with running_stack(repo, "--gateways", "2", "--workers", "2", "--lanes", "shared",
                       "--metrics-port", str(metrics_port)) as s:
        # Both gateways know both workers (a scrape lists the workers the answering one knows, and the
        # status's worker states are the answering gateway's own): seen from each gateway in turn.
        knowing: set[int] = set()

        def both_gateways_know_both_workers() -> bool:
            status = s.status()
            if all(g["state"] == "up" for g in status["gateways"]) and \
                    len([w for w in status["workers"] if w["state"] == "ready" and w["pid"]]) == 2:
                knowing.add(status["answered_by"])
            return knowing == {0, 1}

        poll_for(both_gateways_know_both_workers, 60, what="both gateways up, each with both workers ready")
        yield s


def samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples]


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_build_info_names_the_onnxruntime_and_python_the_server_runs(stack):
    found = [(labels, value) for name, labels, value in samples(stack.get("/metrics")[1])
             if name == "ringserve_build_info"]
    assert len(found) == 1, found  # written once, not once per gateway
    labels, value = found[0]
    assert value == 1
    assert labels["onnxruntime"] == onnxruntime.__version__ and labels["python"] == platform.python_version()
    assert labels["version"] and labels["version"] != "unknown"


def test_every_process_of_the_server_is_in_each_scrape_once_with_its_own_numbers(stack):
    status = stack.status()
    pids = {("supervisor", "0"): stack.pid}
    pids |= {("gateway", str(g["index"])): g["pid"] for g in status["gateways"]}
    pids |= {("worker", str(w["index"])): w["pid"] for w in status["workers"]}
    assert len(pids) == 5
    # The kernel deals scrapes among the gateways: each answer must be whole, whichever one it is.
    for _ in range(6):
        found = samples(stack.get("/metrics")[1])
        for family in PROCESS_FAMILIES:
            series = [(labels["role"], labels["index"]) for name, labels, _ in found if name == family]
            assert sorted(series) == sorted(pids), family  # each process once: never summed over the gateways
        started = {(labels["role"], labels["index"]): value for name, labels, value in found
                   if name == "process_start_time_seconds"}
        # Each series is its process's own (a pid's start time, to /proc's 10 ms clock ticks).
        assert started == pytest.approx({k: psutil.Process(pid).create_time() for k, pid in pids.items()}, abs=0.02)


def test_two_versions_of_one_model_are_counted_apart(stack):
    for path, times in (("/v2/models/multi/versions/1/infer", 2), ("/v2/models/multi/infer", 3)):
        for _ in range(times):
            assert stack.post(path, infer_body())[0] == 200
    assert stack.post("/v2/models/multi/versions/7/infer", infer_body())[0] == 404

    assert stack.metric("ringserve_requests_total", model="multi", version="1", code="200") == 2
    assert stack.metric("ringserve_requests_total", model="multi", version="2", code="200") == 3
    assert stack.metric("ringserve_request_seconds_count", model="multi", version="1") == 2
    assert stack.metric("ringserve_request_seconds_count", model="multi", version="2") == 3
    assert stack.metric("ringserve_batch_size_count", model="multi", version="1") >= 1
    assert stack.metric("ringserve_requests_total", model="_unknown", version="", code="404") == 1
    stats = stack.get("/v2/models/multi/versions/1/stats")[1]["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] == 2 and stats["inference_stats"]["queue"]["count"] == 2


def test_the_metrics_port_serves_the_merged_metrics_and_nothing_else(stack, metrics_port):
    url = f"http://127.0.0.1:{metrics_port}"
    status, text = get(url + "/metrics")
    assert status == 200
    names = {name for name, _, _ in samples(text)}
    assert {"ringserve_build_info", "ringserve_gateways_up", "process_resident_memory_bytes"} <= names
    assert [v for name, _, v in samples(text) if name == "ringserve_gateways_up"] == [2]
    for path in ("/v2/health/ready", "/v2/models/mlp", "/admin/status", "/openapi.json"):
        status, body = get(url + path)
        assert status == 404 and "serves /metrics only" in body, (path, status, body)
    request = urllib.request.Request(url + "/v2/models/mlp/infer", data=b"{}", method="POST")
    try:
        urllib.request.urlopen(request, timeout=30)
        raise AssertionError("the metrics port answered an inference")
    except urllib.error.HTTPError as exc:
        assert exc.code == 404


def test_a_metrics_port_in_use_stops_the_start_before_anything_is_made(repo: Path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        stack = Stack(repo, "--metrics-port", str(port))
        stack.start(wait_ready=False)
        try:
            code = stack.process.wait(60)
        finally:
            stack.kill_everything()
        stack.assert_nothing_left()
    assert code == EXIT_BOOT_ERROR


def test_metrics_port_equal_to_the_http_port_is_refused(repo: Path):
    port = free_port()
    result = subprocess.run([sys.executable, "-P", "-m", "ringserve.cli", "serve", "--model-repository", str(repo),
                             "--port", str(port), "--metrics-port", str(port)], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode != 0 and "--metrics-port" in result.stderr, result.stderr


KEY = "opsmetrics-key"


class KeyedStack(Stack):
    """Every route needs the key (--api-key-everywhere): readiness is polled with it."""

    def is_ready(self) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(f"ringserve exited with {self.process.returncode} before it was ready")
        request = urllib.request.Request(self.url + "/v2/health/ready", headers={"Authorization": f"Bearer {KEY}"})
        try:
            with urllib.request.urlopen(request, timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False


def test_with_reuse_port_each_gateway_serves_the_metrics_port_and_the_key_is_asked_everywhere(repo: Path):
    port = free_port()
    with running_stack(repo, "--gateways", "2", "--reuse-port", "--metrics-port", str(port), "--api-key-everywhere",
                       env={"RINGSERVE_API_KEY": KEY}, stack_class=KeyedStack):
        url = f"http://127.0.0.1:{port}"
        assert get(url + "/metrics")[0] == 401
        keyed = urllib.request.Request(url + "/metrics", headers={"Authorization": f"Bearer {KEY}"})
        for _ in range(4):  # (the kernel deals the connections among the gateways' sockets)
            with urllib.request.urlopen(keyed, timeout=30) as answer:
                text = answer.read().decode()
            assert [v for name, _, v in samples(text) if name == "ringserve_build_info"] == [1]
        assert get(url + "/admin/status")[0] == 404
