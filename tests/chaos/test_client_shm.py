"""A client that truncates and restores its own registered segment in a loop, while its requests read
from it and write into it, must kill nothing: real processes (`--gateways 2`, `--allow-client-shm`),
real shared memory, the attack as any local user could run it with the standard library.

A read through a mapping of a truncated segment is SIGBUS; on the code that mapped client segments,
this loop killed a gateway within seconds, and five quick deaths stopped the whole server. Now each
of the attacker's requests gets 200 or a 400 that says the segment shrank, and a bystander on plain
requests meanwhile gets every answer, right.
"""
from __future__ import annotations

import os
import secrets
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from ringserve.common.repository.demo import MLP_IN, MLP_OUT

from ..integration.test_gateways import GATEWAYS, gateway_pids, gateway_ready
from ..integration.test_gateways import gateway_client, runtime_dir  # noqa: F401 (a fixture)
from tests.support.stack import poll_for

pytestmark = pytest.mark.chaos

ATTACK_S = 60.0  # a minute of attack: one test, in the default suite
ROWS = 64  # the attacker's tensor: 128 KiB, so that each copy of it takes a while to race against
IN_BYTES, OUT_BYTES = ROWS * MLP_IN * 4, ROWS * MLP_OUT * 4
IN_OFFSET = 4096  # both regions past the first page: truncating to 0 leaves none of them
OUT_OFFSET = IN_OFFSET + IN_BYTES
SEGMENT_BYTES = OUT_OFFSET + OUT_BYTES


class Clients:
    """Threads sending requests until told to stop, each recording what it got."""

    def __init__(self) -> None:
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.lock = threading.Lock()
        self.outcomes: dict[str, list] = {}

    def run(self, name: str, connect: Callable[[], httpx.Client], send: Callable[[httpx.Client, int], object],
                  reconnect_every: int = 0) -> None:
        def loop() -> None:
            got: list = []
            http = connect()
            try:
                n = 0
                while not self.stop.is_set():
                    if reconnect_every and n and n % reconnect_every == 0:  # (TCP: the kernel picks a gateway)
                        http.close()
                        http = connect()
                    try:
                        got.append(send(http, n))
                    except httpx.HTTPError as exc:  # a dropped connection, a timeout
                        got.append(exc)
                        http.close()
                        http = connect()
                    n += 1
            finally:
                http.close()
                with self.lock:
                    self.outcomes[name] = got
        thread = threading.Thread(target=loop, name=name, daemon=True)
        self.threads.append(thread)
        thread.start()

    def finish(self) -> dict[str, list]:
        self.stop.set()
        for thread in self.threads:
            thread.join(120)
        assert not any(t.is_alive() for t in self.threads)
        return self.outcomes


def truncate_and_restore(fd: int, stop: threading.Event) -> int:
    """The attack: the segment alternates between 0 bytes and its full size, 1 ms each."""
    rounds = 0
    while not stop.is_set():
        os.ftruncate(fd, 0)
        time.sleep(0.001)
        os.ftruncate(fd, SEGMENT_BYTES)
        time.sleep(0.001)
        rounds += 1
    return rounds


def attacker_request(http: httpx.Client, n: int) -> tuple[int, str]:
    body = {"inputs": [{"name": "x", "shape": [ROWS, MLP_IN], "datatype": "FP32", "parameters": {
                "shared_memory_region": "bus-in", "shared_memory_byte_size": IN_BYTES}}],
            "outputs": [{"name": "y", "parameters": {"shared_memory_region": "bus-out",
                                                     "shared_memory_byte_size": OUT_BYTES}}]}
    answer = http.post("/v2/models/mlp/infer", json=body)
    return answer.status_code, answer.text


