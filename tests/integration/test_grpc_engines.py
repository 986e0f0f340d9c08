"""gRPC's two engines on the real stack: when the fast path's surface check fails (a grpcio whose private
names moved), the gateway logs why and grpc.aio serves, unary and streaming. (Both engines run the whole
protocol suite: tests/integration/test_grpc.py is parametrized over --grpc-engine.)"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as triton

from ringserve.common.repository.demo import build_demo_models

from tests.support.stack import free_port, poll_for, running_stack
from .test_logs import logged_to

pytestmark = pytest.mark.integration

# Put first on every process's path: grpcio as a release that renamed a name the fast path uses would be.
SITECUSTOMIZE = """
from grpc._cython import cygrpc
del cygrpc.ReceiveCloseOnServerOperation
"""


def test_a_failed_surface_check_logs_why_and_grpc_aio_serves_unary_and_streaming(tmp_path: Path):
    repo = tmp_path / "models"
    build_demo_models(repo)
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(SITECUSTOMIZE)
    log = tmp_path / "stack.log"
    port = free_port()
    with running_stack(repo, "--grpc-port", str(port), env={"PYTHONPATH": str(tmp_path / "site")},
                       stack_class=logged_to(log)):
        client = triton.InferenceServerClient(f"127.0.0.1:{port}")
        try:
            poll_for(client.is_server_ready, 60, what="gRPC to serve")
            x = triton.InferInput("x", [1, 512], "FP32")
            x.set_data_from_numpy(np.ones((1, 512), np.float32))
            assert client.infer("mlp", [x]).as_numpy("y").shape[0] == 1
            answers: list = []
            client.start_stream(callback=lambda result, error: answers.append((result, error)))
            for i in range(3):
                client.async_stream_infer("mlp", [x], request_id=f"s{i}")
            poll_for(lambda: len(answers) == 3, 60, what="the stream's three answers")
            client.stop_stream()
        finally:
            client.close()
    assert [error for _, error in answers] == [None] * 3
    assert [result.get_response().id for result, _ in answers] == ["s0", "s1", "s2"]
    text = log.read_text()
    assert "gRPC's fast path is off: grpcio" in text and "lacks ReceiveCloseOnServerOperation" in text, text[-3000:]
    assert "serving gRPC on grpc.aio" in text
