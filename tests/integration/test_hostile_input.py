"""Hostile and broken input against the real stack: a 4xx that says what was wrong and what is
accepted, nothing reaches a worker, nothing crashes, restarts or hangs, and the server keeps serving.

Documented choice: of the non-finite literals JSON lacks, ringserve reads NaN, Infinity and
-Infinity, as Triton does (tests/integration/test_triton_tensors.py); other spellings are a 400,
and numbers that overflow the datatype (1e39 as FP32) are refused, not turned into inf.
"""
from __future__ import annotations

import gzip
import json
import socket
import time

import httpx
import numpy as np
import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support import rawhttp
from tests.support.protocol_models import build_protocol_repo
from tests.support.stack import Stack, poll_for, running_stack

pytestmark = pytest.mark.integration

MAX_REQUEST_BYTES = 1 << 20
BODY_TIMEOUT_S = 1.0
MAX_HEADER_BYTES = 16 << 10
HEADER_TIMEOUT_S = 1.0
MAX_CONNECTIONS = 32


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    repo = build_protocol_repo(tmp_path_factory.mktemp("hostile-models"))
    with running_stack(repo, "--max-request-bytes", str(MAX_REQUEST_BYTES), "--body-timeout-s", str(BODY_TIMEOUT_S),
                       "--max-header-bytes", str(MAX_HEADER_BYTES), "--header-timeout-s", str(HEADER_TIMEOUT_S),
                       "--max-connections", str(MAX_CONNECTIONS)) as s:
        yield s


def gateway_pid(stack: Stack) -> int:
    return next(p.pid for p in psutil.Process(stack.pid).children() if "ringserve.gateway" in " ".join(p.cmdline()))


def worker_state(stack: Stack) -> list[tuple[int, int, int]]:
    """(index, generation, batches_done) of every worker: equal before and after = nothing ran, nothing restarted."""
    return [(w["index"], w["generation"], w["batches_done"]) for w in stack.status()["workers"]]


def mlp_doc(rows: int = 1, **change) -> dict:
    entry = {"name": "x", "shape": [rows, 512], "datatype": "FP32", "data": [0.5] * (rows * 512), **change}
    return {"inputs": [entry]}


def js(doc) -> bytes:
    return json.dumps(doc).encode()


def binary(doc: dict, tail: bytes) -> tuple[bytes, dict[str, str]]:
    header = js(doc)
    return header + tail, {"Inference-Header-Content-Length": str(len(header))}


def binary_x(nbytes: int, tail: bytes) -> tuple[bytes, dict[str, str]]:
    return binary({"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32",
                               "parameters": {"binary_data_size": nbytes}}]}, tail)


X_BYTES = np.zeros(512, np.float32).tobytes()
INFER = "/v2/models/mlp/infer"
REPOSITORY_INDEX = "/v2/repository/index"
SHM_REGISTER = "/v2/systemsharedmemory/region/r/register"