def test_a_client_truncating_its_segment_in_a_loop_kills_no_gateway_and_a_bystander_loses_nothing(
        start_stack, demo_repo: Path, runtime_dir: str) -> None:  # noqa: F811
    stack = start_stack(demo_repo, "--gateways", str(GATEWAYS), "--runtime-dir", runtime_dir, "--allow-client-shm")
    poll_for(lambda: all(gateway_ready(runtime_dir, k) for k in range(GATEWAYS)), 30, what="every gateway ready")
    pids = gateway_pids(stack)
    session = ort.InferenceSession(str(demo_repo / "mlp/1/model.onnx"), providers=["CPUExecutionProvider"])
    key = f"/rs-test-shmx-bus-{secrets.token_hex(4)}"
    fd = os.open("/dev/shm" + key, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    clients = Clients()
    try:
        os.ftruncate(fd, SEGMENT_BYTES)
        os.pwrite(fd, np.ones((ROWS, MLP_IN), np.float32).tobytes(), IN_OFFSET)
        with httpx.Client(base_url=stack.url, timeout=30) as http:
            for name, offset, size in (("bus-in", IN_OFFSET, IN_BYTES), ("bus-out", OUT_OFFSET, OUT_BYTES)):
                answer = http.post(f"/v2/systemsharedmemory/region/{name}/register",
                                   json={"key": key, "offset": offset, "byte_size": size})
                assert answer.status_code == 200, answer.text  # (at one gateway: it reaches both)

        def tcp() -> httpx.Client:
            return httpx.Client(base_url=stack.url, timeout=30)

        def bystander(seed: int) -> Callable[[httpx.Client, int], object]:
            rng = np.random.default_rng(seed)

            def send(http: httpx.Client, n: int) -> tuple[int, bool]:
                x = rng.standard_normal((2, MLP_IN)).astype(np.float32)
                answer = http.post("/v2/models/mlp/infer", json={"inputs": [
                    {"name": "x", "shape": [2, MLP_IN], "datatype": "FP32", "data": x.ravel().tolist()}]})
                if answer.status_code != 200:
                    return answer.status_code, False
                y = np.asarray(answer.json()["outputs"][0]["data"], np.float32).reshape(2, MLP_OUT)
                return 200, bool(np.allclose(y, session.run(None, {"x": x})[0], rtol=0, atol=1e-5))
            return send

        stop = threading.Event()
        rounds: list[int] = []
        attack = threading.Thread(target=lambda: rounds.append(truncate_and_restore(fd, stop)), daemon=True)
        attack.start()
        # Attackers on each gateway's own socket and over TCP (new connections: either gateway);
        # bystanders the same way, so that each gateway serves both kinds all along.
        for k in range(GATEWAYS):
            clients.run(f"attacker-g{k}", lambda k=k: gateway_client(runtime_dir, k), attacker_request)
            clients.run(f"bystander-g{k}", lambda k=k: gateway_client(runtime_dir, k), bystander(k))
        clients.run("attacker-tcp", tcp, attacker_request, reconnect_every=10)
        clients.run("bystander-tcp", tcp, bystander(9), reconnect_every=10)
        time.sleep(ATTACK_S)
        outcomes = clients.finish()
        stop.set()
        attack.join(10)
    finally:
        clients.stop.set()
        os.close(fd)
        os.unlink("/dev/shm" + key)

    attacked = [o for name, got in outcomes.items() if name.startswith("attacker") for o in got]
    served = [o for name, got in outcomes.items() if name.startswith("bystander") for o in got]
    dropped = [o for o in attacked + served if isinstance(o, Exception)]
    assert not dropped, f"{len(dropped)} requests got no answer, e.g. {dropped[:3]!r}"
    assert rounds and rounds[0] > 1000  # (the segment really did shrink and grow all along)
    # The attacker's requests: each a 200, or a 400 saying what its segment did.
    assert {code for code, _ in attacked} <= {200, 400}, sorted({code for code, _ in attacked})
    refusals = [text for code, text in attacked if code == 400]
    assert refusals and all("shared memory region 'bus-" in text for text in refusals), refusals[:3]
    assert any("it was truncated while the request waited" in text for text in refusals), refusals[:3]
    # The bystanders: every request answered 200 with ONNX Runtime's numbers.
    assert len(served) >= 100 and all(answer == (200, True) for answer in served), \
        [a for a in served if a != (200, True)][:5]
    # No gateway died: the same processes, no restart counted.
    assert gateway_pids(stack) == pids
    assert all(g["restarts_total"] == 0 for g in stack.status()["gateways"])
    assert stack.process.poll() is None
