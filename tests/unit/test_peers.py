"""gateway/cluster/peers.py and the merged endpoints: real uvicorn servers on real Unix sockets, in this process.

Each "gateway" is the real route handlers (gateway/http/routes.py: Endpoints) over a real Dispatcher
on a fake worker port, served by uvicorn on the socket `wire.gateway_http_path(runtime_dir, k)`
that gateway/__main__.py binds; a hung peer is an ASGI app that never answers.
"""
from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import os
import shutil
import socket
import stat
import tempfile
import time
from collections.abc import AsyncIterator, Iterator

import httpx
import orjson
import pytest
import uvicorn
from prometheus_client.parser import text_string_to_metric_families
from starlette.applications import Starlette

from ringserve.common import wire
from ringserve.common.repository.config import ModelConfig, TensorConfig
from ringserve.gateway.__main__ import bind_unix_socket, unlink_unix_socket
from ringserve.gateway.dispatch.dispatcher import Dispatcher
from ringserve.gateway.http.engine import UVICORN_OPTIONS
from ringserve.gateway.http.fast import GatewayHttpProtocol
from ringserve.gateway.http.limits import ConnectionLimits
from ringserve.gateway.observe.metrics import Metrics
from ringserve.gateway.cluster.peers import Peers
from ringserve.gateway.http.routes import Endpoints
from ringserve.gateway.kserve.dataplane import DataPlane
from ringserve.gateway.kserve.repository import Repository
from ringserve.gateway.observe.stats import Statistics

from .conftest import make_segment
from tests.support.gateway_fakes import FakePort, count_success, dispatch_settings

MLP = ModelConfig(name="mlp", max_batch_size=4, inputs=(TensorConfig("x", "FP32", (4,)),),
                  outputs=(TensorConfig("y", "FP32", (4,)),), dynamic_batching=None, version=1,
                  model_path="/models/mlp/1/model.onnx")


@pytest.fixture
def runtime_dir() -> Iterator[str]:
    """A short path: a Unix socket's path may not pass 107 bytes (pytest's tmp_path can)."""
    path = tempfile.mkdtemp(prefix="rs-peers-", dir="/tmp")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextlib.asynccontextmanager
async def serving(app, path: str) -> AsyncIterator[None]:
    """uvicorn serving `app` on a Unix socket at `path`, bound as gateway/__main__.py binds it."""
    sock, inode = bind_unix_socket(path)
    # The gateway's own uvicorn options and HTTP protocol (gateway/http/fast.py), on this test's event loop.
    options = {**UVICORN_OPTIONS, "loop": "asyncio", "lifespan": "off",
               "http": functools.partial(GatewayHttpProtocol, limits=ConnectionLimits())}
    server = uvicorn.Server(uvicorn.Config(app, **options, log_config=None))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.01)
    try:
        yield
    finally:
        server.should_exit = True
        await task
        unlink_unix_socket(path, inode)


class Gateway:
    """The real route handlers of gateway `index` of `count`, on a real dispatcher (fake worker port)."""

    def __init__(self, stack: contextlib.ExitStack, runtime_dir: str, index: int, count: int) -> None:
        segment = stack.enter_context(make_segment())
        self.metrics = Metrics()
        self.statistics = Statistics()
        self.dispatcher = Dispatcher(segment=segment, configs={"mlp": MLP}, runtime_dir=runtime_dir,
                                     metrics=self.metrics, settings=dispatch_settings(), statistics=self.statistics)
        self.dispatcher.attach(asyncio.get_running_loop(), FakePort())
        self.metrics.attach(self.dispatcher.snapshot)
        configs = self.dispatcher.catalog.configs
        plane = DataPlane(configs, self.dispatcher, self.metrics, self.statistics,
                          repository=Repository("", configs, self.dispatcher), peers=Peers(runtime_dir, index, count))
        self.endpoints = Endpoints(plane, 1 << 20, dispatcher=self.dispatcher)
        self.app = Starlette(routes=self.endpoints.routes())
        self.path = wire.gateway_http_path(runtime_dir, index)

    def serve_requests(self, n: int) -> None:
        """As if `n` requests had been answered here: counted as the infer path and the scheduler count them."""
        for _ in range(n):
            self.metrics.count_request("mlp", 1, 200)
        mlp = self.statistics.of("mlp", 1)
        Statistics.record_execution(mlp, n, 0, 1_000_000 * n, 0)
        for _ in range(n):
            count_success(mlp, latency_ns=2_000_000, infer_ns=1_000_000 * n)
        self.metrics.batch_size.labels("mlp", "1").observe(n)


