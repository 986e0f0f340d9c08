"""The CPU image, run for real with a Docker engine (tests/container/run.sh builds it and sets RINGSERVE_IMAGE).

Each test starts its own container from the image with the image's defaults (Docker's 64 MiB /dev/shm, the
image's entry point and flags), talks to it over published ports with real HTTP and gRPC clients, and
removes it. Answers are checked against ONNX Runtime run here on the model copied out of the image."""
from __future__ import annotations

import concurrent.futures
import json
import os
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator

import httpx
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient

from tests.support.stack import poll_for

IMAGE = os.environ.get("RINGSERVE_IMAGE", "")
pytestmark = pytest.mark.skipif(not IMAGE, reason="RINGSERVE_IMAGE unset: tests/container/run.sh builds the image")
SIZE_LIMIT_MB = 450  # issue 43: the CPU image was 750 MB, 284 of them CUDA libraries it never loads


def docker(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check, timeout=timeout)


class Container:
    def __init__(self, *run_args: str) -> None:
        self.name = f"ringserve-test-{uuid.uuid4().hex[:8]}"
        self.started = time.monotonic()
        docker("run", "-d", "--name", self.name, "-p", "127.0.0.1::8000", "-p", "127.0.0.1::8001", *run_args, IMAGE)

    def port(self, inside: int) -> int:
        return int(docker("port", self.name, f"{inside}/tcp").stdout.split()[0].rsplit(":", 1)[1])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port(8000)}"

    def state(self) -> dict:
        return json.loads(docker("inspect", "-f", "{{json .State}}", self.name).stdout)

    def logs(self) -> str:
        done = docker("logs", self.name, check=False)
        return done.stdout + done.stderr

    def ready(self, timeout: float = 120) -> float:
        """Seconds from `docker run` to /v2/health/ready answering 200."""

        def is_ready() -> bool:
            assert self.state()["Running"], f"the container stopped:\n{self.logs()}"
            try:
                return httpx.get(f"{self.url}/v2/health/ready", timeout=2).status_code == 200
            except httpx.HTTPError:
                return False

        poll_for(is_ready, timeout=timeout, interval=0.2, what="the container to be ready")
        return time.monotonic() - self.started

    def exec(self, *command: str) -> str:
        return docker("exec", self.name, *command).stdout

    def remove(self) -> None:
        docker("rm", "-f", self.name, check=False)


@pytest.fixture
def start() -> Iterator[Callable[..., Container]]:
    started: list[Container] = []

    def run(*args: str) -> Container:
        started.append(Container(*args))
        return started[-1]

    yield run
    for container in started:
        container.remove()


@pytest.fixture(scope="module")
def mlp(tmp_path_factory: pytest.TempPathFactory) -> ort.InferenceSession:
    """The image's own demo mlp, copied out of it, run here."""
    out = tmp_path_factory.mktemp("image-models")
    name = f"ringserve-copy-{uuid.uuid4().hex[:8]}"
    docker("create", "--name", name, IMAGE)
    try:
        docker("cp", f"{name}:/models/mlp/1/model.onnx", str(out / "mlp.onnx"))
    finally:
        docker("rm", "-f", name, check=False)
    return ort.InferenceSession(str(out / "mlp.onnx"), providers=["CPUExecutionProvider"])


def infer_http(url: str, x: np.ndarray) -> np.ndarray:
    body = {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    answer = httpx.post(f"{url}/v2/models/mlp/infer", json=body, timeout=30)
    assert answer.status_code == 200, answer.text
    (output,) = answer.json()["outputs"]
    return np.asarray(output["data"], np.float32).reshape(output["shape"])


def test_the_image_is_small_enough_and_has_ps_pgrep_and_kill():
    size_mb = int(docker("image", "inspect", "-f", "{{.Size}}", IMAGE).stdout) / 1e6
    print(f"\nimage {IMAGE}: {size_mb:.0f} MB")
    assert size_mb <= SIZE_LIMIT_MB
    command = "ls /usr/bin/ps /usr/bin/pgrep /usr/bin/kill"
    found = docker("run", "--rm", "--entrypoint", "sh", IMAGE, "-c", command, check=False)
    assert found.returncode == 0, found.stderr  # (sh's builtin kill signals pids too, but not by name: pkill)


def test_with_dockers_default_64_mib_shm_it_serves_http_and_grpc_with_onnx_runtimes_answers(start, mlp):
    container = start()
    seconds = container.ready()
    print(f"\nstart to ready: {seconds:.1f} s")
    x = np.random.default_rng(0).standard_normal((3, 512)).astype(np.float32)
    expected = mlp.run(None, {"x": x})[0]
    np.testing.assert_allclose(infer_http(container.url, x), expected, rtol=1e-5, atol=1e-6)
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{container.port(8001)}")
    tensor = grpcclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    np.testing.assert_allclose(client.infer("mlp", [tensor]).as_numpy("y"), expected, rtol=1e-5, atol=1e-6)
    client.close()
    logs = container.logs()
    assert "the ring of the 1 gateway cut from 8 slots" in logs  # fitted to 64 MiB, and said so
    assert "\x1b[" not in logs, "an ANSI escape in the logs"  # (ONNX Runtime's telemetry warning was one)


def test_a_worker_killed_inside_the_container_under_load_loses_no_request(start, mlp):
    container = start()
    container.ready()
    url = container.url
    xs = [np.random.default_rng(i).standard_normal((2, 512)).astype(np.float32) for i in range(400)]
    pid = json.loads(container.exec("ringserve", "status", "--json"))["workers"][0]["pid"]

    def send(i: int) -> np.ndarray:
        return infer_http(url, xs[i])

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = [pool.submit(send, i) for i in range(len(xs))]
        poll_for(lambda: sum(a.done() for a in answers) >= 50, timeout=60, what="50 answers before the kill")
        container.exec("kill", "-KILL", str(pid))
        results = [a.result() for a in answers]  # infer_http asserts each is a 200
    for x, y in zip(xs, results):
        np.testing.assert_allclose(y, mlp.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
    status = json.loads(container.exec("ringserve", "status", "--json"))
    assert status["workers"][0]["pid"] != pid and status["workers"][0]["restarts"].get("SIGKILL") == 1
    assert pid not in [int(p) for p in container.exec("pgrep", "-f", "ringserve").split()]


def test_docker_stop_drains_and_the_container_exits_0_within_the_stop_timeout(start):
    container = start()
    container.ready()
    began = time.monotonic()
    docker("stop", "-t", "40", container.name, timeout=60)
    elapsed = time.monotonic() - began
    print(f"\ndocker stop took {elapsed:.1f} s")
    assert container.state()["ExitCode"] == 0, container.logs()
    assert elapsed < 40


def test_read_only_without_a_tmpfs_names_tmp_and_runtime_dir_and_with_one_it_serves(start, mlp):
    bare = start("--read-only")
    poll_for(lambda: not bare.state()["Running"], timeout=60, what="the read-only container to stop")
    logs = bare.logs()
    assert bare.state()["ExitCode"] == 6, logs  # common/exits.py: EXIT_BAD_RUNTIME_DIR
    assert "--tmpfs /tmp" in logs and "--runtime-dir" in logs and "cannot listen" not in logs

    with_tmpfs = start("--read-only", "--tmpfs", "/tmp")
    with_tmpfs.ready()
    x = np.ones((1, 512), np.float32)
    np.testing.assert_allclose(infer_http(with_tmpfs.url, x), mlp.run(None, {"x": x})[0], rtol=1e-5, atol=1e-6)
