"""Scale out: several workers in one stack, and several stacks behind a real HAProxy."""
from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from tests.support.stack import Stack, free_port, poll_for

pytestmark = pytest.mark.integration

HAPROXY_CFG = Path(__file__).resolve().parents[2] / "deploy" / "haproxy" / "haproxy.cfg"


class Load:
    """Clients sending mlp requests in a loop until stopped; every answer is kept."""

    def __init__(self, url: str, demo_repo: Path, clients: int) -> None:
        self.url, self.clients = url, clients
        rng = np.random.default_rng(17)
        self.inputs = [rng.standard_normal((1, 512)).astype(np.float32) for _ in range(8)]
        session = ort.InferenceSession(str(demo_repo / "mlp/1/model.onnx"), providers=["CPUExecutionProvider"])
        self.expected = [session.run(None, {"x": x})[0] for x in self.inputs]
        self.outcomes: list[tuple[int, int, str]] = []
        self.stop = asyncio.Event()

    async def client(self, http: httpx.AsyncClient, c: int) -> None:
        k = c
        while not self.stop.is_set():
            i = k % len(self.inputs)
            body = {"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32",
                                "data": self.inputs[i].ravel().tolist()}]}
            r = await http.post("/v2/models/mlp/infer", json=body)
            self.outcomes.append((i, r.status_code, r.text))
            k += 1

    async def run(self, chaos) -> None:
        limits = httpx.Limits(max_connections=self.clients)
        async with httpx.AsyncClient(base_url=self.url, timeout=60, limits=limits) as http:
            clients = [asyncio.create_task(self.client(http, c)) for c in range(self.clients)]
            try:
                await chaos()
            finally:
                self.stop.set()
                await asyncio.gather(*clients)

    def wait_for_more(self, count: int, timeout_s: float = 30) -> None:
        target = len(self.outcomes) + count
        poll_for(lambda: len(self.outcomes) >= target, timeout_s, what=f"{count} more answers")

    def check_all_correct(self) -> None:
        assert self.outcomes
        for i, status, text in self.outcomes:
            assert status == 200, (status, text)
            out = httpx.Response(200, text=text).json()["outputs"][0]
            np.testing.assert_allclose(np.asarray(out["data"], np.float32).reshape(1, 10), self.expected[i], atol=1e-5)


def test_two_workers_one_killed_repeatedly_clients_see_no_503(start_stack, demo_repo: Path) -> None:
    stack = start_stack(demo_repo, "--workers", "2")
    poll_for(lambda: all(w["state"] == "ready" for w in stack.status()["workers"]), 30, what="both workers")
    load = Load(stack.url, demo_repo, clients=16)

    async def chaos() -> None:
        for _ in range(3):
            await asyncio.to_thread(load.wait_for_more, 100)
            pid = await asyncio.to_thread(stack.worker_pid, 0)
            os.kill(pid, signal.SIGKILL)
            await asyncio.to_thread(poll_for, lambda: any(
                w["index"] == 0 and w["pid"] != pid and w["state"] == "ready" for w in stack.status()["workers"]),
                10, 0.02, "worker 0 to be back")
        await asyncio.to_thread(load.wait_for_more, 100)

    asyncio.run(load.run(chaos))
    load.check_all_correct()
    workers = {w["index"]: w for w in stack.status()["workers"]}
    assert workers[0]["restarts"] == {"SIGKILL": 3}
    assert workers[1]["restarts"] == {}


@pytest.mark.skipif(shutil.which("haproxy") is None,
                    reason="haproxy is not installed (.ci/run installs Debian's package)")