# (id, path, body, headers, cut, status, what the error says); cut: send only that many bytes and wait,
# or ("close", n): send n bytes and close the sending side.
CASES = [
    ("malformed-json", INFER, b'{"inputs": [', {}, None, 400, "request body is not valid JSON"),
    ("json-too-deep", INFER, b"[" * 5000 + b"]" * 5000, {}, None, 400, "may nest at most 1024 deep"),
    ("non-utf8-json", INFER, b'{"inputs": "\xff\xfe"}', {}, None, 400, "not valid JSON (UTF-8)"),
    ("minus-nan-in-json", INFER, js(mlp_doc())[:-7] + b"-NaN]}]}", {}, None, 400,
     "of the non-finite numbers it takes NaN, Infinity and -Infinity"),
    ("inf-in-json", INFER, js(mlp_doc())[:-7] + b"Inf]}]}", {}, None, 400, "request body is not valid JSON"),
    ("fp32-overflow", INFER, js(mlp_doc(data=[1e39] * 512)), {}, None, 400, "data is not a FP32 tensor (overflow"),
    ("unknown-model", "/v2/models/ghost/infer", js(mlp_doc()), {}, None, 404,
     "model 'ghost' is not served here; models: alltypes, auto, encoder, mlp, strings"),
    ("unknown-version", "/v2/models/mlp/versions/9/infer", js(mlp_doc()), {}, None, 404,
     "model 'mlp' has no version '9' here; it serves version 1"),
    ("version-of-5000-digits", f"/v2/models/mlp/versions/{'9' * 5000}/infer", js(mlp_doc()), {}, None, 400,
     "is not valid: versions are whole numbers of at most 19 digits"),
    ("version-not-ascii-digits", "/v2/models/mlp/versions/%C2%B2/infer", js(mlp_doc()), {}, None, 400,
     "model version '\u00b2' is not valid"),
    ("name-with-slash", "/v2/models/ml%2Fp/infer", js(mlp_doc()), {}, None, 404, "model names cannot contain '/'"),
    ("name-dotdot", "/v2/models/../infer", js(mlp_doc()), {}, None, 400,
     "invalid model name '..', model name must not contain path traversal characters"),
    ("name-with-nul", "/v2/models/ml%00p/infer", js(mlp_doc()), {}, None, 400,
     "model name must not contain path traversal characters; a model name is one directory name"),
    ("missing-input", INFER, js({"inputs": []}), {}, None, 400, "missing input(s) x; model 'mlp' takes: x (FP32 [-1,512])"),
    ("extra-input", INFER, js({"inputs": mlp_doc()["inputs"] + [{**mlp_doc()["inputs"][0], "name": "z"}]}), {},
     None, 400, "unknown input 'z'; model 'mlp' takes: x (FP32 [-1,512])"),
    ("duplicate-input", INFER, js({"inputs": mlp_doc()["inputs"] * 2}), {}, None, 400, "input 'x' is given twice"),
    ("wrong-datatype", INFER, js(mlp_doc(datatype="INT32", data=[0] * 512)), {}, None, 400,
     "datatype 'INT32'; model 'mlp' expects FP32"),
    ("non-numeric-data", INFER, js(mlp_doc(data=["a"] * 512)), {}, None, 400, "data is not a FP32 tensor"),
    ("shape-vs-data-length", INFER, js(mlp_doc(data=[0.5] * 10)), {}, None, 400, "needs 512 values, data has 10"),
    ("shape-vs-model-dims", INFER, js(mlp_doc(shape=[1, 3], data=[0.5] * 3)), {}, None, 400,
     "shape [1, 3] does not match [-1,512] (-1 = any size)"),
    ("batch-over-max", INFER, js(mlp_doc(rows=65)), {}, None, 400, "batch dimension 65 exceeds model 'mlp' max_batch_size 64"),
    ("empty-tensor-with-data", INFER, js(mlp_doc(shape=[0, 512], data=[0.5])), {}, None, 400,
     "shape [0, 512] needs 0 values, data has 1"),
    ("header-length-beyond-body", INFER, b'{"inputs": []}', {"Inference-Header-Content-Length": "999"}, None, 400,
     "Inference-Header-Content-Length is 999 but the body has only 14 bytes"),
    ("header-length-not-a-number", INFER, b'{"inputs": []}', {"Inference-Header-Content-Length": "-3"}, None, 400,
     "must be a non-negative integer"),
    ("binary-size-vs-shape", INFER, *binary_x(2044, X_BYTES[:2044]), None, 400,
     "binary_data_size is 2044 bytes but shape [1, 512] of FP32 needs 512 x 4 = 2048 bytes"),
    ("binary-size-past-body", INFER, *binary_x(2048, X_BYTES[:1000]), None, 400,
     "binary_data_size 2048 runs past the end of the body (1000 binary bytes are left"),
    ("binary-bytes-left-over", INFER, *binary_x(2048, X_BYTES + b"junk"), None, 400,
     "the body has 4 bytes after the last input's binary data"),
    ("raw-body-not-whole-rows", INFER, b"\0" * 2050, {"Inference-Header-Content-Length": "0"}, None, 400,
     "a raw request's body must be a whole number (>= 1) of 2048-byte rows"),
    ("body-over-max-request-bytes", INFER, b"{" * (50 << 20), {}, 4096, 413,
     f"this server takes at most {MAX_REQUEST_BYTES} bytes per request (--max-request-bytes)"),
    ("gzip-bomb", INFER, gzip.compress(b" " * (20 << 20)), {"Content-Encoding": "gzip"}, None, 413,
     "the gzip-decoded request body is"),
    ("gzip-with-trailing-garbage", INFER, gzip.compress(js(mlp_doc())) + b"garbage", {"Content-Encoding": "gzip"},
     None, 400, "the gzip body has 7 bytes after its compressed stream"),
    ("broken-gzip", INFER, b"not gzip", {"Content-Encoding": "gzip"}, None, 400, "the body is not valid gzip data"),
    ("unknown-encoding", INFER, js(mlp_doc()), {"Content-Encoding": "br"}, None, 415,
     "Content-Encoding 'br' is not supported; accepted: gzip, deflate, identity"),
    ("body-stops-arriving", INFER, js(mlp_doc(rows=40)), {}, 70_000, 408,
     "the request body stopped arriving: 70000 bytes of the"),
    ("body-never-starts", INFER, js(mlp_doc()), {}, 0, 408, "the request body stopped arriving: 0 bytes of the"),
    # The client closes its side half way: no answer can reach it; the server must just go on.
    ("body-truncated-by-close", INFER, js(mlp_doc(rows=40)), {}, ("close", 70_000), None, None),
    # Every endpoint that reads a body reads it under the same limits.
    ("repository-body-over-max-request-bytes", REPOSITORY_INDEX, b"{" * (50 << 20), {}, 4096, 413,
     f"this server takes at most {MAX_REQUEST_BYTES} bytes per request (--max-request-bytes)"),
    ("repository-body-stops-arriving", REPOSITORY_INDEX, js({"ready": False}) + b" " * 200_000, {}, 70_000, 408,
     "the request body stopped arriving: 70000 bytes of the"),
    ("repository-body-never-starts", "/v2/repository/models/mlp/load", b"{}", {}, 0, 408,
     "the request body stopped arriving: 0 bytes of the"),
    ("repository-body-truncated-by-close", "/v2/repository/models/mlp/unload", b"{}" + b" " * 200_000, {},
     ("close", 70_000), None, None),
    # The shared-memory register route reads its JSON body the same way.
    ("shm-register-body-over-max-request-bytes", SHM_REGISTER, b"{" * (50 << 20), {}, 4096, 413,
     f"this server takes at most {MAX_REQUEST_BYTES} bytes per request (--max-request-bytes)"),
    ("shm-register-body-stops-arriving", SHM_REGISTER, js({"key": "/r", "byte_size": 64}) + b" " * 200_000, {},
     70_000, 408, "the request body stopped arriving: 70000 bytes of the"),
    ("shm-register-body-never-starts", SHM_REGISTER, js({"key": "/r", "byte_size": 64}), {}, 0, 408,
     "the request body stopped arriving: 0 bytes of the"),
]


