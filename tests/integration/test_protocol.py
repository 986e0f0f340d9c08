"""KServe v2 over plain HTTP against the real stack: binary framing, OpenAPI, repository, statistics, API key."""
from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from ringserve.gateway.observe.metrics import Metrics
from ringserve.gateway.http.openapi import openapi_document
from ringserve.gateway.http.routes import Endpoints

from tests.support import rawhttp
from tests.support.stack import Stack, running_stack

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def http(stack: Stack):
    with httpx.Client(base_url=stack.url, timeout=30) as client:
        yield client


def mlp_alone(repo: Path, x: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(str(repo / "mlp" / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def binary_request(doc: dict, *tensors: np.ndarray) -> tuple[bytes, dict[str, str]]:
    header = json.dumps(doc).encode()
    return header + b"".join(t.tobytes() for t in tensors), {"Inference-Header-Content-Length": str(len(header))}


def split(response: httpx.Response) -> tuple[dict, bytes]:
    length = int(response.headers["inference-header-content-length"])
    return json.loads(response.content[:length]), response.content[length:]


# -- binary tensor extension --------------------------------------------------------------
def test_binary_request_and_binary_response_with_headers(http, repo):
    x = np.random.default_rng(0).standard_normal((3, 512)).astype(np.float32)
    body, headers = binary_request({"id": "b1", "inputs": [{"name": "x", "shape": [3, 512], "datatype": "FP32",
                                                            "parameters": {"binary_data_size": x.nbytes}}],
                                    "outputs": [{"name": "y", "parameters": {"binary_data": True}}]}, x)

    r = http.post("/v2/models/mlp/infer", content=body, headers=headers)

    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/octet-stream"
    doc, rest = split(r)
    assert doc["id"] == "b1"
    assert doc["outputs"] == [{"name": "y", "datatype": "FP32", "shape": [3, 10], "parameters": {"binary_data_size": 120}}]
    np.testing.assert_allclose(np.frombuffer(rest, np.float32).reshape(3, 10), mlp_alone(repo, x), atol=1e-5)


def test_raw_binary_request_is_the_single_input(http, repo):
    x = np.random.default_rng(1).standard_normal((2, 512)).astype(np.float32)

    r = http.post("/v2/models/mlp/infer", content=x.tobytes(), headers={"Inference-Header-Content-Length": "0"})

    assert r.status_code == 200, r.text
    doc, rest = split(r)
    assert doc["outputs"][0]["shape"] == [2, 10]
    np.testing.assert_allclose(np.frombuffer(rest, np.float32).reshape(2, 10), mlp_alone(repo, x), atol=1e-5)


def test_gzip_request_and_response(http, repo):
    x = np.random.default_rng(2).standard_normal((40, 512)).astype(np.float32)
    doc = {"inputs": [{"name": "x", "shape": [40, 512], "datatype": "FP32", "data": x.ravel().tolist()}]}

    r = http.post("/v2/models/mlp/infer", content=gzip.compress(json.dumps(doc).encode()),
                  headers={"Content-Encoding": "gzip", "Accept-Encoding": "gzip"})

    assert r.status_code == 200, r.text
    assert r.headers["content-encoding"] == "gzip"  # httpx decoded it for us
    y = np.asarray(r.json()["outputs"][0]["data"], np.float32).reshape(40, 10)
    np.testing.assert_allclose(y, mlp_alone(repo, x), atol=1e-5)


def test_small_responses_are_not_compressed(http):
    doc = {"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32", "data": [0.0] * 512}]}
    r = http.post("/v2/models/mlp/infer", json=doc, headers={"Accept-Encoding": "gzip"})
    assert r.status_code == 200 and "content-encoding" not in r.headers


def test_a_bytes_model_runs_through_the_ring(http, stack, repo):
    """(tests/integration/test_bytes.py covers BYTES through the ring in depth.)"""
    lane = lambda: next(w for w in stack.status()["workers"] if "strings" in w["models"])  # noqa: E731
    before = lane()["batches_done"]
    doc = {"inputs": [{"name": "text", "shape": [1, 2], "datatype": "BYTES", "data": ["a", "zwölf"]}]}

    r = http.post("/v2/models/strings/infer", json=doc)

    session = ort.InferenceSession(str(repo / "strings/1/model.onnx"), providers=["CPUExecutionProvider"])
    expected = session.run(None, {"text": np.array([["a", "zwölf"]], dtype=object)})[0]
    assert r.status_code == 200, r.text
    (out,) = r.json()["outputs"]
    assert out["datatype"] == "BYTES" and out["shape"] == [1, 2] and out["data"] == expected.ravel().tolist()
    assert lane()["batches_done"] == before + 1


# -- OpenAPI ---------------------------------------------------------------------------------
def app_routes() -> set[tuple[str, str]]:
    endpoints = Endpoints(None, 1)  # routes() needs no data plane
    return {(route.path, method.lower()) for route in endpoints.routes() for method in route.methods
            if method != "HEAD"}


def documented_routes(doc: dict) -> set[tuple[str, str]]:
    return {(path, method) for path, ops in doc["paths"].items() for method in ops if method != "parameters"}


def test_openapi_documents_every_route_and_only_those(http):
    served = http.get("/openapi.json").json()

    assert served == openapi_document()
    assert served["openapi"].startswith("3.")
    assert documented_routes(served) == app_routes()
    for path, ops in served["paths"].items():
        declared = set(re.findall(r"{(\w+)}", path))
        for method, op in ops.items():
            assert {p["name"] for p in op.get("parameters", []) if p["in"] == "path"} == declared, (path, method)
            assert "200" in op["responses"], (path, method)


def test_every_documented_route_answers_on_the_live_server(http):
    for path, method in sorted(documented_routes(openapi_document())):
        url = path.replace("{model}", "mlp").replace("{version}", "1")
        if url.endswith("/unload"):
            continue  # changes what the other tests see; covered below
        if "sharedmemory/region/" in url and not url.endswith("/unregister"):
            continue  # a region must be registered first (a client's segment): tests/integration/test_shm_regions.py
        if url.startswith("/v1/") and method == "post":
            continue  # OpenAI's bodies, for text models: tests/integration/test_openai.py
        body = {"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32", "data": [0.0] * 512}]}
        if url.endswith(("/logging", "/trace/setting")):
            body = {}  # (an unknown setting is refused: tests/integration/test_runtime_settings.py)
        r = http.request(method.upper(), url, json=body if method == "post" else None)
        if "sharedmemory" in url and url.endswith("/unregister"):  # client shm is off by default, as Triton's
            assert (r.status_code, r.json()["error"].split(".")[0]) == (501, "Client shared memory is disabled"), url
            continue
        assert r.status_code == 200, (method, url, r.text)


