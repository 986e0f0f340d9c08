"""Triton's logging and trace extensions on the real stack (two gateways, a lane per model): a change made
through one gateway reaches every process, a worker started later included, with Triton's shapes and words."""
from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import grpc
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.support.otlp import OtlpReceiver
from tests.support.netns import NoNamespace
from tests.support.stack import Stack, free_port, poll_for, running_stack
from tests.support.triton_qa_runner import run_case
from .test_gateways import gateway_client, gateway_ready
from .test_gateways import runtime_dir as runtime_dir  # the fixture
from .test_logs import logged_to

pytestmark = pytest.mark.integration

GATEWAYS = 2
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "50"}
TRITON_DEFAULTS = {"log_file": "", "log_info": True, "log_warning": True, "log_error": True,
                   "log_verbose_level": 0, "log_format": "default"}


def start(stack: Stack, runtime_dir: str) -> Stack:
    stack.start()
    poll_for(lambda: all(gateway_ready(runtime_dir, k) for k in range(GATEWAYS)), 60, what="every gateway ready")
    return stack


@pytest.fixture
def logged_stack(demo_repo: Path, runtime_dir: str, tmp_path: Path) -> Iterator[tuple[Stack, Path]]:
    log_path = tmp_path / "stack.log"
    stack = logged_to(log_path)(demo_repo, "--gateways", str(GATEWAYS), "--runtime-dir", runtime_dir, "--lanes",
                                "model", "--warm-spare=false", "--log-format", "json", "--log-level", "INFO",
                                "--grpc-port", str(free_port()))
    try:
        yield start(stack, runtime_dir), log_path
    finally:
        try:
            stack.stop()
        finally:
            stack.kill_everything()
        stack.assert_nothing_left()


@pytest.fixture(scope="module")
def plain(demo_repo: Path) -> Iterator[Stack]:
    """One gateway at Triton's default log settings, for requests that are refused (they change nothing)."""
    with running_stack(demo_repo, "--warm-spare=false", "--log-level", "INFO", "--grpc-port", str(free_port())) as s:
        yield s


def records(log_path: Path) -> list[dict]:
    return [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]


def debug_from(log_path: Path) -> set[tuple[str, int | None, int | None]]:
    return {(r["role"], r["index"], r["generation"]) for r in records(log_path) if r["level"] == "DEBUG"}


def mlp_body(rows: int = 1) -> dict:
    x = np.random.default_rng(3).standard_normal((rows, 512)).astype(np.float32)
    return {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}


def test_a_log_level_set_through_one_gateway_reaches_every_process_and_a_worker_replaced_after_sigkill(
        logged_stack: tuple[Stack, Path], runtime_dir: str) -> None:
    stack, log_path = logged_stack
    workers = {(w["index"], w["generation"]): w["pid"] for w in stack.status()["workers"]}
    assert len(workers) >= 2 and debug_from(log_path) == set()  # (INFO by default: no DEBUG line yet)

    with gateway_client(runtime_dir, 0) as gateway0, gateway_client(runtime_dir, 1) as gateway1:
        answer = gateway0.post("/v2/logging", json={"log_verbose_level": 1})
        assert answer.status_code == 200 and answer.json() == {**TRITON_DEFAULTS, "log_verbose_level": 1,
                                                               "log_format": "json"}
        assert gateway1.get("/v2/logging").json()["log_verbose_level"] == 1  # (the POST answers once sent to all)

        everyone = {("supervisor", None, None), ("gateway", 0, 0), ("gateway", 1, 0)}
        everyone |= {("worker", index, generation) for index, generation in workers}
        poll_for(lambda: everyone <= debug_from(log_path), 10, what="a DEBUG line from every process")

        # A worker killed and replaced starts with the level a client set, not its flags'.
        (index, generation), pid = next(iter(workers.items()))
        os.kill(pid, signal.SIGKILL)
        poll_for(lambda: any(w["index"] == index and w["generation"] > generation and w["state"] == "ready"
                             for w in stack.status()["workers"]), 60, what="the worker replaced")
        poll_for(lambda: any(role == "worker" and i == index and g > generation
                             for role, i, g in debug_from(log_path)), 10, what="a DEBUG line from the replacement")

        # Switched off again: a line at INFO says so, and no process writes DEBUG any more.
        assert gateway1.post("/v2/logging", json={"log_verbose_level": 0}).json()["log_verbose_level"] == 0
        lines_before = len(records(log_path))
        assert stack.post("/v2/models/mlp/infer", mlp_body())[0] == 200
        poll_for(lambda: sum("log_verbose_level=0" in r["message"] for r in records(log_path)) >= 4, 10,
                 what="every process's line about the change")
        assert [r for r in records(log_path)[lines_before:] if r["level"] == "DEBUG"] == []


