"""Triton's model control on the real stack: the tools that drive Triton drive ringserve.

- explicit mode starts with what --load-model names (none: still ready), and ModelMesh's Triton adapter's own
  call sequence (model-mesh-triton-adapter/server/server.go) loads, serves and unloads a model written after
  the start;
- a load carries Triton's `config` override and `file:` contents, over HTTP and gRPC (tritonclient's calls);
- poll mode serves a model added to the repository and drops one removed from it;
- a load and an unload under traffic to another model cost that traffic no request;
- KServe's Triton runtime's command line (`ringserve-tritonserver --model-store=...`) serves over HTTP and gRPC,
  and refuses loads in Triton's words (model control mode none).
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support.lifecycle_models import WIDTH, build_versioned, infer_body, versioned_model
from tests.support.stack import Stack, free_port, poll_for, running_stack
from .test_systemd import Load

pytestmark = pytest.mark.integration

TRITONSERVER = Path(sys.executable).parent / "ringserve-tritonserver"
EXPLICIT = ("--model-control-mode", "explicit")


def config_json(max_batch_size: int = 8) -> str:
    """Triton's JSON form of a ModelConfig (as Model Analyzer and tritonclient send it: int64 as strings)."""
    return json.dumps({
        "backend": "onnxruntime",
        "max_batch_size": max_batch_size,
        "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [str(WIDTH)]}],
        "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": ["1"]}],
        "dynamic_batching": {},
    })


def onnx_bytes(name: str, version: int) -> bytes:
    """An ONNX model that answers sum(x) + version."""
    return versioned_model(name, version, 64).SerializeToString()


def grpc_infer(client: grpcclient.InferenceServerClient, model: str, value: float = 1.0) -> float:
    x = grpcclient.InferInput("x", [1, WIDTH], "FP32")
    x.set_data_from_numpy(np.full((1, WIDTH), value, np.float32))
    return float(client.infer(model, [x]).as_numpy("y")[0, 0])


def answer(stack: Stack, model: str) -> tuple[int, float | str]:
    status, body = stack.post(f"/v2/models/{model}/infer", infer_body())
    return status, (body["outputs"][0]["data"][0] if status == 200 else body["error"])


def test_modelmeshs_call_sequence_loads_serves_and_unloads_a_model_written_after_an_empty_start(tmp_path: Path):
    repo = tmp_path / "models"
    repo.mkdir()
    grpc_port = free_port()
    with running_stack(repo, *EXPLICIT, "--grpc-port", str(grpc_port)) as stack:
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        try:
            # RuntimeStatus: ready with no model; every ready model unloaded; the server's version read.
            assert client.is_server_live() and client.is_server_ready()
            assert client.get_model_repository_index(as_json=True).get("models", []) == []
            assert client.get_server_metadata().version
            # LoadModel: the adapter writes the model's folder under the repository, then RepositoryModelLoad.
            build_versioned(repo, "mm-model-1", weight_bytes=64)
            client.load_model("mm-model-1")
            assert client.is_model_ready("mm-model-1")
            assert grpc_infer(client, "mm-model-1") == WIDTH + 1
            ready = client.get_model_repository_index(as_json=True)["models"]
            assert [(m["name"], m["state"]) for m in ready] == [("mm-model-1", "READY")]
            # UnloadModel: RepositoryModelUnload, then the folder is deleted.
            client.unload_model("mm-model-1")
            shutil.rmtree(repo / "mm-model-1")
            with pytest.raises(InferenceServerException) as refused:
                grpc_infer(client, "mm-model-1")
            assert refused.value.status() == "StatusCode.NOT_FOUND"
            client.unload_model("mm-model-1")  # again: a model not served is no error (the adapter allows it)
            assert client.is_server_ready()
        finally:
            client.close()


def test_explicit_mode_serves_only_what_load_model_names_and_the_rest_on_load(tmp_path: Path):
    repo = tmp_path / "models"
    build_versioned(repo, "a", weight_bytes=64)
    build_versioned(repo, "b", versions=(2,), weight_bytes=64)
    with running_stack(repo, *EXPLICIT, "--load-model", "a") as stack:
        assert answer(stack, "a") == (200, WIDTH + 1)
        assert answer(stack, "b")[0] == 404
        index = {m["name"]: m["state"] for m in stack.post("/v2/repository/index", {})[1]}
        assert index == {"a": "READY", "b": "UNAVAILABLE"}

        status, body = stack.post("/v2/repository/models/ghost/load", {})
        assert status == 404 and body["error"].startswith("failed to load 'ghost', failed to poll from model repository")
        assert stack.post("/v2/repository/models/b/load", {}) == (200, {})
        assert answer(stack, "b") == (200, WIDTH + 2)
        assert answer(stack, "a") == (200, WIDTH + 1)