def test_unknown_routes_and_methods_are_json_errors(http):
    r = http.get("/v2/nothing/here")
    assert r.status_code == 404 and "routes are listed in /openapi.json" in r.json()["error"]
    r = http.get("/v2/models/mlp/infer")
    assert r.status_code == 405 and "use POST" in r.json()["error"]
    r = http.post("/v2/models/a/b/infer", json={})
    assert r.status_code == 404 and "model names cannot contain '/'" in r.json()["error"]


# -- repository --------------------------------------------------------------------------------
def test_repository_index_lists_every_model_with_its_state(http):
    index = http.post("/v2/repository/index").json()

    assert [m["name"] for m in index] == ["alltypes", "auto", "encoder", "mlp", "strings"]
    assert all(m["state"] == "READY" and m["version"] == "1" for m in index)
    assert http.post("/v2/repository/index", json={"ready": "yes"}).status_code == 400


def test_unload_makes_the_model_unavailable_and_load_serves_it_again(http, stack):
    doc = {"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32", "data": [0.0] * 512}]}
    assert http.post("/v2/repository/models/auto/unload").status_code == 200
    try:
        assert http.get("/v2/models/auto/ready").status_code == 503
        r = http.post("/v2/models/auto/infer", json=doc)
        assert r.status_code == 503 and "is not loaded" in r.json()["error"] and r.headers["retry-after"]
        entry = next(m for m in http.post("/v2/repository/index").json() if m["name"] == "auto")
        assert entry["state"] == "UNAVAILABLE" and "unloaded" in entry["reason"]
        assert [m["name"] for m in http.post("/v2/repository/index", json={"ready": True}).json()] == [
            "alltypes", "encoder", "mlp", "strings"]
        assert http.post("/v2/models/mlp/infer", json=doc).status_code == 200  # the others keep serving
    finally:
        assert http.post("/v2/repository/models/auto/load", json={}).status_code == 200
    assert http.get("/v2/models/auto/ready").json() == {"name": "auto", "ready": True}
    assert http.post("/v2/models/auto/infer", json=doc).status_code == 200