async def get(path: str, url: str) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=path), base_url="http://gateway") as client:
        return await client.get(url)


def sample(text: str, name: str, **labels: str) -> float | None:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return s.value
    return None


def hung_app(release: asyncio.Event):
    async def app(scope, receive, send):
        await release.wait()  # never answers while the test runs
    return app


def test_metrics_stats_and_status_of_either_gateway_answer_for_both(runtime_dir: str):
    async def main() -> None:
        with contextlib.ExitStack() as stack:
            g0, g1 = Gateway(stack, runtime_dir, 0, 2), Gateway(stack, runtime_dir, 1, 2)
            g0.serve_requests(3)
            g1.serve_requests(4)
            async with serving(g0.app, g0.path), serving(g1.app, g1.path):
                for gateway in (g0, g1):  # whichever gateway answers
                    text = (await get(gateway.path, "/metrics")).text
                    assert sample(text, "ringserve_requests_total", model="mlp", version="1", code="200") == 7
                    assert sample(text, "ringserve_batch_size_count", model="mlp", version="1") == 2
                    assert sample(text, "ringserve_gateways_up") == 2

                    (stats,) = (await get(gateway.path, "/v2/models/mlp/stats")).json()["model_stats"]
                    assert stats["inference_count"] == 7 and stats["execution_count"] == 2
                    assert stats["inference_stats"]["success"]["count"] == 7

                    status = (await get(gateway.path, "/admin/status")).json()
                    assert status["slots"]["total"] == 8 and status["gateways_up"] == 2
                    assert [(g["index"], g["state"]) for g in status["gateways"]] == [(0, "up"), (1, "up")]
                    assert status["gateways"][0]["pid"] == status["gateways"][1]["pid"] == os.getpid()

                # ?scope=gateway: the gateway's own share, never merged (what peers ask each other).
                text = (await get(g1.path, "/metrics?scope=gateway")).text
                assert sample(text, "ringserve_requests_total", model="mlp", version="1", code="200") == 4
                assert sample(text, "ringserve_gateways_up") is None
                assert sample(text, "ringserve_worker_up", worker="0") is None  # server-wide: not a share
                doc = (await get(g1.path, "/v2/models/stats?scope=gateway")).json()
                assert doc["model_stats"][0]["inference_count"] == 4 and "gateways" not in doc
                for url in ("/metrics?scope=cluster", "/admin/status?scope=", "/v2/models/stats?scope=all"):
                    assert (await get(g1.path, url)).status_code == 400, url
                assert (await get(g1.path, "/v2/models/nope/stats")).status_code == 404

    asyncio.run(main())


def test_a_hung_peer_times_out_and_a_missing_one_is_named_unreachable(runtime_dir: str):
    async def main() -> None:
        release = asyncio.Event()
        with contextlib.ExitStack() as stack:
            g0 = Gateway(stack, runtime_dir, 0, 3)  # gateway 1 hangs; gateway 2 has no socket at all
            g0.serve_requests(2)
            async with serving(g0.app, g0.path), serving(hung_app(release), wire.gateway_http_path(runtime_dir, 1)):
                try:
                    started = time.monotonic()
                    text = (await get(g0.path, "/metrics")).text
                    took = time.monotonic() - started
                    stats = (await get(g0.path, "/v2/models/stats")).json()
                    status = (await get(g0.path, "/admin/status")).json()
                finally:
                    release.set()
        assert 0.4 < took < 3.0  # the peers' timeout (0.5 s), once: the peers are asked at once
        assert sample(text, "ringserve_requests_total", model="mlp", version="1", code="200") == 2
        assert sample(text, "ringserve_gateways_up") == 1
        assert [sample(text, "ringserve_gateway_up", gateway=k) for k in "012"] == [1, 0, 0]
        assert stats["model_stats"][0]["inference_count"] == 2
        assert stats["gateways"]["answered"] == [0]
        assert "no answer within 0.5 s" in stats["gateways"]["unreachable"]["1"]
        assert "no socket" in stats["gateways"]["unreachable"]["2"]
        states = [(g["index"], g["state"]) for g in status["gateways"]]
        assert states == [(0, "up"), (1, "unreachable"), (2, "unreachable")]
        assert status["gateways_up"] == 1 and "no answer" in status["gateways"][1]["error"]

    asyncio.run(main())