@pytest.mark.parametrize("path, body, headers, cut, status, says",
                         [pytest.param(*case[1:], id=case[0]) for case in CASES])
def test_hostile_input_gets_a_clear_4xx_and_harms_nothing(stack, path, body, headers, cut, status, says):
    before, gateway = worker_state(stack), gateway_pid(stack)
    close = isinstance(cut, tuple)

    r = rawhttp.request(stack.port, "POST", path, body, headers, send_bytes=cut[1] if close else cut,
                        half_close=close, timeout_s=BODY_TIMEOUT_S + 20)

    assert r.status == status, r.body[:300]
    if says is not None:
        assert r.headers["content-type"] == "application/json"
        assert says in r.json()["error"]
    assert worker_state(stack) == before  # the worker ran nothing and was not restarted
    assert gateway_pid(stack) == gateway  # nor was the gateway
    ok = httpx.post(stack.url + INFER, json=mlp_doc(), timeout=30)
    assert ok.status_code == 200, ok.text  # still serving


# -- a version that is no version, on every route that takes one --------------------------------------------
BAD_VERSIONS = [pytest.param("9" * 5000, "model version '99999", id="5000-digits"),
                pytest.param("%C2%B2", "model version '\u00b2'", id="not-ascii-digits"),
                pytest.param("%D9%A3", "model version '\u0663'", id="arabic-indic-digit")]


@pytest.mark.parametrize("suffix", ["", "/ready", "/config", "/stats"], ids=["metadata", "ready", "config", "stats"])
@pytest.mark.parametrize("version, says", BAD_VERSIONS)
def test_an_invalid_version_on_the_get_routes_gets_400_with_the_json_error(stack, suffix, version, says):
    """int() refuses more than 4300 digits (a ValueError, once a plain-text 500) and reads '²' as no
    number but '٣' as 3: a version is 1 to 19 ASCII digits, checked before any lookup."""
    r = rawhttp.request(stack.port, "GET", f"/v2/models/mlp/versions/{version}{suffix}")

    assert r.status == 400, r.body[:300]
    assert r.headers["content-type"] == "application/json"
    error = r.json()["error"]
    assert error.startswith(says) and "is not valid: versions are whole numbers of at most 19 digits" in error


# -- the request head and the connections -------------------------------------------------------------------
def test_headers_over_max_header_bytes_get_431_at_once(stack):
    started = time.monotonic()

    r = rawhttp.request(stack.port, "GET", "/v2/health/ready", headers={"X-Big": "a" * (4 * MAX_HEADER_BYTES)})

    assert r.status == 431 and "(--max-header-bytes)" in r.json()["error"], r.body[:300]
    assert r.headers["connection"] == "close"
    assert time.monotonic() - started < HEADER_TIMEOUT_S  # refused as it passed the limit, not timed out
    assert httpx.get(stack.url + "/v2/health/ready", timeout=30).status_code == 200


