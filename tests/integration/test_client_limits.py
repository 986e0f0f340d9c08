"""What one client can make a server hold, on the real stack (real sockets, real processes):

- a gRPC ModelStreamInfer that writes and never reads its answers holds --grpc-stream-max-in-flight
  requests, not every request it can write, while other clients are served;
- under a low open-files limit, idle gRPC connections and registered regions past their share of the
  descriptor budget are refused in their own protocol's words, and HTTP is served meanwhile;
- a variable dim past its config bound (`max_shapes`) or a tensor over --max-tensor-bytes gets 400
  with the numbers, over HTTP and gRPC;
- the worker hands back the memory of an outsized batch;
- a reload that meets a 9 MB config.pbtxt refuses it at once, and no worker is killed as hung.
"""
from __future__ import annotations

import asyncio
import json
import os
import resource
import secrets
import shutil
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import httpx
import numpy as np
import psutil
import pytest
import tritonclient.utils.shared_memory as shm
from onnx import TensorProto, helper, numpy_helper
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from ringserve.common.repository.demo import build_demo_models, encoder_model, make_model, write_model_dir
from ringserve.gateway.descriptors import DescriptorBudget
from ringserve.gateway.core.region_errors import MAX_REGIONS

from tests.support.stack import Stack, free_port, poll_for, running_stack
from .test_logs import logged_to

pytestmark = pytest.mark.integration