def test_log_and_trace_settings_round_trip_through_tritonclient_grpc_and_http(logged_stack: tuple[Stack, Path],
                                                                               runtime_dir: str) -> None:
    stack, _ = logged_stack
    grpc_port = int(stack.args[stack.args.index("--grpc-port") + 1])
    http = httpclient.InferenceServerClient(f"127.0.0.1:{stack.port}")
    rpc = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    try:
        changed = rpc.update_log_settings({"log_warning": False, "log_format": "ISO8601"}, as_json=True)
        assert changed["settings"]["log_warning"] == {"bool_param": False}
        assert changed["settings"]["log_format"] == {"string_param": "ISO8601"}
        assert changed["settings"]["log_verbose_level"] == {"uint32_param": 0}
        assert http.get_log_settings() == {**TRITON_DEFAULTS, "log_warning": False, "log_format": "ISO8601"}
        assert http.update_log_settings({"log_warning": True, "log_format": "json", "log_verbose_level": 2}) == {
            **TRITON_DEFAULTS, "log_format": "json", "log_verbose_level": 2}
        assert rpc.get_log_settings(as_json=True)["settings"]["log_format"] == {"string_param": "json"}

        # Tracing is off in this server (no OTLP endpoint): the settings read OFF; a rate may be set.
        assert http.get_trace_settings() == {"trace_level": ["OFF"], "trace_rate": "1", "trace_count": "-1",
                                             "trace_mode": "opentelemetry"}
        model = rpc.update_trace_settings("mlp", {"trace_rate": "10", "trace_count": "5"}, as_json=True)
        assert model["settings"]["trace_rate"] == {"value": ["10"]} and model["settings"]["trace_count"] == {
            "value": ["5"]}
        assert http.get_trace_settings("mlp")["trace_rate"] == "10"
        assert http.get_trace_settings()["trace_rate"] == "1"  # the global one is untouched
        assert http.update_trace_settings("mlp", {"trace_rate": None})["trace_rate"] == "1"  # null: the global's
        with gateway_client(runtime_dir, 1) as gateway1:
            assert gateway1.get("/v2/models/mlp/trace/setting").json()["trace_count"] == "5"

        # A gateway killed and restarted starts with the settings a client set (the supervisor's file).
        pid = next(g["pid"] for g in stack.status()["gateways"] if g["index"] == 1)
        os.kill(pid, signal.SIGKILL)
        poll_for(lambda: any(g["index"] == 1 and g["pid"] not in (None, pid) for g in stack.status()["gateways"]),
                 30, what="gateway 1 restarted")
        poll_for(lambda: gateway_ready(runtime_dir, 1), 60, what="gateway 1 ready again")
        with gateway_client(runtime_dir, 1) as gateway1:
            assert gateway1.get("/v2/logging").json()["log_verbose_level"] == 2
            assert gateway1.get("/v2/models/mlp/trace/setting").json()["trace_count"] == "5"
    finally:
        http.close()
        rpc.close()


@pytest.mark.parametrize(("path", "body", "status", "words"), [
    ("/v2/logging", {"log_file": "a.log"}, 501, "log file location can not be updated through network protocol"),
    ("/v2/logging", {"log_info": "yes"}, 400, "attempt to access JSON non-boolean as boolean"),
    ("/v2/logging", {"log_verbose_level": -1}, 400, "attempt to access JSON non-unsigned-integer as unsigned"),
    ("/v2/logging", {"log_format": "xml"}, 400, "invalid argument for --log_format, got: xml"),
    ("/v2/logging", {"log_levels": 1}, 400, "unknown log setting 'log_levels'"),
    ("/v2/logging", {"log_verbose_level": "1"}, 400, "attempt to access JSON non-unsigned-integer as unsigned"),
    ("/v2/logging", {"log_error": "false"}, 400, "attempt to access JSON non-boolean as boolean"),
    ("/v2/trace/setting", {"trace_file": "t.json"}, 501,
     "trace file location can not be updated through network protocol"),
    ("/v2/trace/setting", {"trace_level": ["OFF", "TIMESTAMPS"]}, 400,
     "Expect only one trace level 'OFF' is specified"),
    ("/v2/trace/setting", {"trace_level": "TIMESTAMPS"}, 400, "attempt to access JSON non-array as array"),
    ("/v2/trace/setting", {"trace_level": ["TIMESTAMPS"]}, 400, "tracing is off in this server"),
    ("/v2/trace/setting", {"trace_rate": "often"}, 400, "Unable to parse 'trace_rate', got: often"),
    ("/v2/trace/setting", {"trace_count": "-2"}, 400, "Unable to parse 'trace_count'. Expecting value >= -1, got:-2"),
    ("/v2/trace/setting", {"log_frequency": "10"}, 400, "Unable to set 'log_frequency'"),
    ("/v2/models/nope/trace/setting", {}, 400, "Request for unknown model : nope"),
])
def test_bad_settings_get_tritons_words_and_change_nothing(plain: Stack, path: str, body: dict, status: int,
                                                           words: str) -> None:
    answer = httpx.post(plain.url + path, json=body, timeout=30)
    assert answer.status_code == status and words in answer.json()["error"], answer.text
    assert plain.get("/v2/logging")[1] == TRITON_DEFAULTS


