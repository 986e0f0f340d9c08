"""Worker deaths under gRPC load: the same promise as over HTTP (test_crash_recovery.py), no request lost."""
from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import grpc
import numpy as np
import onnxruntime as ort
import pytest
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from tests.support.stack import free_port, poll_for
from .test_crash_recovery import FAULTS, POISON_MESSAGE, wait_replaced
from .test_gateway_crashes import gateway_pid

pytestmark = pytest.mark.chaos


def mlp_request(x: np.ndarray, rid: str, **parameters: str) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="mlp", id=rid)
    request.inputs.add(name="x", datatype="FP32", shape=x.shape)
    request.raw_input_contents.append(x.tobytes())
    for key, value in parameters.items():
        request.parameters[key].string_param = value
    return request


def test_no_grpc_request_is_lost_while_the_worker_is_killed(start_stack, demo_repo: Path) -> None:
    """With --hold-when-unavailable-s, requests that arrive while no worker is ready wait for the next one:
    every request is answered, and correctly, through two SIGKILLs; a poison request fails alone."""
    port = free_port()
    stack = start_stack(demo_repo, "--grpc-port", str(port), "--hold-when-unavailable-s", "30", env=FAULTS)
    rng = np.random.default_rng(21)
    inputs = [rng.standard_normal((1, 512)).astype(np.float32) for _ in range(16)]
    session = ort.InferenceSession(str(demo_repo / "mlp/1/model.onnx"), providers=["CPUExecutionProvider"])
    expected = [session.run(None, {"x": x})[0] for x in inputs]
    lane = stack.lane("mlp")  # the worker that runs mlp's batches (the encoder has its own)
    clients = 16
    sent = [0] * clients
    outcomes: list[tuple[int, str, pb.ModelInferResponse | grpc.RpcError]] = []
    chaos_over = asyncio.Event()
    kills: list[int] = []

    async def client(stub, c: int) -> None:
        k = after = 0
        while after < 2:  # until the chaos is over, then two more each
            if chaos_over.is_set():
                after += 1
            i = (c + k) % len(inputs)
            sent[c] += 1
            try:
                answer = await stub.ModelInfer(mlp_request(inputs[i], f"c{c}-{k}"), timeout=60)
            except grpc.RpcError as exc:
                answer = exc
            outcomes.append((i, f"c{c}-{k}", answer))
            k += 1

    async def chaos(stub) -> grpc.RpcError | None:
        for round_ in range(2):
            await asyncio.to_thread(poll_for, lambda: len(outcomes) > 100 * (1 + round_), 60)
            pid = await asyncio.to_thread(stack.worker_pid, lane)
            os.kill(pid, signal.SIGKILL)
            kills.append(pid)
            await asyncio.to_thread(wait_replaced, stack, pid, 30)
        try:
            await stub.ModelInfer(mlp_request(inputs[0], "poison", ringserve_fault="segv"), timeout=60)
        except grpc.RpcError as exc:
            poisoned = exc
        else:
            poisoned = None
        await asyncio.to_thread(poll_for, lambda: stack.serves("mlp"), 30, 0.01, "ready after the poison")
        chaos_over.set()
        return poisoned

    async def run() -> grpc.RpcError | None:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            *_, poisoned = await asyncio.gather(*(client(stub, c) for c in range(clients)), chaos(stub))
        return poisoned

    poisoned = asyncio.run(run())

    assert poisoned is not None and poisoned.code() == grpc.StatusCode.INTERNAL
    assert poisoned.details() == POISON_MESSAGE
    assert len(outcomes) == sum(sent) > 200  # exactly one answer each
    failures = [(rid, a.code(), a.details()) for _, rid, a in outcomes if isinstance(a, grpc.RpcError)]
    assert failures == []  # held while no worker was ready, requeued when one died: none lost, none refused
    for i, rid, answer in outcomes:
        assert answer.id == rid
        y = np.frombuffer(answer.raw_output_contents[0], np.float32).reshape(1, 10)
        np.testing.assert_allclose(y, expected[i], atol=1e-5)
    restarts = stack.status()["workers"][lane]["restarts"]
    assert restarts.get("SIGKILL") == 2 and restarts.get("SIGSEGV", 0) >= 2  # the poison request, run max_attempts times


def test_a_killed_gateway_is_restarted_and_serves_grpc_again_on_the_same_port(start_stack, demo_repo: Path) -> None:
    port = free_port()
    stack = start_stack(demo_repo, "--grpc-port", str(port))
    x = np.ones((1, 512), np.float32)
    first = gateway_pid(stack)
    os.kill(first, signal.SIGKILL)
    poll_for(lambda: gateway_pid(stack) not in (None, first), 30, what="a new gateway")

    def answered() -> bool:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            try:
                answer = service_pb2_grpc.GRPCInferenceServiceStub(channel).ModelInfer(mlp_request(x, "again"),
                                                                                      timeout=5)
            except grpc.RpcError:
                return False
        return answer.id == "again" and len(answer.raw_output_contents[0]) == 10 * 4

    poll_for(answered, 60, 0.1, "gRPC served by the restarted gateway")
    assert stack.status()["workers"][0]["restarts_total"] == 0