def test_haproxy_keeps_clients_whole_through_worker_kills_and_a_drain(demo_repo: Path, tmp_path: Path) -> None:
    a, b = Stack(demo_repo), Stack(demo_repo)
    frontend = free_port()
    haproxy = None
    try:
        a.start()
        b.start()
        env = {**os.environ, "RINGSERVE_FRONTEND": f"127.0.0.1:{frontend}",
               "RINGSERVE_NODE1": f"127.0.0.1:{a.port}", "RINGSERVE_NODE2": f"127.0.0.1:{b.port}"}
        haproxy = subprocess.Popen(["haproxy", "-db", "-f", str(HAPROXY_CFG)], env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{frontend}"
        poll_for(lambda: _ready(url), 15, 0.05, "haproxy to route")
        load = Load(url, demo_repo, clients=16)
        served_by_a: list[float] = []

        async def chaos() -> None:
            for _ in range(3):
                await asyncio.to_thread(load.wait_for_more, 100)
                pid = await asyncio.to_thread(a.worker_pid)
                os.kill(pid, signal.SIGKILL)
                await asyncio.to_thread(poll_for, lambda: a.status()["ready"] and a.worker_pid() != pid, 10,
                                        0.02, "node 1's worker to be back")
            await asyncio.to_thread(load.wait_for_more, 100)
            served_by_a.append(await asyncio.to_thread(a.metric, "ringserve_requests_total", model="mlp", code="200"))
            assert await asyncio.to_thread(a.stop, signal.SIGTERM) == 0  # drain node 1 under load
            await asyncio.to_thread(load.wait_for_more, 200)

        asyncio.run(load.run(chaos))
        load.check_all_correct()
        assert served_by_a[0] > 0  # node 1 really served part of the load before it drained
    finally:
        if haproxy is not None:
            haproxy.terminate()
            haproxy.wait(10)
        for stack in (a, b):
            try:
                stack.stop()
            finally:
                stack.kill_everything()
        a.assert_nothing_left()
        b.assert_nothing_left()


def _ready(url: str) -> bool:
    try:
        return httpx.get(url + "/v2/health/ready", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def test_hot_standby_takes_over_when_the_active_worker_is_killed(start_stack, demo_repo: Path) -> None:
    stack = start_stack(demo_repo, "--workers", "1", "--standby-workers", "1")

    def roles() -> dict[str, tuple[int, int]]:
        return {w["role"]: (w["index"], w["pid"]) for w in stack.status()["workers"] if w["state"] == "ready"}

    poll_for(lambda: set(roles()) == {"active", "standby"}, 30, what="one active worker and one standby")
    load = Load(stack.url, demo_repo, clients=16)
    killed: list[int] = []

    async def chaos() -> None:
        for _ in range(3):
            await asyncio.to_thread(load.wait_for_more, 100)
            active_index, active_pid = (await asyncio.to_thread(roles))["active"]
            os.kill(active_pid, signal.SIGKILL)
            killed.append(active_index)
            # Until the gateway hears of the death, its status still shows the killed worker ready: every
            # check below must see a state the kill produced, or the next kill can land before the
            # killed worker's replacement is ready (and both are down).
            await asyncio.to_thread(poll_for, lambda: roles().get("active", (None, active_pid))[1] != active_pid,
                                    10, 0.005, "the standby promoted in place of the killed worker")
            before = stack.metric("ringserve_batch_size_count", model="mlp")
            # The standby serves the next batches, before the killed worker is even restarted.
            await asyncio.to_thread(poll_for, lambda: stack.metric("ringserve_batch_size_count", model="mlp") > before,
                                    10, 0.005, "a batch after the kill")
            await asyncio.to_thread(
                poll_for, lambda: set(roles()) == {"active", "standby"}
                and active_pid not in {pid for _, pid in roles().values()}, 10, 0.02,
                "a new standby behind the new active worker")
        await asyncio.to_thread(load.wait_for_more, 100)

    asyncio.run(load.run(chaos))
    load.check_all_correct()  # not one 503: the spare took over each time
    restarts = {w["index"]: w["restarts"] for w in stack.status()["workers"]}
    assert sum(r.get("SIGKILL", 0) for r in restarts.values()) == 3
    assert len(set(killed)) == 2  # the roles swapped: each kill hit whichever worker was active