STREAM_CAP = 16  # --grpc-stream-max-in-flight of the stack below
MAX_TENSOR_BYTES = 8 << 20  # --max-tensor-bytes of the stack below
ECHO_WIDTH = 8192  # 32 KiB of FP32 each way per echo request
STREAM_WRITES = 2000  # at most, for a stream that never reads (about 128 MiB held if the gateway read them all)
BOUND_TOKENS = 64  # the `bounded` encoder's max_shapes
IN_FLIGHT = "ringserve_grpc_stream_requests_in_flight"
MLP_BODY = {"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32", "data": [0.25] * 512}]}


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo models, `echo` (FP32 identity of any width) and `bounded` (the encoder, its sequence
    bounded at BOUND_TOKENS by max_shapes)."""
    repo = tmp_path_factory.mktemp("limits-models")
    build_demo_models(repo)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "width"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "width"])
    write_model_dir(repo, "echo", make_model("echo", [helper.make_node("Identity", ["x"], ["y"])], [x], [y], {}),
                    {"name": "echo", "max_batch_size": 8, "dynamic_batching": {},
                     "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [-1]}],
                     "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [-1]}]})
    shutil.copytree(repo / "encoder", repo / "bounded")
    config = json.loads((repo / "bounded" / "config.json").read_text())
    bound = f"-1x{BOUND_TOKENS}"
    config.update(name="bounded", parameters={"max_shapes": {
        "string_value": f"input_ids:{bound},attention_mask:{bound}"}})
    (repo / "bounded" / "config.json").write_text(json.dumps(config))
    return repo


@pytest.fixture(scope="module")
def stack(repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    port = free_port()
    log_path = tmp_path_factory.mktemp("limits-log") / "stack.log"
    with running_stack(repo, "--grpc-port", str(port), "--grpc-stream-max-in-flight", str(STREAM_CAP),
                       "--max-tensor-bytes", str(MAX_TENSOR_BYTES), stack_class=logged_to(log_path)) as s:
        s.grpc_port = port
        yield s


def gateway_process(stack: Stack) -> psutil.Process:
    return next(p for p in psutil.Process(stack.pid).children() if "ringserve.gateway" in " ".join(p.cmdline()))


def echo_request(i: int, width: int = ECHO_WIDTH) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="echo", id=f"r{i}")
    request.inputs.add(name="x", datatype="FP32", shape=[1, width])
    request.raw_input_contents.append(np.full((1, width), i, np.float32).tobytes())
    return request


def binary_infer(stack: Stack, model: str, tensors: dict[str, np.ndarray], datatype: str) -> httpx.Response:
    """POST /infer with every tensor in the binary tensor extension."""
    inputs = [{"name": name, "shape": list(a.shape), "datatype": datatype,
               "parameters": {"binary_data_size": a.nbytes}} for name, a in tensors.items()]
    header = json.dumps({"inputs": inputs}).encode()
    body = header + b"".join(a.tobytes() for a in tensors.values())
    return httpx.post(f"{stack.url}/v2/models/{model}/infer", content=body, timeout=120,
                      headers={"inference-header-content-length": str(len(header))})


async def until_stalled(count: Callable[[], int], writer: asyncio.Task, quiet_s: float = 1.5,
                        timeout_s: float = 60.0) -> None:
    """Wait until count() has not moved for quiet_s (the gateway stopped reading), or writer is done."""
    deadline = time.monotonic() + timeout_s
    last, since = count(), time.monotonic()
    while not writer.done() and time.monotonic() - since < quiet_s:
        if time.monotonic() > deadline:
            raise TimeoutError("the stream's writes neither stalled nor finished")
        await asyncio.sleep(0.1)
        if count() != last:
            last, since = count(), time.monotonic()


# -- a stream that never reads -------------------------------------------------------------------------
def test_a_stream_that_never_reads_its_answers_holds_only_its_cap_while_others_are_served(stack: Stack):
    gateway = gateway_process(stack)
    rss_before = gateway.memory_info().rss
    log_offset = stack.log_path.stat().st_size

    async def scenario() -> dict:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{stack.grpc_port}") as channel, \
                grpc.aio.insecure_channel(f"127.0.0.1:{stack.grpc_port}",
                                          options=[("grpc.use_local_subchannel_pool", 1)]) as other:
            call = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer()
            written = 0

            async def write() -> None:
                nonlocal written
                for i in range(STREAM_WRITES):
                    await call.write(echo_request(i))
                    written += 1

            writer = asyncio.ensure_future(write())
            try:
                await until_stalled(lambda: written, writer)
                rss_stalled, held, others = gateway.memory_info().rss, [stack.metric(IN_FLIGHT)], []
                for i in range(3):  # meanwhile: another gRPC client and an HTTP one, each served at once
                    started = time.monotonic()
                    answer = await service_pb2_grpc.GRPCInferenceServiceStub(other).ModelInfer(
                        echo_request(10_000 + i, width=4), timeout=10)
                    status = httpx.post(f"{stack.url}/v2/models/mlp/infer", json=MLP_BODY, timeout=10).status_code
                    others.append((answer.id, status, time.monotonic() - started))
                    held.append(stack.metric(IN_FLIGHT))
                    await asyncio.sleep(1)
                return {"written": written, "done": writer.done(), "held": held, "others": others,
                        "rss_stalled": rss_stalled, "rss_after": gateway.memory_info().rss}
            finally:
                writer.cancel()
                call.cancel()

    seen = asyncio.run(scenario())

    assert not seen["done"] and seen["written"] < STREAM_WRITES, seen  # the gateway stopped reading the stream
    assert seen["held"] == [STREAM_CAP] * 4, seen  # and held the cap, no more, the whole time
    assert [(rid, status) for rid, status, _ in seen["others"]] == [(f"r{10_000 + i}", 200) for i in range(3)]
    assert max(took for _, _, took in seen["others"]) < 5.0, seen["others"]
    grown_mib = (seen["rss_after"] - rss_before) / 2**20
    assert grown_mib < 48, f"the gateway grew {grown_mib:.0f} MiB for one stream holding {STREAM_CAP} requests"
    poll_for(lambda: stack.metric(IN_FLIGHT) == 0, 10, what="the cancelled stream's requests to be let go")
    logged = stack.log_path.read_bytes()[log_offset:].decode(errors="replace")
    assert " ERROR " not in logged and "Traceback" not in logged, logged[-3000:]  # a client going away is no error


# -- bounds on a tensor ----------------------------------------------------------------------------------
def test_a_sequence_past_the_configs_bound_gets_400_with_the_numbers_over_http_and_grpc(stack: Stack):
    tokens = {name: np.ones((1, BOUND_TOKENS + 1), np.int64) for name in ("input_ids", "attention_mask")}
    says = (f"input 'input_ids': shape [1, {BOUND_TOKENS + 1}] has {BOUND_TOKENS + 1} at dim 1; model 'bounded' "
            f"takes at most {BOUND_TOKENS} there (parameters.max_shapes: 64x{BOUND_TOKENS}, -1 = any size)")

    answer = binary_infer(stack, "bounded", tokens, "INT64")
    assert (answer.status_code, answer.json()["error"]) == (400, says)

    request = pb.ModelInferRequest(model_name="bounded")
    for name, array in tokens.items():
        request.inputs.add(name=name, datatype="INT64", shape=list(array.shape))
        request.raw_input_contents.append(array.tobytes())
    with grpc.insecure_channel(f"127.0.0.1:{stack.grpc_port}") as channel:
        with pytest.raises(grpc.RpcError) as raised:
            service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=30)
    assert (raised.value.code(), raised.value.details()) == (grpc.StatusCode.INVALID_ARGUMENT, says)

    within = {name: a[:, :BOUND_TOKENS] for name, a in tokens.items()}
    assert binary_infer(stack, "bounded", within, "INT64").status_code == 200


def test_a_tensor_over_max_tensor_bytes_gets_400_with_its_size_and_the_limit(stack: Stack):
    width = MAX_TENSOR_BYTES // 4 + 1
    answer = binary_infer(stack, "echo", {"x": np.zeros((1, width), np.float32)}, "FP32")
    assert answer.status_code == 400
    assert answer.json()["error"] == (f"input 'x': shape [1, {width}] FP32 is {width * 4} bytes; this server takes "
                                      f"tensors of at most {MAX_TENSOR_BYTES} bytes (--max-tensor-bytes)")
    assert httpx.post(f"{stack.url}/v2/models/mlp/infer", json=MLP_BODY, timeout=30).status_code == 200


# -- memory back after an outsized batch ----------------------------------------------------------------
def encoder_embedding(ids: np.ndarray) -> np.ndarray:
    """The demo encoder's answer for one unpadded row, from its weights: the mean of tanh(table[id] @ proj)."""
    weights = {init.name: numpy_helper.to_array(init) for init in encoder_model().graph.initializer}
    per_token = np.tanh(weights["table"].astype(np.float64) @ weights["proj"].astype(np.float64))
    counts = np.bincount(ids.ravel(), minlength=len(per_token))
    return (counts @ per_token / ids.size)[None, :]


