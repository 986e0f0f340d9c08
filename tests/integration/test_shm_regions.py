"""Triton's system shared-memory extension on the real stack, with the official `tritonclient.http` and
`tritonclient.utils.shared_memory`: off by default, as in Triton 26.09 (HTTP and gRPC); with
--allow-client-shm, regions registered (within --client-shm-key-prefix), tensors read from and written
into them, every answer compared with ONNX Runtime run in this process; the refusals; a region
unregistered, unlinked or truncated while its request waits; a worker SIGKILLed with such requests in
flight; two gateways.

Every test destroys the segments it made (the suite's leak check looks for the server's own).
"""
from __future__ import annotations

import concurrent.futures
import os
import secrets
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from ringserve.common.repository.demo import MLP_IN, MLP_OUT, build_demo_models

from tests.support.stack import Stack, free_port, poll_for, running_stack
from .test_gateways import gateway_client, gateway_pids, gateway_ready, runtime_dir  # noqa: F401 (a fixture)
from .test_gateways import start as start_gateways
from .test_systemd import stop_and_check

pytestmark = pytest.mark.integration

ROW_IN_BYTES, ROW_OUT_BYTES = MLP_IN * 4, MLP_OUT * 4
KEY_PREFIX = "/rs-test-shmx-"  # every segment these tests make (the `regions` fixture)
SHM_ON = ("--allow-client-shm", "--client-shm-key-prefix", KEY_PREFIX)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("shm-models")
    build_demo_models(path)
    return path


@pytest.fixture(scope="module")
def stack(repo: Path) -> Iterator[Stack]:
    # A long hang timeout: some tests hold the worker with SIGSTOP for a moment.
    with running_stack(repo, "--hang-timeout-s", "60", *SHM_ON) as s:
        yield s


@pytest.fixture
def client(stack: Stack) -> Iterator[triton.InferenceServerClient]:
    c = triton.InferenceServerClient(f"127.0.0.1:{stack.port}", connection_timeout=60, network_timeout=60)
    try:
        yield c
    finally:
        c.unregister_system_shared_memory()  # (every region this test left registered)
        c.close()


@pytest.fixture
def regions() -> Iterator[Callable[[str, int], Any]]:
    """make(name, byte_size) -> a tritonclient shared-memory handle; every one destroyed at the end."""
    made = []

    def make(name: str, byte_size: int):
        handle = shm.create_shared_memory_region(name, f"{KEY_PREFIX}{name}-{secrets.token_hex(4)}", byte_size)
        made.append(handle)
        return handle
    try:
        yield make
    finally:
        for handle in made:
            try:
                shm.destroy_shared_memory_region(handle)
            except (shm.SharedMemoryException, KeyError):
                pass  # (a test destroyed it itself)


def key_of(handle) -> str:
    return handle._shm_key