def test_a_dead_peers_socket_file_is_skipped_at_once(runtime_dir: str):
    """A gateway killed with SIGKILL leaves its socket file behind, with nobody listening on it."""
    async def main() -> tuple[list, float]:
        dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        dead.bind(wire.gateway_http_path(runtime_dir, 1))
        dead.close()  # the file stays
        with contextlib.ExitStack() as stack:
            g0 = Gateway(stack, runtime_dir, 0, 2)
            g0.serve_requests(5)
            async with serving(g0.app, g0.path):
                started = time.monotonic()
                answers = await Peers(runtime_dir, 0, 2).get("/metrics?scope=gateway")
                took = time.monotonic() - started
                text = (await get(g0.path, "/metrics")).text
        assert sample(text, "ringserve_requests_total", model="mlp", version="1", code="200") == 5
        assert sample(text, "ringserve_gateway_up", gateway="1") == 0
        return answers, took

    answers, took = asyncio.run(main())
    (answer,) = answers
    assert answer.gateway_index == 1 and not answer.ok and "connection refused" in answer.error
    assert took < 0.4  # refused at once, not waited for


def test_peers_never_send_the_api_key_and_read_non_200_answers_as_problems(runtime_dir: str):
    """A peer is trusted by the runtime dir's 0700, not by the key: a socket file someone else put
    there (a runtime dir whose parent they could write) must not receive it."""
    async def echo(scope, receive, send):
        auth = dict(scope["headers"]).get(b"authorization", b"")
        status = 200 if scope["query_string"] == b"scope=gateway" else 400
        body = orjson.dumps({"auth": auth.decode(), "path": scope["path"]})
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    async def main():
        async with serving(echo, wire.gateway_http_path(runtime_dir, 0)):
            own = await Peers(runtime_dir, 1, 2).get("/admin/status?scope=gateway")
            plain = await Peers(runtime_dir, 1, 2).get("/admin/status")
        return own, plain

    (own,), (plain,) = asyncio.run(main())
    assert own.ok and orjson.loads(own.body) == {"auth": "", "path": "/admin/status"}
    assert not plain.ok and plain.problem() == "answered HTTP 400" and orjson.loads(plain.body)["auth"] == ""
    assert "api_key" not in inspect.signature(Peers).parameters


def test_scope_gateway_is_refused_on_any_socket_but_the_gateways_own(runtime_dir: str):
    """The same routes on another socket (TCP, or a socket-activated Unix listener) are the server's."""
    async def main() -> None:
        with contextlib.ExitStack() as stack:
            g0 = Gateway(stack, runtime_dir, 0, 1)
            g0.serve_requests(2)
            elsewhere = os.path.join(runtime_dir, "listener.sock")
            async with serving(g0.app, g0.path), serving(g0.app, elsewhere):
                for url in ("/metrics?scope=gateway", "/admin/status?scope=gateway", "/v2/models/stats?scope=gateway",
                            "/v2/systemsharedmemory/status?scope=gateway"):
                    assert (await get(g0.path, url)).status_code == 200, url
                    refused = await get(elsewhere, url)
                    assert refused.status_code == 400, url
                    assert refused.json()["error"].startswith("scope=gateway is only for this server's gateways")
                    assert (await get(elsewhere, url.replace("gateway", "server"))).status_code == 200, url
                async with httpx.AsyncClient(transport=httpx.AsyncHTTPTransport(uds=elsewhere),
                                             base_url="http://gateway") as client:
                    answer = await client.post("/v2/systemsharedmemory/region/r/register?scope=gateway",
                                               json={"key": "/k", "byte_size": 8})
                assert answer.status_code == 400 and "scope=gateway" in answer.json()["error"]

    asyncio.run(main())


def test_one_gateway_asks_nobody():
    assert Peers("/nonexistent", 0, 1).others() == []
    assert asyncio.run(Peers("/nonexistent", 0, 1).get("/metrics")) == []
    assert Peers("/run/rs", 2, 4).others() == [0, 1, 3]


def test_the_peer_socket_is_private_and_replaces_a_stale_file(runtime_dir: str):
    path = wire.gateway_http_path(runtime_dir, 0)
    with open(path, "w") as stale:
        stale.write("left by a dead gateway")

    sock, inode = bind_unix_socket(path)
    try:
        mode = os.stat(path).st_mode
        assert stat.S_ISSOCK(mode) and stat.S_IMODE(mode) == 0o600
    finally:
        sock.close()
    os.rename(path, path + ".moved")
    bind_unix_socket(path)[0].close()  # a successor's file: not ours to remove
    unlink_unix_socket(path, inode)
    assert os.path.exists(path)