def test_a_load_takes_tritons_config_override_and_file_contents_over_http_and_grpc(tmp_path: Path):
    repo = tmp_path / "models"
    build_versioned(repo, "m", weight_bytes=64, max_batch_size=64)
    grpc_port = free_port()
    with running_stack(repo, *EXPLICIT, "--load-model", "m", "--grpc-port", str(grpc_port)) as stack:
        http = httpclient.InferenceServerClient(stack.url.removeprefix("http://"))
        rpc = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        try:
            # A config override of a served model: its files from the repository, its config from the request.
            http.load_model("m", config=config_json(max_batch_size=4))
            assert stack.get("/v2/models/m/config")[1]["max_batch_size"] == 4
            assert answer(stack, "m") == (200, WIDTH + 1)
            # A model that is nowhere on disk: config and files in the request (base64 over HTTP, bytes over gRPC).
            http.load_model("over-http", config=config_json(), files={"file:3/model.onnx": onnx_bytes("over-http", 3)})
            rpc.load_model("over-grpc", config=config_json(), files={"file:7/model.onnx": onnx_bytes("over-grpc", 7)})
            assert answer(stack, "over-http") == (200, WIDTH + 3)
            assert grpc_infer(rpc, "over-grpc") == WIDTH + 7
            assert answer(stack, "m") == (200, WIDTH + 1)
            # A load without the override serves the repository's files and config again, as Triton's does.
            http.load_model("m")
            assert stack.get("/v2/models/m/config")[1]["max_batch_size"] == 64

            # Refusals, in Triton's words.
            for params, words in (
                ({"config": "{not json"}, "Invalid config override"),
                ({"file:1/model.onnx": "AAAA"}, "Load parameter 'config' must be specified for model file override"),
                ({"config": "{}", "file:../escape/model.onnx": "AAAA"}, "must stay within model directory"),
                ({"colour": "blue"}, "Unrecognized load parameter 'colour' with type 'STRING'"),
            ):
                status, body = stack.post("/v2/repository/models/m/load", {"parameters": params})
                assert status == 400 and words in body["error"], (params, body)
            with pytest.raises(InferenceServerException) as refused:
                rpc.load_model("m", config="[1, 2]")
            assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
            assert "Invalid config override" in refused.value.message()
            assert answer(stack, "m") == (200, WIDTH + 1)
        finally:
            http.close()
            rpc.close()


def test_poll_mode_serves_an_added_model_and_drops_a_removed_one(tmp_path: Path):
    repo = tmp_path / "models"
    build_versioned(repo, "kept", weight_bytes=64)
    build_versioned(repo, "leaving", weight_bytes=64)
    with running_stack(repo, "--model-control-mode", "poll", "--repository-poll-secs", "0.5") as stack:
        assert answer(stack, "leaving") == (200, WIDTH + 1)
        build_versioned(repo, "added", versions=(4,), weight_bytes=64)
        poll_for(lambda: answer(stack, "added")[0] == 200, 60, 0.2, what="the added model to serve")
        assert answer(stack, "added") == (200, WIDTH + 4)
        shutil.rmtree(repo / "leaving")
        poll_for(lambda: answer(stack, "leaving")[0] == 404, 60, 0.2, what="the removed model to go")
        assert answer(stack, "kept") == (200, WIDTH + 1)
        status, body = stack.post("/v2/repository/models/kept/load", {})
        assert status == 503 and body["error"].startswith(
            "explicit model load / unload is not allowed if polling is enabled")


def test_a_load_and_an_unload_under_traffic_to_another_model_fail_none_of_its_requests(tmp_path: Path):
    repo = tmp_path / "models"
    build_versioned(repo, "busy", weight_bytes=64)
    with running_stack(repo, *EXPLICIT, "--load-model", "busy") as stack:
        load = Load(stack.url, "/v2/models/busy/infer", infer_body(), clients=4).start()
        try:
            poll_for(lambda: load.count(200) >= 20, 30, what="traffic to run")
            build_versioned(repo, "newcomer", versions=(5,), weight_bytes=64)
            assert stack.post("/v2/repository/models/newcomer/load", {}) == (200, {})
            assert answer(stack, "newcomer") == (200, WIDTH + 5)
            assert stack.post("/v2/repository/models/newcomer/load", {"parameters": {"config": config_json(4)}}) \
                == (200, {})
            assert stack.post("/v2/repository/models/newcomer/unload", {}) == (200, {})
            settled_at = time.monotonic()
            poll_for(lambda: load.count(200, after=settled_at) >= 20, 30, what="traffic after the unload")
        finally:
            load.stop()
        assert load.failures() == []
        assert answer(stack, "newcomer")[0] == 404
        generations = [w["generation"] for w in stack.status()["workers"]]
        assert min(generations) >= 3  # each load and the unload was a new worker generation, not a restart


