"""Logs and request ids against the real stack: --log-format json from every process, a client's
X-Request-ID followed into the gateway's and the worker's lines about its batch, the access log."""
from __future__ import annotations

import collections
import concurrent.futures
import json
import os
import re
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as triton
from tritonclient.grpc import service_pb2 as pb

from tests.support import rawhttp
from tests.support.python_models import write_python_model
from tests.support.stack import Stack, free_port, poll_for, running_stack
from .test_gateways import gateway_ready
from .test_gateways import runtime_dir as runtime_dir  # the fixture

FAULTS = {"RINGSERVE_FAULT_INJECTION": "1"}
JSON_KEYS = {"time", "level", "role", "index", "generation", "pid", "logger", "message"}
LINE_BYTES = 4096
CUT_MARKER_PATTERN = re.compile(r" \[\.\.\.\d+ bytes cut\.\.\.\] ")
ACCESS_KEYS = {"method", "path", "status", "bytes", "latency_ms", "model", "batch_size", "request_id"}


class LoggedStack(Stack):
    """A stack whose processes' stderr (every log line) goes to `log_path`, for the test to read."""

    log_path: Path

    def start(self, *args, **kwargs) -> Stack:
        with self.log_path.open("ab") as self.stderr:  # the children keep their own copy of the fd
            return super().start(*args, **kwargs)


def logged_to(path: Path) -> type[Stack]:
    return type("LoggedStack", (LoggedStack,), {"log_path": path})


def call(stack: Stack, path: str, body: dict | None = None, request_id: str | None = None
         ) -> tuple[int, dict[str, str], dict | str]:
    headers = {"content-type": "application/json"}
    if request_id is not None:
        headers["x-request-id"] = request_id
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(stack.url + path, data=data, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=60) as r:
            status, raw, answer = r.status, r.read(), r.headers
    except urllib.error.HTTPError as e:
        status, raw, answer = e.code, e.read(), e.headers
    text = raw.decode()
    return status, {k.lower(): v for k, v in answer.items()}, json.loads(text) if text.startswith("{") else text


def mlp_body(x: np.ndarray, **parameters: str) -> dict:
    body = {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}
    if parameters:
        body["parameters"] = parameters
    return body