def test_a_head_that_drips_in_is_cut_off_after_header_timeout_s(stack):
    """Slowloris: a byte every 0.2 s used to keep the connection (and its descriptor) forever."""
    answer, waited_s = rawhttp.drip_head(stack.port, "/v2/health/ready", HEADER_TIMEOUT_S + 5)
    assert answer.startswith(b"HTTP/1.1 408 "), answer[:300]
    assert b"(--header-timeout-s)" in answer
    assert waited_s < HEADER_TIMEOUT_S + 2


def test_requests_on_connections_past_max_connections_get_503_then_serve_again(stack):
    idle = [socket.create_connection(("127.0.0.1", stack.port), timeout=10) for _ in range(MAX_CONNECTIONS)]
    try:
        r = rawhttp.request(stack.port, "GET", "/v2/health/ready")
        assert r.status == 503 and "(--max-connections)" in r.json()["error"], r.body[:300]
        assert r.headers["retry-after"] == "1"
    finally:
        for sock in idle:
            sock.close()
    poll_for(lambda: rawhttp.request(stack.port, "GET", "/v2/health/ready").status == 200, timeout=10,
             what="serving again once the idle connections are closed")


# -- bounded fuzzing over HTTP -----------------------------------------------------------------
MODELS = ["mlp", "encoder", "alltypes", "auto", "strings", "ghost", "..", "a%20b", "%00", "a%2Fb"]
scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**65), 2**65), st.floats(allow_nan=False), st.text(max_size=3))
junk_json = st.recursive(scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
    st.sampled_from(["name", "shape", "datatype", "data", "parameters", "inputs", "outputs", "binary_data_size", "id"]),
    inner, max_size=4), max_leaves=30)


@st.composite
def http_requests(draw):
    model = draw(st.sampled_from(MODELS))
    if draw(st.booleans()):
        doc = mlp_doc(rows=draw(st.integers(1, 3)))
        entry = doc["inputs"][0]
        key = draw(st.sampled_from(["name", "shape", "datatype", "data", "parameters"]))
        entry[key] = draw(junk_json)
        body = js(doc)
    else:
        body = json.dumps(draw(junk_json)).encode()
    headers = {}
    if draw(st.booleans()):
        tail = draw(st.binary(max_size=64))
        headers["Inference-Header-Content-Length"] = str(draw(st.integers(-1, len(body) + 8)))
        body += tail
    if draw(st.booleans()):
        headers["Content-Encoding"] = draw(st.sampled_from(["gzip", "deflate", "identity"]))
        if headers["Content-Encoding"] == "gzip" and draw(st.booleans()):
            body = gzip.compress(body)
    version = draw(st.sampled_from(["", "/versions/1", "/versions/x"]))
    return f"/v2/models/{model}{version}/infer", body, headers


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(case=http_requests())
def test_fuzzed_infer_requests_never_get_a_5xx(stack, case):
    path, body, headers = case

    r = rawhttp.request(stack.port, "POST", path, body, headers, timeout_s=20)

    assert r.status is not None and r.status < 500, (path, body[:200], headers, r.body[:300])
    if r.status != 200:
        assert r.json()["error"]


def test_fuzzing_left_the_worker_serving(stack):
    assert all(w["state"] == "ready" and w["generation"] == 1 for w in stack.status()["workers"])
    assert httpx.post(stack.url + INFER, json=mlp_doc(), timeout=30).status_code == 200


# -- what an error quotes of the client's -------------------------------------------------------------------
@pytest.mark.parametrize("path, body, says", [
    pytest.param(INFER, js({"inputs": [{**mlp_doc()["inputs"][0], "name": "z" * (512 << 10)}]}),
                 f"unknown input '{'z' * 200}'…; model 'mlp' takes: x (FP32 [-1,512])", id="input-name"),
    pytest.param(INFER, js(mlp_doc(datatype="D" * (512 << 10))), f"input 'x': datatype '{'D' * 200}'…; model",
                 id="datatype"),
    pytest.param(INFER, js(mlp_doc(data=["w" * (512 << 10)] + [0.5] * 511)),
                 f"data is not a FP32 tensor (could not convert string to float: '{'w' * 160}",
                 id="numpy-error-text"),
    pytest.param(f"/v2/models/{'m' * (12 << 10)}/infer", js(mlp_doc()), f"model '{'m' * 200}'… is not served here",
                 id="model-name-in-path"),
])
def test_an_error_quotes_at_most_200_characters_of_what_the_client_sent(stack, path, body, says):
    """A 1 MiB name came back whole in the error (and over gRPC reset the stream instead)."""
    r = rawhttp.request(stack.port, "POST", path, body)
    assert 400 <= r.status < 500, r.body[:300]
    error = r.json()["error"]
    assert says in error and len(error) < 1000, error[:1000]