class TritonCommandLine(Stack):
    """The stack started as KServe's Triton runtime starts tritonserver, through ringserve-tritonserver."""

    def __init__(self, repo: Path, grpc_port: int, metrics_port: int) -> None:
        super().__init__(repo)
        self.grpc_port, self.metrics_port = grpc_port, metrics_port

    def start(self, ready_timeout_s: float = 60.0, wait_ready: bool = True) -> Stack:
        cmd = [str(TRITONSERVER), f"--model-store={self.repo}", f"--grpc-port={self.grpc_port}",
               f"--http-port={self.port}", "--allow-grpc=true", "--allow-http=true",
               f"--metrics-port={self.metrics_port}", "--log-info=false"]
        self.process = subprocess.Popen(cmd, env=self.env)
        Stack.started_pids.append(self.process.pid)
        poll_for(self.is_ready, ready_timeout_s, 0.05, "the stack to be ready")
        self.remember_children()
        return self


def test_kserves_triton_command_line_serves_a_model_over_http_and_grpc(tmp_path: Path):
    repo = tmp_path / "mnt-models"
    build_versioned(repo, "m", weight_bytes=64)
    stack = TritonCommandLine(repo, free_port(), free_port())
    try:
        stack.start()
        assert answer(stack, "m") == (200, WIDTH + 1)
        with grpc.insecure_channel(f"127.0.0.1:{stack.grpc_port}") as channel:
            grpc.channel_ready_future(channel).result(timeout=10)
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{stack.grpc_port}")
        try:
            assert grpc_infer(client, "m") == WIDTH + 1
            with pytest.raises(InferenceServerException) as refused:  # tritonserver's default mode: none
                client.load_model("m")
            assert refused.value.status() == "StatusCode.UNAVAILABLE"
            assert "explicit model load / unload is not allowed if polling is enabled" in refused.value.message()
        finally:
            client.close()
        with urllib.request.urlopen(f"http://127.0.0.1:{stack.metrics_port}/metrics", timeout=10) as response:
            metrics = response.read().decode()
        assert "nv_inference_request_success" in metrics
    finally:
        try:
            stack.stop()
        finally:
            stack.kill_everything()
        stack.assert_nothing_left()


def build_ensemble(repo: Path, name: str, step: str) -> None:
    """An ensemble of one step, `step` (x -> y)."""
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.json").write_text(json.dumps({
        "platform": "ensemble", "max_batch_size": 64,
        "input": [{"name": "x", "data_type": "TYPE_FP32", "dims": [WIDTH]}],
        "output": [{"name": "y", "data_type": "TYPE_FP32", "dims": [1]}],
        "ensemble_scheduling": {"step": [
            {"model_name": step, "model_version": -1, "input_map": {"x": "x"}, "output_map": {"y": "y"}}]},
    }))


def test_an_ensemble_loads_with_its_steps_and_unload_dependents_unloads_them_with_it(tmp_path: Path):
    repo = tmp_path / "models"
    build_versioned(repo, "step", versions=(6,), weight_bytes=64)
    build_ensemble(repo, "ens", "step")
    with running_stack(repo, *EXPLICIT) as stack:
        assert stack.post("/v2/repository/models/ens/load", {}) == (200, {})
        assert answer(stack, "ens") == (200, WIDTH + 6)
        assert answer(stack, "step") == (200, WIDTH + 6)

        assert stack.post("/v2/repository/models/ens/unload", {"parameters": {"unload_dependents": True}}) == (200, {})
        assert answer(stack, "ens")[0] == 404 and answer(stack, "step")[0] == 404
        states = {m["name"]: (m["state"], m["reason"]) for m in stack.post("/v2/repository/index", {})[1]}
        assert states == {"ens": ("UNAVAILABLE", "unloaded"), "step": ("UNAVAILABLE", "unloaded")}

        assert stack.post("/v2/repository/models/ens/load", {}) == (200, {})
        assert stack.post("/v2/repository/models/ens/unload", {}) == (200, {})  # without: the steps stay
        assert answer(stack, "ens")[0] == 404 and answer(stack, "step") == (200, WIDTH + 6)
