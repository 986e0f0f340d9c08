"""Several gateway processes (`--gateways 2`) on the real stack: one server, whichever gateway answers.

Each gateway also serves HTTP on its own Unix socket (`<runtime>/gateway-<k>.http`), which
these tests use to send a request to one chosen gateway; the TCP port is shared by both.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import psutil
import pytest

from tests.support.lifecycle_models import build_versioned, infer_body
from tests.support.stack import Stack, poll_for, shm_segments
from .test_systemd import Load, gone, mlp_body, stop_and_check

pytestmark = pytest.mark.integration

GATEWAYS = 2


@pytest.fixture
def runtime_dir() -> Iterator[str]:
    """A short path: a Unix socket's path may not pass 107 bytes, and pytest's tmp_path can."""
    path = tempfile.mkdtemp(prefix="rs-gw-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def start(repo: Path, runtime_dir: str, *args: str, env: dict[str, str] | None = None) -> Stack:
    stack = Stack(repo, "--gateways", str(GATEWAYS), "--runtime-dir", runtime_dir, *args, env=env).start()
    # Ready on the shared port says one gateway serves; a gateway's own socket answers once it
    # accepts, and every gateway but the first accepts only once a worker has announced itself.
    poll_for(lambda: all(gateway_ready(runtime_dir, k) for k in range(GATEWAYS)), 30, what="every gateway ready")
    return stack


def gateway_client(runtime_dir: str, k: int) -> httpx.Client:
    """HTTP to gateway k alone, over its Unix socket."""
    return httpx.Client(transport=httpx.HTTPTransport(uds=f"{runtime_dir}/gateway-{k}.http"),
                        base_url="http://gateway", timeout=60)


def async_gateway_client(runtime_dir: str, k: int) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=f"{runtime_dir}/gateway-{k}.http"),
                             base_url="http://gateway", timeout=60)


def gateway_ready(runtime_dir: str, k: int) -> bool:
    # Connect first by hand: httpx's Unix transport leaks its socket when the connection is refused.
    with socket.socket(socket.AF_UNIX) as probe:
        try:
            probe.connect(f"{runtime_dir}/gateway-{k}.http")
        except OSError:  # not listening yet
            return False
    with gateway_client(runtime_dir, k) as http:
        return http.get("/v2/health/ready").status_code == 200


def gateway_pids(stack: Stack) -> dict[int, int]:
    """gateway index -> pid, as /admin/status tells it (from the supervisor's snapshot, each second)."""
    def known() -> dict[int, int] | None:
        pids = {g["index"]: g["pid"] for g in stack.status()["gateways"]}
        return pids if len(pids) == GATEWAYS and all(pids.values()) else None  # 0/None: not started or not answering
    return poll_for(known, 5, what="gateway pids")


def children(stack: Stack, module: str) -> set[int]:
    found = set()
    for child in psutil.Process(stack.pid).children():
        cmdline = child.cmdline()
        if "-m" in cmdline and cmdline[cmdline.index("-m") + 1] == f"ringserve.{module}":
            found.add(child.pid)
    return found


def requests_counted(scrape: str, model: str, code: str = "200") -> float:
    total = 0.0
    for line in scrape.splitlines():
        if line.startswith("ringserve_requests_total{") and f'model="{model}"' in line and f'code="{code}"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def mlp_session(demo_repo: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(demo_repo / "mlp/1/model.onnx"), providers=["CPUExecutionProvider"])


def output_of(doc: dict) -> np.ndarray:
    out = doc["outputs"][0]
    return np.asarray(out["data"], np.float32).reshape(out["shape"])


def test_two_gateways_answer_32_clients_correctly_and_one_scrape_counts_them_all(
        demo_repo: Path, runtime_dir: str) -> None:
    stack = start(demo_repo, runtime_dir)
    try:
        assert len(children(stack, "gateway")) == GATEWAYS
        assert len(shm_segments(stack.pid)) == GATEWAYS  # a ring each
        rng = np.random.default_rng(16)
        inputs = [rng.standard_normal((1 + i % 3, 512)).astype(np.float32) for i in range(32)]
        session = mlp_session(demo_repo)
        expected = [session.run(None, {"x": x})[0] for x in inputs]
        per_client = 12

        async def client(http: httpx.AsyncClient, c: int) -> list[tuple[int, int, dict]]:
            answers = []
            for k in range(per_client):
                i = (c + k) % len(inputs)
                r = await http.post("/v2/models/mlp/infer", json=mlp_body(inputs[i]))
                answers.append((i, r.status_code, r.json()))
            return answers

        async def run() -> list[tuple[int, int, dict]]:
            # 24 clients on the shared TCP port, and 4 pinned to each gateway's own socket, so that
            # both gateways surely serve some of them whatever the kernel's choice of acceptor.
            async with httpx.AsyncClient(base_url=stack.url, timeout=60,
                                         limits=httpx.Limits(max_connections=32)) as tcp, \
                    async_gateway_client(runtime_dir, 0) as g0, async_gateway_client(runtime_dir, 1) as g1:
                http = [tcp] * 24 + [g0] * 4 + [g1] * 4
                done = await asyncio.gather(*(client(http[c], c) for c in range(32)))
            return [a for answers in done for a in answers]

        answers = asyncio.run(run())
        assert len(answers) == 32 * per_client
        for i, status, doc in answers:
            assert status == 200, doc
            np.testing.assert_allclose(output_of(doc), expected[i], atol=1e-5)

        sent = len(answers)
        # Each gateway counted its own share; one scrape of either (TCP, or a gateway's own socket)
        # shows the whole server's count.
        shares = []
        for k in range(GATEWAYS):
            with gateway_client(runtime_dir, k) as http:
                shares.append(requests_counted(http.get("/metrics", params={"scope": "gateway"}).text, "mlp"))
                assert requests_counted(http.get("/metrics").text, "mlp") == sent
        assert sum(shares) == sent and all(share >= 4 * per_client for share in shares), shares
        assert stack.metric("ringserve_requests_total", model="mlp", code="200") == sent
        stats = stack.get("/v2/models/mlp/stats")[1]["model_stats"][0]
        assert stats["inference_count"] == sum(x.shape[0] for x in (inputs[i] for i, _, _ in answers))
        assert stats["inference_stats"]["success"]["count"] == sent
        status = stack.status()
        assert sorted(g["index"] for g in status["gateways"]) == list(range(GATEWAYS))
        assert stack.metric("ringserve_gateway_restarts_total") == 0
    finally:
        stop_and_check(stack)


def test_a_killed_gateway_leaves_the_other_serving_and_no_worker_restarts(demo_repo: Path, runtime_dir: str) -> None:
    stack = start(demo_repo, runtime_dir)
    x = np.random.default_rng(9).standard_normal((1, 512)).astype(np.float32)
    try:
        worker = stack.status()["workers"][0]
        before = gateway_pids(stack)
        rings_before = set(shm_segments(stack.pid))
        load = Load(stack.url, "/v2/models/mlp/infer", mlp_body(x), clients=16).start()
        try:
            poll_for(lambda: load.count(200) >= 200, 30, what="load to run")
            killed_at = time.monotonic()
            os.kill(before[1], signal.SIGKILL)
            poll_for(lambda: gone(before[1]), 5, what="gateway 1 to die")
            restarted = poll_for(lambda: (p := gateway_pids(stack)).get(1) not in (None, before[1]) and p, 30,
                                 0.02, what="gateway 1 to be restarted")
            # The new gateway 1 serves too: over its own socket, and its share of the TCP load.
            poll_for(lambda: gateway_ready(runtime_dir, 1), 30, what="the new gateway 1 to be ready")
            with gateway_client(runtime_dir, 1) as http:
                r = http.post("/v2/models/mlp/infer", json=mlp_body(x))
                assert r.status_code == 200, r.text
            back_at = time.monotonic()
            poll_for(lambda: load.count(200, after=back_at) >= 200, 30, what="load after the restart")
        finally:
            load.stop()
        status = stack.status()
        after_worker = status["workers"][0]
        assert (after_worker["pid"], after_worker["generation"], after_worker["restarts"]) == (
            worker["pid"], worker["generation"], {}), "a gateway's death restarted a worker"
        assert restarted[0] == before[0]  # gateway 0 was never touched
        assert stack.metric("ringserve_gateway_restarts_total", gateway="1", reason="SIGKILL") == 1
        assert stack.metric("ringserve_gateway_restarts_total", gateway="0") == 0
        assert stack.metric("ringserve_worker_restarts_total") == 0
        # The dead gateway's ring is gone and the new one has its own: still one per gateway.
        rings_after = set(shm_segments(stack.pid))
        assert len(rings_after) == GATEWAYS and len(rings_after - rings_before) == 1
    finally:
        stop_and_check(stack)
    # Only the connections the dead gateway held can have failed, and only as broken connections:
    # every answer that came is right, and no request was answered with an error.
    answered = [o for o in load.outcomes if o.status != 0]
    assert {o.status for o in answered} == {200}, [(o.status, o.text, o.started - killed_at)
                                                   for o in answered if o.status != 200][:5]
    broken = [o for o in load.outcomes if o.status == 0]
    assert len(broken) <= 16, [o.text for o in broken][:5]  # at most one per client: the request on the dead gateway
    assert all(o.started <= killed_at + 1.0 for o in broken), "a request failed long after the gateway died"
    # The other gateway kept serving while gateway 1 was down.
    assert load.count(200, after=killed_at, before=back_at) >= 20
    (body,) = {o.text for o in answered}
    np.testing.assert_allclose(output_of(json.loads(body)), mlp_session(demo_repo).run(None, {"x": x})[0], atol=1e-5)


def test_concurrent_first_requests_to_a_lazy_model_through_both_gateways_load_it_once(
        tmp_path: Path, runtime_dir: str) -> None:
    repo = tmp_path / "models"
    build_versioned(repo, "burst", model_load_policy="lazy", weight_bytes=1 << 20)
    stack = start(repo, runtime_dir)
    try:
        assert stack.status()["models"]["burst"]["model_state"] == "unloaded"

        async def burst() -> list[httpx.Response]:
            async with async_gateway_client(runtime_dir, 0) as g0, async_gateway_client(runtime_dir, 1) as g1:
                return await asyncio.gather(*((g0, g1)[i % 2].post("/v2/models/burst/infer",
                                                                   json=infer_body(value=float(i)))
                                              for i in range(20)))

        responses = asyncio.run(burst())
        assert [r.status_code for r in responses] == [200] * 20, [r.text for r in responses if r.status_code != 200]
        assert [r.json()["outputs"][0]["data"][0] for r in responses] == [4.0 * i + 1 for i in range(20)]
        assert stack.metric("ringserve_model_loads_total", model="burst", policy="lazy") == 1
        for k in range(GATEWAYS):  # each gateway saw the one load, as its own state
            with gateway_client(runtime_dir, k) as http:
                assert http.get("/v2/models/burst/ready").status_code == 200
    finally:
        stop_and_check(stack)


def test_sighup_and_then_sigterm_under_load_through_two_gateways_lose_nothing(
        demo_repo: Path, runtime_dir: str) -> None:
    stack = start(demo_repo, runtime_dir, "--drain-timeout-s", "30")
    x = np.random.default_rng(21).standard_normal((2, 512)).astype(np.float32)
    try:
        old = stack.status()["workers"][0]
        load = Load(stack.url, "/v2/models/mlp/infer", mlp_body(x), clients=16).start()
        try:
            poll_for(lambda: load.count(200) >= 100, 30, what="load to run")
            os.kill(stack.pid, signal.SIGHUP)
            poll_for(lambda: stack.status()["workers"][0]["pid"] != old["pid"], 30, 0.01, what="the new generation")
            poll_for(lambda: gone(old["pid"]), 10, what="the old generation to be retired by both gateways")
            switched_at = time.monotonic()
            poll_for(lambda: load.count(200, after=switched_at) >= 100, 30, what="load on the new generation")
            reload_failures = load.failures()
            term_at = time.monotonic()
            stack.process.send_signal(signal.SIGTERM)
            exit_code = stack.process.wait(60)
        finally:
            load.stop()
    finally:
        stop_and_check(stack)
    assert reload_failures == [], reload_failures[:3]
    assert exit_code == 0
    accepted = [o for o in load.outcomes if o.started < term_at - 0.25]
    assert [o for o in accepted if o.status != 200] == []
    after = [o for o in load.outcomes if o.started >= term_at - 0.25]
    assert {o.status for o in after} <= {200, 503, 0}, [(o.status, o.text) for o in after]
    (body,) = {o.text for o in load.outcomes if o.status == 200}
    np.testing.assert_allclose(output_of(json.loads(body)), mlp_session(demo_repo).run(None, {"x": x})[0], atol=1e-5)


def test_batches_from_both_gateways_waiting_together_run_as_one_execution(demo_repo: Path, runtime_dir: str) -> None:
    stack = start(demo_repo, runtime_dir)
    rng = np.random.default_rng(4)
    session = mlp_session(demo_repo)
    try:
        answers: list[tuple[np.ndarray, httpx.Response]] = []
        for attempt in range(5):  # both batches must reach the worker's sockets before it wakes
            xs = [rng.standard_normal((3 + k, 512)).astype(np.float32) for k in range(GATEWAYS)]

            def send(xs: list[np.ndarray] = xs) -> list[httpx.Response]:
                async def both() -> list[httpx.Response]:
                    async with async_gateway_client(runtime_dir, 0) as g0, \
                            async_gateway_client(runtime_dir, 1) as g1:
                        return await asyncio.gather(*(g.post("/v2/models/mlp/infer", json=mlp_body(x))
                                                      for g, x in zip((g0, g1), xs)))
                return asyncio.run(both())

            # The worker is stopped until each gateway has sent it its batch.
            responses = stack.send_while_stopped(
                send, until=lambda s: sum(w["in_flight_batches"] for w in s["workers"]) >= GATEWAYS)
            answers += zip(xs, responses)
            if stack.metric("ringserve_fused_executions_total", model="mlp") >= 1:
                break
        for x, r in answers:
            assert r.status_code == 200, r.text
            np.testing.assert_allclose(output_of(r.json()), session.run(None, {"x": x})[0], atol=1e-5)
        assert stack.metric("ringserve_fused_executions_total", model="mlp") >= 1, f"no fusion in {attempt + 1} tries"
        # ringserve_batch_size counts executions, by the rows each ran: a fused one holds both batches' rows.
        executions = stack.metric("ringserve_batch_size_count", model="mlp")
        assert executions < len(answers)
        assert stack.metric("ringserve_batch_size_sum", model="mlp") == sum(x.shape[0] for x, _ in answers)
    finally:
        stop_and_check(stack)


def test_one_gateway_by_default_on_a_machine_of_fewer_than_8_cpus(demo_repo: Path) -> None:
    if len(os.sched_getaffinity(0)) >= 8:
        pytest.skip("this machine has 8 or more CPUs: the default there is one gateway per 4")
    stack = Stack(demo_repo).start()
    try:
        assert len(children(stack, "gateway")) == 1
        # The supervisor's numbers reach /admin/status with its next snapshot (every second).
        poll_for(lambda: stack.status()["gateways"], 5, what="the gateways in /admin/status")
        assert [g["index"] for g in stack.status()["gateways"]] == [0]
    finally:
        stop_and_check(stack)


def test_a_repository_unload_and_load_through_one_gateway_hold_in_the_other(
        demo_repo: Path, tmp_path: Path, runtime_dir: str) -> None:
    repo = tmp_path / "models"
    shutil.copytree(demo_repo, repo)
    stack = start(repo, runtime_dir)
    x = np.ones((1, 512), np.float32)
    try:
        with gateway_client(runtime_dir, 0) as g0, gateway_client(runtime_dir, 1) as g1:
            assert g0.post("/v2/repository/models/mlp/unload").status_code == 200
            # Gateway 1 hears of it through the supervisor: the model is unavailable there too.
            poll_for(lambda: g1.get("/v2/models/mlp/ready").status_code == 503, 5, what="the unload in gateway 1")
            r = g1.post("/v2/models/mlp/infer", json=mlp_body(x))
            assert r.status_code == 503 and "unloaded" in r.json()["error"], r.text
            entry = next(m for m in g1.post("/v2/repository/index").json() if m["name"] == "mlp")
            assert entry["state"] == "UNAVAILABLE"

            # A load through gateway 1, with a config changed on disk, serves it again in both,
            # with the new config in both.
            config_path = repo / "mlp" / "config.json"
            config = json.loads(config_path.read_text())
            config["dynamic_batching"]["max_queue_delay_microseconds"] = 1234
            config_path.write_text(json.dumps(config))
            assert g1.post("/v2/repository/models/mlp/load").status_code == 200
            poll_for(lambda: g0.get("/v2/models/mlp/ready").status_code == 200, 5, what="the load in gateway 0")
            poll_for(lambda: g0.get("/v2/models/mlp/config").json()["dynamic_batching"]
                     ["max_queue_delay_microseconds"] == 1234, 5, what="the new config in gateway 0")
            expected = mlp_session(demo_repo).run(None, {"x": x})[0]
            for http in (g0, g1):
                r = http.post("/v2/models/mlp/infer", json=mlp_body(x))
                assert r.status_code == 200, r.text
                np.testing.assert_allclose(output_of(r.json()), expected, atol=1e-5)
    finally:
        stop_and_check(stack)