def test_the_worker_hands_back_the_memory_of_an_outsized_batch(stack: Stack):
    rng = np.random.default_rng(22)
    usual = rng.integers(0, 1000, (4, 128), dtype=np.int64)
    for _ in range(5):
        assert binary_infer(stack, "encoder", {"input_ids": usual, "attention_mask": np.ones_like(usual)},
                            "INT64").status_code == 200
    worker = psutil.Process(stack.worker_pid())
    before_mib = worker.memory_info().rss / 2**20

    ids = rng.integers(0, 1000, (1, 400_000), dtype=np.int64)  # ~0.4 GB of the encoder's intermediates
    answer = binary_infer(stack, "encoder", {"input_ids": ids, "attention_mask": np.ones_like(ids)}, "INT64")

    assert answer.status_code == 200, answer.text[:500]
    (output,) = answer.json()["outputs"]
    got = np.asarray(output["data"], np.float32).reshape(output["shape"])
    np.testing.assert_allclose(got, encoder_embedding(ids), rtol=1e-4, atol=1e-5)
    after = poll_for(lambda: (mib := worker.memory_info().rss / 2**20) < before_mib + 100 and mib, 10,
                     what=f"the worker's RSS back near {before_mib:.0f} MiB (it is "
                          f"{worker.memory_info().rss / 2**20:.0f} MiB)")
    assert after < before_mib + 100


# -- descriptors under a low open-files limit ---------------------------------------------------------------
NOFILE = 700
IDLE_GRPC_CONNECTIONS = 680  # at this limit, enough to take every descriptor if nothing capped them
REGIONS = 60  # more than the budget's share (40 at this limit)


class LowNofileStack(Stack):
    nofile = (NOFILE, NOFILE)