def test_json_logs_follow_a_client_request_id_from_the_header_to_the_workers_line_about_its_batch(
        demo_repo: Path, tmp_path: Path) -> None:
    log_path = tmp_path / "stack.log"
    x = np.random.default_rng(7).standard_normal((2, 512)).astype(np.float32)
    with running_stack(demo_repo, "--log-format", "json", "--access-log", "--log-level", "INFO", "--cpu-only",
                       env=FAULTS, stack_class=logged_to(log_path)) as stack:
        ok = call(stack, "/v2/models/mlp/infer", mlp_body(x), request_id="client-ok.1")
        poison = call(stack, "/v2/models/mlp/infer", mlp_body(x[:1], ringserve_fault="segv"),
                      request_id="client-poison:2")
        unknown = call(stack, "/v2/models/nope/infer", mlp_body(x))  # no id sent: the gateway makes one
        bad_id = call(stack, "/v2/models/nope/infer", mlp_body(x), request_id="has space")
        long_id = call(stack, "/v2/health/ready", request_id="a" * 129)
        ready = call(stack, "/v2/health/ready", request_id="probe-3")
        missing_route = call(stack, "/v2/nothing", request_id="route-4")
        status = call(stack, "/admin/status")[2]

    # The id comes back on every answer, and in every error body.
    assert ok[0] == 200 and ok[1]["x-request-id"] == "client-ok.1"
    session = ort.InferenceSession(str(demo_repo / "mlp" / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    expected = session.run(None, {"x": x})[0]
    out = ok[2]["outputs"][0]
    np.testing.assert_allclose(np.asarray(out["data"], np.float32).reshape(out["shape"]), expected, rtol=1e-5,
                               atol=1e-5)
    assert poison[0] == 500 and poison[1]["x-request-id"] == "client-poison:2"
    assert poison[2]["request_id"] == "client-poison:2" and "crashed" in poison[2]["error"]
    assert unknown[0] == 404 and unknown[2]["request_id"] == unknown[1]["x-request-id"] != ""
    assert bad_id[1]["x-request-id"] not in ("has space", unknown[1]["x-request-id"])  # replaced, not refused
    assert bad_id[0] == 404 and bad_id[2]["request_id"] == bad_id[1]["x-request-id"]
    assert long_id[1]["x-request-id"] != "a" * 129  # (503 or 200: the worker may still be restarting)
    assert ready[1]["x-request-id"] == "probe-3"
    assert missing_route[0] == 404 and missing_route[1]["x-request-id"] == missing_route[2]["request_id"] == "route-4"
    assert [p["request_id"] for p in status["models"]["mlp"]["poison_requests"]] == ["client-poison:2"]

    # Every line of every process is one JSON object with the keys.
    lines = [line for line in log_path.read_text().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]
    assert all(JSON_KEYS <= set(r) for r in records), [r for r in records if not JSON_KEYS <= set(r)]
    assert {r["role"] for r in records} == {"supervisor", "gateway", "worker"}
    assert {r["index"] for r in records if r["role"] == "gateway"} == {0}
    assert {r["index"] for r in records if r["role"] == "worker"} == {w["index"] for w in status["workers"]}  # lanes

    # The poison request's id, followed: the worker's line about its batch (before each crash), the
    # gateway's requeue and isolation of that batch, the supervisor's count.
    about = [r for r in records if "client-poison:2" in (r.get("request_ids") or []) + [r.get("request_id")]]
    worker_lines = [r for r in about if r["role"] == "worker"]
    assert len(worker_lines) == 2 and all("injecting fault 'segv'" in r["message"] for r in worker_lines)
    assert {r["generation"] for r in worker_lines} == {1, 2}
    batch_id = worker_lines[0]["batch_id"]
    gateway_lines = [r for r in about if r["role"] == "gateway" and r["logger"] != "ringserve.access"]
    assert [r["level"] for r in gateway_lines] == ["INFO", "ERROR"]
    assert "requeued after its worker died (SIGSEGV)" in gateway_lines[0]["message"]
    assert "request isolated" in gateway_lines[1]["message"] and gateway_lines[1]["request_id"] == "client-poison:2"
    assert {r["batch_id"] for r in gateway_lines + worker_lines} == {batch_id}
    assert any(r["role"] == "supervisor" and "poison request" in r["message"] for r in about)

    # The access log: one line per request, with its fields.
    access = {r["request_id"]: r for r in records if r["logger"] == "ringserve.access"}
    assert all(ACCESS_KEYS <= set(r) for r in access.values())
    sent = [ok, poison, unknown, bad_id, long_id, ready, missing_route]
    assert {answer[1]["x-request-id"] for answer in sent} <= set(access)  # (and the stack's readiness polls)
    assert access["client-ok.1"] | {"latency_ms": 0, "bytes": 0} == {
        **access["client-ok.1"], "method": "POST", "path": "/v2/models/mlp/infer", "status": 200, "model": "mlp",
        "batch_size": 2, "latency_ms": 0, "bytes": 0}
    assert access["client-ok.1"]["bytes"] == int(ok[1]["content-length"])
    assert (access["client-poison:2"]["status"], access["client-poison:2"]["batch_size"]) == (500, None)
    assert (access["route-4"]["method"], access["route-4"]["status"], access["route-4"]["path"]) == (
        "GET", 404, "/v2/nothing")
    assert access["probe-3"]["model"] is None and access[unknown[1]["x-request-id"]]["model"] == "nope"

    # The CUDA-fallback line (here: --cpu-only) once per server start, not at each worker start.
    fallback = [r for r in records if r["message"].startswith("execution provider: CPU")]
    assert [(r["level"], r["generation"]) for r in fallback] == [("INFO", 1)]
    lane = next(w["index"] for w in status["workers"] if "mlp" in w["models"])  # the poison's lane
    started = [r for r in records if r["message"].startswith(f"started worker {lane} generation")
               or r["message"].startswith(f"worker {lane} generation") and "the spare" in r["message"]]  # (a takeover)
    assert len(started) >= 2


def test_text_logs_by_default_and_no_access_log_unless_asked(demo_repo: Path, tmp_path: Path) -> None:
    log_path = tmp_path / "stack.log"
    with running_stack(demo_repo, "--log-level", "INFO", stack_class=logged_to(log_path)) as stack:
        ok = call(stack, "/v2/models/mlp/infer", mlp_body(np.ones((1, 512), np.float32)), request_id="plain-1")
        ready = call(stack, "/v2/health/ready")
    assert ok[0] == 200 and ok[1]["x-request-id"] == "plain-1" and ready[1]["x-request-id"]
    lines = [line for line in log_path.read_text().splitlines() if line.strip()]
    assert any("INFO supervisor[" in line for line in lines) and any(" gateway-0[" in line for line in lines)
    assert not any(line.startswith("{") for line in lines)
    assert not any("ringserve.access" in line or "plain-1" in line for line in lines)


def test_the_systemd_environment_file_sets_the_log_format_and_the_access_log() -> None:
    units = Path(__file__).resolve().parents[2] / "systemd"
    env = (units / "ringserve.env").read_text()
    service = (units / "ringserve.service").read_text()
    assert "\nRINGSERVE_LOG_FORMAT=text\n" in env and "\nRINGSERVE_ACCESS_LOG=false\n" in env
    assert "--log-format ${RINGSERVE_LOG_FORMAT}" in service and "--access-log ${RINGSERVE_ACCESS_LOG}" in service
    defaults = {word for line in service.splitlines() if line.startswith("Environment=")
                for word in line.removeprefix("Environment=").split()}
    assert {"RINGSERVE_LOG_FORMAT=text", "RINGSERVE_ACCESS_LOG=false"} <= defaults


def test_grpc_requests_get_access_lines_and_their_request_id(demo_repo: Path, tmp_path: Path) -> None:
    log_path, port = tmp_path / "stack.log", free_port()
    x = np.random.default_rng(8).standard_normal((2, 512)).astype(np.float32)
    with running_stack(demo_repo, "--log-format", "json", "--access-log", "--grpc-port", str(port),
                       stack_class=logged_to(log_path)) as stack:
        client = triton.InferenceServerClient(f"127.0.0.1:{port}")
        try:
            tensor = triton.InferInput("x", list(x.shape), "FP32")
            tensor.set_data_from_numpy(x)
            y = client.infer("mlp", [tensor], headers={"x-request-id": "grpc-ok.1"}).as_numpy("y")
        finally:
            client.close()
        assert stack.stop() == 0
    session = ort.InferenceSession(str(demo_repo / "mlp/1/model.onnx"), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(y, session.run(None, {"x": x})[0], rtol=0, atol=1e-5)
    records = [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]
    access = [r for r in records if r["logger"] == "ringserve.access" and r.get("request_id") == "grpc-ok.1"]
    assert len(access) == 1, access
    (line,) = access
    assert ACCESS_KEYS <= set(line)
    assert (line["method"], line["path"], line["status"], line["model"], line["batch_size"]) == (
        "GRPC", "/inference.GRPCInferenceService/ModelInfer", 200, "mlp", 2)
    assert line["bytes"] > 2 * 10 * 4  # the answer's protobuf, its raw output included


def test_text_lines_escape_control_characters_a_client_puts_in_a_path_or_a_model_name(
        demo_repo: Path, tmp_path: Path) -> None:
    """%0a, %0d%0a and %1b in a path, and a newline in a gRPC model name, forged log lines and sent raw
    escape sequences to whatever showed the log (--log-format text; JSON escaped them already)."""
    log_path, port = tmp_path / "stack.log", free_port()
    forged = "2026-01-01 00:00:00,000 INFO gateway-0[1] ringserve.access: forged"
    paths = ["/v2/models/mlp%0a" + urllib.parse.quote(forged) + "/infer",
             "/v2/models/mlp%0d%0a" + urllib.parse.quote(forged) + "%1b[2J/infer"]
    with running_stack(demo_repo, "--access-log", "--grpc-port", str(port), stack_class=logged_to(log_path)) as stack:
        statuses = [rawhttp.request(stack.port, "POST", path, b"{}").status for path in paths]
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            message = pb.ModelInferRequest(model_name=f"mlp\n{forged}\x1b[31m")
            with pytest.raises(grpc.RpcError) as info:
                channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")(message.SerializeToString(),
                                                                                  timeout=30)
        assert stack.stop() == 0
    # (Triton's rule: a name without '/' that is not '..' is a name, here one no model has)
    assert statuses == [404, 404] and info.value.code() == grpc.StatusCode.NOT_FOUND
    text = log_path.read_bytes()
    assert b"\x1b" not in text and b"\r" not in text
    lines = text.decode().splitlines()
    assert not [line for line in lines if line.startswith(("2026-01-01", "forged"))]
    access = [line for line in lines if "ringserve.access:" in line]
    assert any(f"/v2/models/mlp\\n{forged}/infer 404" in line for line in access), access
    assert any(f"/v2/models/mlp\\r\\n{forged}\\x1b[2J/infer 404" in line for line in access), access
    assert any(f"GRPC /inference.GRPCInferenceService/ModelInfer 404" in line
               and f"model=mlp\\n{forged}\\x1b[31m " in line for line in access), access


# Lines of every length: short, near PIPE_BUF, and past it (a 9000-byte one must be cut, not torn);
# a multi-byte character so a cut must land between characters.
CHATTY = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "x").as_numpy()
            for size in (80, 1500, 3900, 9000):
                pb_utils.Logger.log_info(f"chatty {size} " + "\\u00e9" * (size // 2) + " end")
        return [pb_utils.InferenceResponse([pb_utils.Tensor("y", 2 * x)]) for request in requests]
"""
TEXT_LINE = re.compile(  # a text line's start: time, level, process[pid]
    r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} [A-Z]+ (supervisor|gateway-\d|worker-\d|spare-\d)\[\d+\] ")


class PipedStack(Stack):
    """A stack whose processes all write their log lines into one pipe, as under Docker or journald,
    read by a thread of the test into `captured`. The pipe is non-blocking (as a process sharing it may
    make it: asyncio's connect_write_pipe does) and the reader slow, so that writers find it full."""

    def start(self, *args, **kwargs) -> Stack:
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        self.captured = bytearray()
        self.reader = threading.Thread(target=self._read, args=(read_fd,), daemon=True)
        self.reader.start()
        with open(write_fd, "wb", buffering=0) as self.stderr:  # the children keep their own copy of the fd
            return super().start(*args, **kwargs)

    def _read(self, fd: int) -> None:
        with open(fd, "rb", buffering=0) as pipe:
            while (chunk := pipe.read(1 << 14)) != b"":
                self.captured += chunk
                time.sleep(0.001)


@pytest.mark.parametrize("log_format", ["json", "text"])
def test_lines_from_every_process_sharing_one_pipe_are_never_torn_and_long_ones_are_cut_with_a_marker(
        tmp_path: Path, runtime_dir: str, log_format: str) -> None:
    """Supervisor, two gateways, two workers (and the idle spare) at DEBUG, the access log on, a model that
    logs lines up to 9000 bytes for each of many concurrent requests: every line arrives whole. (Before:
    with a blocking pipe, 6 to 10 lines in 2000 came torn, the 9000-byte ones written in pieces with other
    lines between; with this non-blocking one, a fifth of the lines were lost to BlockingIOError.)"""
    repo = tmp_path / "models"
    write_python_model(repo, "chatty", CHATTY, {"max_batch_size": 8, "input": [{"name": "x", "data_type": "TYPE_FP32",
                       "dims": [4]}], "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [4]}],
                       "dynamic_batching": {}})
    body = {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
    with running_stack(repo, "--log-format", log_format, "--log-level", "DEBUG", "--access-log", "--gateways", "2",
                       "--workers", "2", "--warm-spare", "--runtime-dir", runtime_dir, stack_class=PipedStack) as stack:
        poll_for(lambda: all(gateway_ready(runtime_dir, k) for k in range(2)), 30, what="both gateways ready")
        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            answers = list(pool.map(lambda _: stack.post("/v2/models/chatty/infer", body), range(400)))
        assert stack.stop() == 0
    stack.reader.join(timeout=30)
    assert not stack.reader.is_alive()
    assert {status for status, _ in answers} == {200}

    lines = bytes(stack.captured).decode(errors="replace").splitlines()
    chatty = [line for line in lines if "model chatty: chatty " in line]
    if log_format == "json":
        torn = [line for line in lines if not _is_json_object(line)]
        assert not torn, f"{len(torn)} of {len(lines)} lines torn: {torn[:3]}"
        records = [json.loads(line) for line in lines]
        assert {(r["role"], r["index"]) for r in records} >= {
            ("supervisor", None), ("gateway", 0), ("gateway", 1), ("worker", 0), ("worker", 1)}
        messages = [r["message"] for r in records if "model chatty: chatty " in r["message"]]
    else:
        torn = [line for line in lines if not TEXT_LINE.match(line)]
        assert not torn, f"{len(torn)} of {len(lines)} lines torn: {torn[:3]}"
        assert {"supervisor", "gateway-0", "gateway-1", "worker-0", "worker-1"} <= {
            TEXT_LINE.match(line)[1] for line in lines}
        messages = chatty
    assert not [line for line in lines if "\ufffd" in line]  # (no cut inside a character)
    sizes = collections.Counter(int(line.split("chatty: chatty ")[1].split()[0]) for line in chatty)
    assert sizes == {80: 400, 1500: 400, 3900: 400, 9000: 400}  # none lost (a full pipe waited for)
    assert max(len(line.encode()) + 1 for line in lines) <= LINE_BYTES
    # The lines that fit come whole; the 9000-byte one is cut in its middle with the marker, its end kept.
    whole = [m for m in messages if "chatty 3900 " in m]
    assert whole and all(m.endswith("\u00e9" * 1950 + " end") for m in whole)
    cut = [m for m in messages if "chatty 9000 " in m]
    assert all(CUT_MARKER_PATTERN.search(m) and m.endswith("\u00e9 end") for m in cut)


def _is_json_object(line: str) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False