def test_grpc_refusals_carry_tritons_grpc_words(plain: Stack) -> None:
    grpc_port = int(plain.args[plain.args.index("--grpc-port") + 1])
    with grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}") as client:
        for settings, words in [({"log_file": "a"}, "log file location can not be updated"),
                                ({"log_format": "xml"}, "invalid argument for log_format, got: xml")]:
            with pytest.raises(InferenceServerException, match=words):
                client.update_log_settings(settings)
        with grpc.insecure_channel(f"127.0.0.1:{grpc_port}") as channel:  # (tritonclient sends the right types)
            request = pb.LogSettingsRequest()
            request.settings["log_info"].string_param = "yes"
            with pytest.raises(grpc.RpcError) as refused:
                service_pb2_grpc.GRPCInferenceServiceStub(channel).LogSettings(request, timeout=30)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert refused.value.details() == "expect boolean for 'log_info'"
        with pytest.raises(InferenceServerException, match="Request for unknown model : nope"):
            client.get_trace_settings("nope")
        with pytest.raises(InferenceServerException, match="Expect only one trace level 'OFF'"):
            client.update_trace_settings(settings={"trace_level": ["OFF", "TIMESTAMPS"]})


def test_trace_level_rate_and_count_set_at_run_time_decide_which_requests_are_traced(
        start_stack, demo_repo: Path) -> None:
    with OtlpReceiver() as receiver:
        stack: Stack = start_stack(demo_repo, "--warm-spare=false", "--otel-endpoint", receiver.endpoint,
                                   env=FAST_EXPORT)
        assert stack.get("/v2/trace/setting")[1]["trace_level"] == ["TIMESTAMPS"]  # (on with an endpoint)
        assert stack.post("/v2/trace/setting", {"trace_level": ["OFF"]})[0] == 200
        for _ in range(3):
            assert stack.post("/v2/models/mlp/infer", mlp_body())[0] == 200
        assert stack.post("/v2/trace/setting", {"trace_level": ["TIMESTAMPS"], "trace_rate": "2",
                                                "trace_count": "3"})[0] == 200
        for _ in range(10):  # every second one, three at most: the 2nd, 4th and 6th
            assert stack.post("/v2/models/mlp/infer", mlp_body())[0] == 200
        assert stack.get("/v2/trace/setting")[1]["trace_count"] == "0"
        spans = lambda: [len(receiver.named(name)) for name in ("POST ", "batch ", "execute ")]  # noqa: E731
        poll_for(lambda: min(spans()) >= 3, 10, what="the traced requests' spans, from the gateway and the worker")
        time.sleep(0.3)  # (a fourth one would be here by now: spans leave within 50 ms of their end)
        assert spans() == [3, 3, 3]


def test_tritons_own_logging_endpoint_qa_passes_against_ringserve(demo_repo: Path, tmp_path: Path) -> None:
    """qa/L0_logging/logging_endpoint_test.py, unchanged: HTTP and gRPC reads and updates, on localhost:8000/8001
    (run_case gives it a network namespace of its own). Triton's defaults are --log-level INFO's."""
    try:
        result = run_case(demo_repo, "L0_logging/logging_endpoint_test.py", "LogEndpointTest", {}, tmp_path,
                          serve_flags=("--log-level", "INFO", "--warm-spare=false"))
    except NoNamespace as exc:
        pytest.skip(f"Triton's QA needs localhost:8000 and :8001 of its own: {exc}")
    assert result["stage"] == "test" and result["returncode"] == 0, result["output"][-4000:]
    assert "Ran 4 tests" in result["output"] and "OK" in result["output"]