def test_load_re_reads_config_json(http, repo):
    config_path = repo / "mlp" / "config.json"
    original = config_path.read_text()
    config = json.loads(original)
    config["dynamic_batching"]["max_queue_delay_microseconds"] = 1234
    config_path.write_text(json.dumps(config))
    try:
        assert http.post("/v2/repository/models/mlp/load").status_code == 200
        assert http.get("/v2/models/mlp/config").json()["dynamic_batching"]["max_queue_delay_microseconds"] == 1234
    finally:
        config_path.write_text(original)
        assert http.post("/v2/repository/models/mlp/load").status_code == 200
    assert http.get("/v2/models/mlp/config").json()["dynamic_batching"]["max_queue_delay_microseconds"] == 0


def test_load_of_a_new_version_says_the_workers_need_a_reload(http, repo):
    (repo / "auto" / "2").mkdir()
    (repo / "auto" / "2" / "model.onnx").write_bytes((repo / "auto" / "1" / "model.onnx").read_bytes())
    try:
        r = http.post("/v2/repository/models/auto/load")
    finally:
        (repo / "auto" / "2" / "model.onnx").unlink()
        (repo / "auto" / "2").rmdir()
    assert r.status_code == 400
    assert "its version changed on disk (1 -> 2)" in r.json()["error"] and "SIGHUP" in r.json()["error"]
    assert http.get("/v2/models/auto/ready").status_code == 200  # still serving version 1


@pytest.mark.parametrize("path, status, says", [
    ("/v2/repository/models/ghost/load", 404, "model 'ghost' is not served here"),
    ("/v2/repository/models/ghost/unload", 404, "model 'ghost' is not served here"),
    ("/v2/repository/models/..%2Fetc/load", 404, "no route"),
    ("/v2/repository/models/../load", 400, "invalid model name '..', model name must not contain path traversal"),
])
def test_load_and_unload_of_unknown_or_invalid_names(stack, path, status, says):
    r = rawhttp.request(stack.port, "POST", path)  # as sent: an HTTP client would resolve the '..'
    assert r.status == status and says in r.json()["error"]


def test_load_refuses_configs_in_the_request(http):
    r = http.post("/v2/repository/models/mlp/load", json={"parameters": {"config": "{}"}})
    assert r.status_code == 400 and "edit mlp/config.json" in r.json()["error"]


# -- statistics -----------------------------------------------------------------------------
def mlp_stats(http) -> dict:
    (stats,) = http.get("/v2/models/mlp/stats").json()["model_stats"]
    return stats