@pytest.fixture
def many_files() -> Iterator[None]:
    """This test process opens a connection per idle gRPC client: room for them, put back afterwards."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4096 if hard == resource.RLIM_INFINITY else min(4096, hard)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, wanted), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def open_idle_connections(port: int, count: int) -> tuple[list[grpc.aio.Channel], dict[str, int]]:
    """`count` channels of their own connection each, one ServerLive on each; the outcomes by status."""
    channels = [grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=[("grpc.use_local_subchannel_pool", 1)])
                for _ in range(count)]
    outcomes: dict[str, int] = {}
    for channel in channels:  # one at a time: the gateway judges each connection as it is accepted
        try:
            await service_pb2_grpc.GRPCInferenceServiceStub(channel).ServerLive(pb.ServerLiveRequest(), timeout=10)
            code = "OK"
        except grpc.aio.AioRpcError as exc:
            code = exc.code().name
        outcomes[code] = outcomes.get(code, 0) + 1
    return channels, outcomes


def register_regions(stack: Stack, key: str, count: int) -> list[tuple[int, str]]:
    answers = []
    for i in range(count):
        r = httpx.post(f"{stack.url}/v2/systemsharedmemory/region/r{i}/register", timeout=30,
                       json={"key": key, "offset": 0, "byte_size": 64})
        answers.append((r.status_code, r.json().get("error", "")))
    return answers


async def http_burst(url: str, clients: int) -> list[int | str]:
    """`clients` infer requests at once, each on a connection of its own; status codes or what broke."""
    async def one() -> int | str:
        async with httpx.AsyncClient(base_url=url, timeout=10) as http:
            try:
                return (await http.post("/v2/models/mlp/infer", json=MLP_BODY)).status_code
            except httpx.HTTPError as exc:
                return type(exc).__name__
    return list(await asyncio.gather(*(one() for _ in range(clients))))


def test_under_a_low_open_files_limit_grpc_and_regions_past_their_share_are_refused_and_http_serves(
        repo: Path, many_files):
    budget = DescriptorBudget(4096, 1024, MAX_REGIONS).scaled(NOFILE)  # the defaults, cut to the limit
    port = free_port()
    segment = shm.create_shared_memory_region("limits", f"/rs-test-limits-{secrets.token_hex(4)}", 4096)
    try:
        with running_stack(repo, "--grpc-port", str(port), "--allow-client-shm", stack_class=LowNofileStack) as stack:
            assert gateway_process(stack).rlimit(psutil.RLIMIT_NOFILE) == (NOFILE, NOFILE)

            async def scenario() -> tuple[dict[str, int], list[tuple[int, str]], list[int | str]]:
                channels, outcomes = await open_idle_connections(port, IDLE_GRPC_CONNECTIONS)
                try:
                    registered = register_regions(stack, segment._shm_key, REGIONS)
                    return outcomes, registered, await http_burst(stack.url, 50)
                finally:
                    await asyncio.gather(*(channel.close() for channel in channels))

            outcomes, registered, burst = asyncio.run(scenario())
            httpx.post(f"{stack.url}/v2/systemsharedmemory/unregister", timeout=30)

        assert outcomes == {"OK": budget.grpc_connections,
                            "UNAVAILABLE": IDLE_GRPC_CONNECTIONS - budget.grpc_connections}
        assert [status for status, _ in registered] == [200] * budget.shm_regions + [400] * (
            REGIONS - budget.shm_regions)
        assert (f"{budget.shm_regions} regions are registered, the most this server holds (each keeps a file open"
                in registered[-1][1])
        assert burst == [200] * 50  # every HTTP request answered, none dropped
    finally:
        shm.destroy_shared_memory_region(segment)


# -- a huge config.pbtxt met by a reload -------------------------------------------------------------------
def huge_pbtxt(name: str, megabytes: int) -> str:
    """A valid config.pbtxt of about `megabytes` MB: the model's config, then a parameters map that long."""
    line = 'parameters { key: "k%07d" value: { string_value: "%s" } }\n'
    entries = megabytes * 2**20 // len(line % (0, "v" * 40))
    return f'name: "{name}"\n' + "".join(line % (i, "v" * 40) for i in range(entries))


def lane_of(status: dict, model: str) -> dict:
    """The worker (lane) that holds `model` (the demo's models each have their own: supervision/lanes.py)."""
    return next(w for w in status["workers"] if model in w["models"])


def test_a_reload_that_meets_a_9_mb_config_pbtxt_refuses_it_at_once_and_no_worker_is_killed_as_hung(
        tmp_path: Path):
    repo = tmp_path / "models"
    build_demo_models(repo)
    # A short start timeout: a worker that spent its first seconds parsing before its first heartbeat
    # was killed as hung (restart reason `hung`).
    with running_stack(repo, "--worker-start-timeout-s", "10") as stack:
        before = lane_of(stack.status(), "mlp")
        (repo / "mlp" / "config.json").unlink()
        (repo / "mlp" / "config.pbtxt").write_text(huge_pbtxt("mlp", 9))
        os.kill(stack.pid, signal.SIGHUP)

        def settled() -> dict | None:
            status = stack.status()
            reload = status.get("reload", {})
            return status if "mlp" in reload.get("kept_models", {}) and not reload.get("replacing") else None

        status = poll_for(settled, 60, 0.1, what="the reload to refuse the huge config")
        worker = lane_of(status, "mlp")
        assert (worker["pid"], worker["generation"], worker["state"]) == (before["pid"], before["generation"],
                                                                          "ready")
        assert "config.pbtxt is" in status["reload"]["kept_models"]["mlp"]
        assert "a model config may have at most 1048576 bytes" in status["reload"]["kept_models"]["mlp"]
        assert worker["restarts"].get("hung", 0) == 0, worker["restarts"]
        assert stack.post("/v2/models/mlp/infer", MLP_BODY)[0] == 200  # the old generation serves on