def mlp_alone(repo: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(repo / "mlp" / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def shm_infer(client, x: np.ndarray, in_region: str, out_region: str, in_offset: int = 0, out_offset: int = 0):
    tensor = triton.InferInput("x", list(x.shape), "FP32")
    tensor.set_shared_memory(in_region, x.nbytes, offset=in_offset)
    output = triton.InferRequestedOutput("y", binary_data=True)
    output.set_shared_memory(out_region, x.shape[0] * ROW_OUT_BYTES, offset=out_offset)
    return client.infer("mlp", [tensor], outputs=[output])


def rows(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((n, MLP_IN)).astype(np.float32)


def test_inputs_and_outputs_in_regions_equal_onnx_runtime_and_the_answer_carries_no_data(client, repo, regions):
    x = rows(3, 1)
    inp, out = regions("in", 4096 + x.nbytes), regions("out", 1024)
    shm.set_shared_memory_region(inp, [x], offset=4096)
    client.register_system_shared_memory("in", key_of(inp), x.nbytes, offset=4096)  # a region inside the segment
    client.register_system_shared_memory("out", key_of(out), 1024)

    result = shm_infer(client, x, "in", "out", out_offset=64)

    # Triton's answer: name, datatype and shape (its C++ client reads binary_data_size from any parameters).
    assert result.get_response()["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [3, MLP_OUT]}]
    # (no 'data': tritonclient's as_numpy() is not for such an output, as with Triton; read the region)
    got = shm.get_contents_as_numpy(out, np.float32, [3, MLP_OUT], offset=64)
    np.testing.assert_allclose(got, mlp_alone(repo, x), rtol=0, atol=1e-5)


def test_a_region_input_with_a_json_output_and_a_binary_input_with_a_region_output(client, repo, regions):
    x = rows(2, 2)
    inp, out = regions("in", x.nbytes), regions("out", 2 * ROW_OUT_BYTES)
    shm.set_shared_memory_region(inp, [x])
    client.register_system_shared_memory("in", key_of(inp), x.nbytes)
    client.register_system_shared_memory("out", key_of(out), 2 * ROW_OUT_BYTES)
    from_region = triton.InferInput("x", [2, MLP_IN], "FP32")
    from_region.set_shared_memory("in", x.nbytes)
    binary = triton.InferInput("x", [2, MLP_IN], "FP32")
    binary.set_data_from_numpy(x, binary_data=True)
    to_region = triton.InferRequestedOutput("y")
    to_region.set_shared_memory("out", 2 * ROW_OUT_BYTES)

    as_json = client.infer("mlp", [from_region], outputs=[triton.InferRequestedOutput("y", binary_data=False)])
    client.infer("mlp", [binary], outputs=[to_region])

    expected = mlp_alone(repo, x)
    np.testing.assert_allclose(as_json.as_numpy("y"), expected, rtol=0, atol=1e-5)
    np.testing.assert_allclose(shm.get_contents_as_numpy(out, np.float32, [2, MLP_OUT]), expected, rtol=0, atol=1e-5)


def test_status_and_unregister_one_then_all(client, regions):
    a, b = regions("a", 64), regions("b", 128)
    client.register_system_shared_memory("a", key_of(a), 64)
    client.register_system_shared_memory("b", key_of(b), 96, offset=32)

    assert client.get_system_shared_memory_status() == [
        {"name": "a", "key": key_of(a), "offset": 0, "byte_size": 64},
        {"name": "b", "key": key_of(b), "offset": 32, "byte_size": 96}]
    assert client.get_system_shared_memory_status("b") == [{"name": "b", "key": key_of(b), "offset": 32,
                                                            "byte_size": 96}]
    client.unregister_system_shared_memory("a")
    assert [r["name"] for r in client.get_system_shared_memory_status()] == ["b"]
    with pytest.raises(InferenceServerException, match="Unable to find system shared memory region: 'a'") as caught:
        client.get_system_shared_memory_status("a")
    assert caught.value.status() == "404"
    client.unregister_system_shared_memory("never-registered")  # (Triton's rule: not an error)
    client.unregister_system_shared_memory()
    assert client.get_system_shared_memory_status() == []
    assert "system_shared_memory" in client.get_server_metadata()["extensions"]


@pytest.mark.parametrize("register, message", [
    (lambda c, key: c.register_system_shared_memory("r", "/rs-test-shmx-absent", 64),
     "no shared-memory segment '/rs-test-shmx-absent'"),
    (lambda c, key: c.register_system_shared_memory("r", key, 8192), "runs past the end of segment"),
    (lambda c, key: c.register_system_shared_memory("r", "/etc/passwd", 64), "without '/'"),
    (lambda c, key: c.register_system_shared_memory("r", key, 0), "'byte_size' must be at least 1"),
    (lambda c, key: c.register_system_shared_memory("r", "/other-app-data", 64),
     "'key' '/other-app-data' is not one this server accepts: its keys must start with '/rs-test-shmx-' "
     "\\(--client-shm-key-prefix\\)"),
])
def test_a_bad_register_is_a_400_that_says_why(client, regions, register, message):
    handle = regions("r", 4096)
    with pytest.raises(InferenceServerException, match=message) as caught:
        register(client, key_of(handle))
    assert caught.value.status() == "400"
    assert client.get_system_shared_memory_status() == []


def test_a_register_body_without_key_is_a_400_naming_it(stack):
    code, doc = stack.post("/v2/systemsharedmemory/region/r/register", {"byte_size": 64})
    assert code == 400 and "no 'key' field" in doc["error"]


def test_unknown_regions_and_spans_outside_the_region_are_400s(client, regions):
    x = rows(2, 3)
    inp, out = regions("in", x.nbytes), regions("out", 2 * ROW_OUT_BYTES)
    client.register_system_shared_memory("in", key_of(inp), x.nbytes)
    client.register_system_shared_memory("out", key_of(out), 2 * ROW_OUT_BYTES)
    cases = [
        (lambda: shm_infer(client, x, "nope", "out"), "Unable to find shared memory region: 'nope'; input 'x'"),
        (lambda: shm_infer(client, x, "in", "nope"), "Unable to find shared memory region: 'nope'; output 'y'"),
        (lambda: shm_infer(client, x, "in", "out", in_offset=16), "runs past region 'in'"),
        (lambda: shm_infer(client, x, "in", "out", out_offset=8), "runs past region 'out'"),
        (lambda: shm_infer(client, rows(1, 3), "in", "out"), None),  # (a smaller tensor in the region is fine)
    ]
    for call, message in cases:
        if message is None:
            call()
            continue
        with pytest.raises(InferenceServerException, match=message) as caught:
            call()
        assert caught.value.status() == "400"


def test_an_output_region_too_small_for_the_answer_is_a_400_before_the_model_runs(client, regions):
    x = rows(2, 4)
    inp, out = regions("in", x.nbytes), regions("out", ROW_OUT_BYTES)
    shm.set_shared_memory_region(inp, [x])
    client.register_system_shared_memory("in", key_of(inp), x.nbytes)
    client.register_system_shared_memory("out", key_of(out), ROW_OUT_BYTES)
    tensor = triton.InferInput("x", [2, MLP_IN], "FP32")
    tensor.set_shared_memory("in", x.nbytes)
    output = triton.InferRequestedOutput("y")
    output.set_shared_memory("out", ROW_OUT_BYTES)

    with pytest.raises(InferenceServerException, match="output 'y' will be 80 bytes.*gives it 40 bytes") as caught:
        client.infer("mlp", [tensor], outputs=[output])
    assert caught.value.status() == "400"


def test_cuda_shared_memory_is_refused_as_by_triton_without_gpus(client):
    assert client.get_cuda_shared_memory_status() == []
    with pytest.raises(InferenceServerException, match="GPUs not supported.*use system shared memory") as caught:
        client.register_cuda_shared_memory("c", b"\0" * 64, 0, 64)
    assert caught.value.status() == "400"
    client.unregister_cuda_shared_memory()


def test_client_shared_memory_is_off_by_default_and_answers_as_triton_over_http_and_grpc(repo):
    """Triton 26.09's qa test (L0_shared_memory: test_client_shm_disabled_by_default), over both protocols."""
    key = f"{KEY_PREFIX}off-{secrets.token_hex(4)}"
    handle = shm.create_shared_memory_region("off", key, 64)
    port = free_port()
    try:
        with running_stack(repo, "--grpc-port", str(port)) as stack:
            http = triton.InferenceServerClient(f"127.0.0.1:{stack.port}")
            grpc = triton_grpc.InferenceServerClient(f"127.0.0.1:{port}")
            try:
                calls = [lambda: http.register_system_shared_memory("off", key, 64),
                         lambda: http.unregister_system_shared_memory("off"),
                         lambda: http.unregister_system_shared_memory(),
                         lambda: http.register_cuda_shared_memory("c", b"\0" * 64, 0, 64),
                         lambda: http.unregister_cuda_shared_memory()]
                for call in calls:
                    with pytest.raises(InferenceServerException) as caught:
                        call()
                    assert caught.value.status() == "501"
                    assert caught.value.message() == ("Client shared memory is disabled. Start the server with "
                                                      "'--allow-client-shm=true' to enable.")
                for call in (lambda: grpc.register_system_shared_memory("off", key, 64),
                             lambda: grpc.unregister_system_shared_memory(),
                             lambda: grpc.register_cuda_shared_memory("c", b"\0" * 64, 0, 64)):
                    with pytest.raises(InferenceServerException, match="Client shared memory is disabled") as caught:
                        call()
                    assert caught.value.status() == "StatusCode.UNIMPLEMENTED"
                assert http.get_system_shared_memory_status() == [] == http.get_cuda_shared_memory_status()
                assert grpc.get_system_shared_memory_status(as_json=True).get("regions", {}) == {}
                tensor = triton.InferInput("x", [1, MLP_IN], "FP32")
                tensor.set_shared_memory("off", ROW_IN_BYTES)
                with pytest.raises(InferenceServerException, match="input 'x': shared memory region 'off': "
                                                                   "Client shared memory is disabled") as caught:
                    http.infer("mlp", [tensor])
                assert caught.value.status() == "400"
            finally:
                http.close()
                grpc.close()
    finally:
        shm.destroy_shared_memory_region(handle)


def test_a_region_past_its_segment_and_a_span_past_size_max_read_as_in_l0_shared_memory(repo, regions):
    """Triton's qa words (L0_shared_memory: test_register_out_of_bound over HTTP and gRPC, and
    test_infer_integer_overflow and test_infer_offset_out_of_bound over HTTP), with the same codes."""
    key, port = key_of(regions("qa", 64)), free_port()
    with running_stack(repo, "--grpc-port", str(port), *SHM_ON) as stack:
        http = triton.InferenceServerClient(f"127.0.0.1:{stack.port}")
        grpc = triton_grpc.InferenceServerClient(f"127.0.0.1:{port}")
        try:
            for client, code in ((http, "400"), (grpc, "StatusCode.INVALID_ARGUMENT")):
                for offset, byte_size in ((0, 65), (1, 64), (64, 1), (65, 0)):
                    with pytest.raises(InferenceServerException,
                                       match="failed to register shared memory region.*invalid args") as caught:
                        client.register_system_shared_memory("qa", key, byte_size, offset=offset)
                    assert caught.value.status() == code
            http.register_system_shared_memory("out", key, 64)
            x = triton.InferInput("x", [1, MLP_IN], "FP32")
            x.set_data_from_numpy(rows(1, 5))
            for offset, byte_size, says in ((32, 2**64 - 32, "Integer overflow detected: byte_size "),
                                            (2**64 - 32, 64, "Invalid offset for shared memory region")):
                output = triton.InferRequestedOutput("y", binary_data=True)
                output.set_shared_memory("out", byte_size, offset=offset)
                with pytest.raises(InferenceServerException, match=says) as caught:
                    http.infer("mlp", [x], outputs=[output])
                assert caught.value.status() == "400"
        finally:
            http.unregister_system_shared_memory()
            http.close()
            grpc.close()


# -- a region that changes while its request waits ----------------------------------
@contextmanager
def worker_stopped(stack: Stack) -> Iterator[None]:
    pids = [w["pid"] for w in stack.status()["workers"] if w["state"] == "ready"]
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in pids:
            with suppress(ProcessLookupError):  # (one the test killed meanwhile)
                os.kill(pid, signal.SIGCONT)


def queued_behind_a_stopped_worker(stack: Stack, repo: Path, send: Callable[[], Any],
                                   meanwhile: Callable[[], None]) -> Any:
    """send() once the stopped worker holds two batches (so its request waits in the queue, its inputs
    not yet copied into a slot), then meanwhile(), then let the worker go on; returns send()'s answer."""
    url = f"127.0.0.1:{stack.port}"

    def plain(seed: int):
        with triton.InferenceServerClient(url, network_timeout=60) as c:
            tensor = triton.InferInput("x", [1, MLP_IN], "FP32")
            tensor.set_data_from_numpy(rows(1, seed))
            return c.infer("mlp", [tensor]).as_numpy("y")

    def in_flight() -> int:
        return sum(w["in_flight_batches"] for w in stack.status()["workers"])

    with concurrent.futures.ThreadPoolExecutor(3) as pool, worker_stopped(stack):
        fillers = []
        for k in (1, 2):  # max_inflight_per_worker is 2: the third batch waits
            fillers.append(pool.submit(plain, 100 + k))
            poll_for(lambda: in_flight() == k, 10, what=f"{k} batch(es) in flight")
        waiting = pool.submit(send)
        poll_for(lambda: stack.status()["models"]["mlp"]["queue_depth"] == 1, 10, what="the request queued")
        meanwhile()
    for k, filler in enumerate(fillers, 1):
        np.testing.assert_allclose(filler.result(60), mlp_alone(repo, rows(1, 100 + k)), rtol=0, atol=1e-5)
    try:
        return waiting.result(60)
    except InferenceServerException as exc:
        return exc


def shm_infer_alone(stack: Stack, x: np.ndarray, in_region: str, out_region: str):
    with triton.InferenceServerClient(f"127.0.0.1:{stack.port}", network_timeout=60) as c:
        return shm_infer(c, x, in_region, out_region)


def test_a_region_unregistered_or_unlinked_while_its_request_waits_is_still_served(stack, client, repo, regions):
    x = rows(2, 5)
    inp, out = regions("in", x.nbytes), regions("out", 2 * ROW_OUT_BYTES)
    shm.set_shared_memory_region(inp, [x])
    client.register_system_shared_memory("in", key_of(inp), x.nbytes)
    client.register_system_shared_memory("out", key_of(out), 2 * ROW_OUT_BYTES)

    def unregister_and_unlink() -> None:
        client.unregister_system_shared_memory()
        shm.destroy_shared_memory_region(inp)  # unlinked: the gateway's mapping keeps the memory

    answer = queued_behind_a_stopped_worker(stack, repo, lambda: shm_infer_alone(stack, x, "in", "out"),
                                            unregister_and_unlink)

    assert not isinstance(answer, Exception), answer
    np.testing.assert_allclose(shm.get_contents_as_numpy(out, np.float32, [2, MLP_OUT]), mlp_alone(repo, x),
                               rtol=0, atol=1e-5)
    assert client.get_system_shared_memory_status() == []


def test_a_segment_truncated_while_its_request_waits_is_a_400_and_the_gateway_lives(stack, client, repo, regions):
    x = rows(2, 6)
    inp, out = regions("in", 8192 + x.nbytes), regions("out", 2 * ROW_OUT_BYTES)
    shm.set_shared_memory_region(inp, [x], offset=8192)
    client.register_system_shared_memory("in", key_of(inp), x.nbytes, offset=8192)
    client.register_system_shared_memory("out", key_of(out), 2 * ROW_OUT_BYTES)
    gateway = stack.status()["gateways"][0]

    def truncate() -> None:  # reading a mapping of those pages now would be SIGBUS (the gateway makes none)
        fd = os.open("/dev/shm" + key_of(inp), os.O_RDWR)
        try:
            os.ftruncate(fd, 4096)
        finally:
            os.close(fd)

    answer = queued_behind_a_stopped_worker(stack, repo, lambda: shm_infer_alone(stack, x, "in", "out"), truncate)

    assert isinstance(answer, InferenceServerException) and answer.status() == "400"
    assert "only 0 of 4096 bytes could be read at offset 8192" in answer.message()
    assert "the segment now has 4096 bytes: it was truncated while the request waited" in answer.message()
    assert stack.status()["gateways"][0]["pid"] == gateway["pid"]
    assert stack.status()["gateways"][0]["restarts_total"] == gateway["restarts_total"]
    x1 = rows(1, 7)
    shm.set_shared_memory_region(out, [np.zeros(MLP_OUT, np.float32)])
    with pytest.raises(InferenceServerException, match="truncated"):
        shm_infer(client, x1, "in", "out")  # and for the next request


def test_worker_sigkill_with_region_requests_in_flight_answers_them_all(stack, client, repo, regions):
    inputs = [rows(2, 20 + k) for k in range(6)]
    outs = []
    for k, x in enumerate(inputs):
        inp, out = regions(f"in{k}", x.nbytes), regions(f"out{k}", 2 * ROW_OUT_BYTES)
        shm.set_shared_memory_region(inp, [x])
        client.register_system_shared_memory(f"in{k}", key_of(inp), x.nbytes)
        client.register_system_shared_memory(f"out{k}", key_of(out), 2 * ROW_OUT_BYTES)
        outs.append(out)
    pid = next(w["pid"] for w in stack.status()["workers"] if "mlp" in w["models"])  # mlp's lane
    restarts = stack.metric("ringserve_worker_restarts_total", reason="SIGKILL")

    with concurrent.futures.ThreadPoolExecutor(len(inputs)) as pool:
        with worker_stopped(stack):
            sends = [pool.submit(shm_infer_alone, stack, x, f"in{k}", f"out{k}") for k, x in enumerate(inputs)]
            def accepted(status: dict) -> int:  # (one sent after the kill would get 503: no worker ready)
                return sum(w["in_flight_requests"] for w in status["workers"]) + status["models"]["mlp"]["queue_depth"]
            poll_for(lambda: accepted(stack.status()) == len(inputs), 10, what="every region request accepted")
            assert sum(w["in_flight_requests"] for w in stack.status()["workers"]) >= 2
            os.kill(pid, signal.SIGKILL)
        answers = [s.result(120) for s in sends]

    for k, (x, answer) in enumerate(zip(inputs, answers)):
        assert answer.get_response()["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [2, MLP_OUT]}]
        np.testing.assert_allclose(shm.get_contents_as_numpy(outs[k], np.float32, [2, MLP_OUT]), mlp_alone(repo, x),
                                   rtol=0, atol=1e-5)
    assert stack.metric("ringserve_worker_restarts_total", reason="SIGKILL") == restarts + 1
    assert stack.metric("ringserve_batches_requeued_total", model="mlp") >= 1


# -- several gateways -----------------------------------------------------------------
def shm_body(x: np.ndarray, in_region: str, out_region: str) -> dict:
    """What tritonclient.http sends for an input and an output in regions (JSON, no binary part)."""
    return {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "parameters": {
                "shared_memory_region": in_region, "shared_memory_byte_size": x.nbytes}}],
            "outputs": [{"name": "y", "parameters": {"binary_data": False, "shared_memory_region": out_region,
                                                     "shared_memory_byte_size": x.shape[0] * ROW_OUT_BYTES}}]}


def test_every_gateway_holds_the_regions_registered_at_any_one_even_after_a_restart(repo, regions, runtime_dir):
    x = rows(2, 30)
    inp, out = regions("in", x.nbytes), regions("out", 2 * ROW_OUT_BYTES)
    shm.set_shared_memory_region(inp, [x])
    stack = start_gateways(repo, runtime_dir, *SHM_ON)
    try:
        with gateway_client(runtime_dir, 0) as g0, gateway_client(runtime_dir, 1) as g1:
            assert g0.post("/v2/systemsharedmemory/region/in/register",
                           json={"key": key_of(inp), "offset": 0, "byte_size": x.nbytes}).status_code == 200
            assert g1.post("/v2/systemsharedmemory/region/out/register",
                           json={"key": key_of(out), "byte_size": 2 * ROW_OUT_BYTES}).status_code == 200
            for g in (g0, g1):  # each gateway's own share holds both
                own = g.get("/v2/systemsharedmemory/status?scope=gateway").json()
                assert sorted(r["name"] for r in own) == ["in", "out"]
            again = g0.post("/v2/systemsharedmemory/region/out/register", json={"key": key_of(out), "byte_size": 8})
            assert again.status_code == 400 and "already in manager" in again.json()["error"]

            for g in (g0, g1):  # registered at one, used at the other
                shm.set_shared_memory_region(out, [np.zeros((2, MLP_OUT), np.float32)])
                answer = g.post("/v2/models/mlp/infer", json=shm_body(x, "in", "out"))
                assert answer.status_code == 200, answer.text
                np.testing.assert_allclose(shm.get_contents_as_numpy(out, np.float32, [2, MLP_OUT]),
                                           mlp_alone(repo, x), rtol=0, atol=1e-5)

            before = gateway_pids(stack)
            os.kill(before[1], signal.SIGKILL)
            poll_for(lambda: gateway_pids(stack)[1] not in (0, before[1]) and gateway_ready(runtime_dir, 1), 30,
                     what="gateway 1 restarted")
        with gateway_client(runtime_dir, 1) as g1:  # (a new connection to the new process)
            own = g1.get("/v2/systemsharedmemory/status?scope=gateway").json()
            assert sorted(r["name"] for r in own) == ["in", "out"]  # adopted from gateway 0 at its start
            assert g1.post("/v2/models/mlp/infer", json=shm_body(x, "in", "out")).status_code == 200

            assert g1.post("/v2/systemsharedmemory/region/in/unregister").status_code == 200
            with gateway_client(runtime_dir, 0) as g0:
                assert [r["name"] for r in g0.get("/v2/systemsharedmemory/status?scope=gateway").json()] == ["out"]
                assert g0.post("/v2/systemsharedmemory/unregister").status_code == 200
            assert g1.get("/v2/systemsharedmemory/status").json() == []
    finally:
        stop_and_check(stack)