def test_statistics_count_successes_failures_queue_and_compute(http):
    before = mlp_stats(http)
    good = {"inputs": [{"name": "x", "shape": [2, 512], "datatype": "FP32", "data": [0.5] * 1024}]}
    for _ in range(3):
        assert http.post("/v2/models/mlp/infer", json=good).status_code == 200
    assert http.post("/v2/models/mlp/infer", json={"inputs": []}).status_code == 400

    after = mlp_stats(http)

    def delta(*keys: str) -> int:
        return _get(after, keys) - _get(before, keys)

    assert delta("inference_stats", "success", "count") == 3
    assert delta("inference_stats", "fail", "count") == 1
    assert delta("inference_count") == 6
    assert delta("inference_stats", "queue", "count") == 3
    assert 1 <= delta("inference_stats", "compute_infer", "count") <= 3
    assert delta("execution_count") == delta("inference_stats", "compute_infer", "count")
    assert delta("inference_stats", "success", "ns") > delta("inference_stats", "compute_infer", "ns") > 0
    assert after["last_inference"] >= max(before["last_inference"], 1)
    assert after["version"] == "1"
    names = [m["name"] for m in http.get("/v2/models/stats").json()["model_stats"]]
    assert names == ["alltypes", "auto", "encoder", "mlp", "strings"]
    assert http.get("/v2/models/mlp/versions/2/stats").status_code == 404


def test_statistics_have_per_batch_size_entries(http):
    good = {"inputs": [{"name": "x", "shape": [3, 512], "datatype": "FP32", "data": [0.5] * 1536}]}
    assert http.post("/v2/models/mlp/infer", json=good).status_code == 200
    sizes = {b["batch_size"]: b["compute_infer"]["count"] for b in mlp_stats(http)["batch_stats"]}
    assert sizes.get(3, 0) >= 1


def _get(doc: dict, keys: tuple[str, ...]):
    for key in keys:
        doc = doc[key]
    return doc


# -- API key --------------------------------------------------------------------------------
KEY = "s3cret-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
GOOD = {"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32", "data": [0.0] * 512}]}


def test_api_key_guards_inference_models_repository_and_admin(start_stack, repo: Path, tmp_path: Path):
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    stack = start_stack(repo, "--api-key-file", str(key_file))
    with httpx.Client(base_url=stack.url, timeout=30) as http:
        for method, path in [("POST", "/v2/models/mlp/infer"), ("GET", "/v2/models/mlp"), ("GET", "/v2"),
                             ("POST", "/v2/repository/index"), ("GET", "/admin/status"), ("GET", "/v2/models/stats")]:
            r = http.request(method, path, json=GOOD)
            assert r.status_code == 401, path
            assert "needs the server's API key" in r.json()["error"] and r.headers["www-authenticate"] == "Bearer"
            r = http.request(method, path, json=GOOD, headers={"Authorization": "Bearer wrong"})
            assert r.status_code == 401 and "is wrong" in r.json()["error"]
            r = http.request(method, path, json=GOOD, headers={"Authorization": f"Bearer {KEY}"})
            assert r.status_code == 200, (path, r.text)
        for path in ("/v2/health/live", "/v2/health/ready", "/metrics", "/openapi.json"):
            assert http.get(path).status_code == 200, path


class KeyedStack(Stack):
    """A stack whose every route needs the key: readiness is polled with it."""

    def is_ready(self) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(f"ringserve exited with {self.process.returncode} before it was ready")
        try:
            return httpx.get(self.url + "/v2/health/ready", headers=AUTH, timeout=1).status_code == 200
        except httpx.TransportError:
            return False


@pytest.fixture
def keyed_stack(repo: Path):
    with running_stack(repo, "--api-key-everywhere", env={"RINGSERVE_API_KEY": KEY}, stack_class=KeyedStack) as s:
        yield s


def test_api_key_from_the_environment_and_everywhere(keyed_stack: Stack):
    with httpx.Client(base_url=keyed_stack.url, timeout=30) as http:
        for path in ("/v2/health/live", "/metrics", "/openapi.json"):
            assert http.get(path).status_code == 401, path
            assert http.get(path, headers=AUTH).status_code == 200, path
        assert http.post("/v2/models/mlp/infer", json=GOOD, headers=AUTH).status_code == 200


def test_an_empty_api_key_file_stops_the_cli_with_a_usage_error(repo: Path, tmp_path: Path):
    empty = tmp_path / "empty"
    empty.write_text("\n")
    done = subprocess.run([sys.executable, "-P", "-m", "ringserve.cli", "serve", "--model-repository", str(repo),
                           "--api-key-file", str(empty)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "is empty" in done.stderr
