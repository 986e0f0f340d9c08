"""--http-engine against the real stack: the fast path and uvicorn's own protocol give the same answers, a
request that asks to upgrade to h2c (curl --http2) included; and a uvicorn the fast path cannot stand on
leaves the public path serving, with the reason in the log (gateway/http/engine.py)."""
from __future__ import annotations

import json
import socket
import textwrap
import urllib.request
from pathlib import Path

import pytest

from tests.support.stack import Stack, running_stack

pytestmark = pytest.mark.integration

# What curl --http2 sends over plain HTTP: an HTTP/1.1 request asking to upgrade (RFC 7540 3.2). A server that
# does not speak h2c answers it in HTTP/1.1; uvicorn 0.30.0-0.30.5 raised AttributeError on it instead.
H2C_HEADERS = b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAARAAAAAAAIAAAAA\r\n"
# A uvicorn without a name the fast path uses (the one 0.30.0-0.30.5 lack), made in every process of the
# stack by a sitecustomize on PYTHONPATH: the gateway's import of uvicorn is that uvicorn's.
WITHOUT_A_NAME = """\
from uvicorn.protocols.http import httptools_impl
del httptools_impl.HttpToolsProtocol._unsupported_upgrade_warning
"""
FAST_PATH_OFF = "HTTP fast path off"
INFER = {"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32", "data": [0.5] * 512}]}


class LoggedStack(Stack):
    """A stack whose processes' log lines go to `log_path`, for the test to read."""

    log_path: Path

    def start(self, *args, **kwargs) -> Stack:
        with self.log_path.open("ab") as self.stderr:  # the children keep their own copy of the fd
            return super().start(*args, **kwargs)


def logged_to(path: Path) -> type[Stack]:
    return type("LoggedStack", (LoggedStack,), {"log_path": path})


def raw_exchange(port: int, request: bytes) -> bytes:
    """One request on a fresh connection; the answer's bytes up to the server's close or 2 s of quiet."""
    with socket.create_connection(("127.0.0.1", port), timeout=2.0) as sock:
        sock.sendall(request)
        answer = b""
        try:
            while b"\r\n\r\n" not in answer or len(answer) < answer_length(answer):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                answer += chunk
        except TimeoutError:
            pass
    return answer


def answer_length(answer: bytes) -> int:
    head, _, _ = answer.partition(b"\r\n\r\n")
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return len(head) + 4 + int(value)
    return len(answer) + 1


def infer_request(port: int, upgrade: bytes = b"") -> bytes:
    body = json.dumps(INFER).encode()
    return (
        b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nContent-Type: application/json\r\n"
        b"Content-Length: %d\r\n%s\r\n%s" % (port, len(body), upgrade, body)
    )


@pytest.mark.parametrize("engine", ["fast", "uvicorn"])
def test_a_request_that_asks_to_upgrade_to_h2c_is_answered_in_http_1_1_on_either_engine(demo_repo: Path, engine):
    with running_stack(demo_repo, "--http-engine", engine) as stack:
        ready = raw_exchange(stack.port, b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n" + H2C_HEADERS + b"\r\n")
        inferred = raw_exchange(stack.port, infer_request(stack.port, H2C_HEADERS))
        plain = raw_exchange(stack.port, infer_request(stack.port))
        assert stack.get("/v2/health/live")[0] == 200  # (the gateway is still up)

    assert ready.startswith(b"HTTP/1.1 200 "), ready
    if engine == "fast":  # curl --http2 -d @request.json: the body reaches the model
        assert inferred.startswith(b"HTTP/1.1 200 "), inferred
        assert json.loads(inferred.partition(b"\r\n\r\n")[2])["outputs"] == json.loads(
            plain.partition(b"\r\n\r\n")[2])["outputs"]
    else:  # httptools skips an upgrade request's body and uvicorn's own protocol hands the app an empty one
        assert inferred.startswith(b"HTTP/1.1 400 ") and b"zero-length" in inferred, inferred


def test_the_public_engine_answers_as_the_fast_one_does(demo_repo: Path, tmp_path: Path):
    answers = {}
    for engine in ("fast", "uvicorn"):
        log_path = tmp_path / f"{engine}.log"
        with running_stack(demo_repo, "--http-engine", engine, stack_class=logged_to(log_path)) as stack:
            metadata, (status, inferred), unknown = (
                stack.get("/v2/models/mlp"),
                stack.post("/v2/models/mlp/infer", INFER),
                stack.post("/v2/models/nothing/infer", INFER),
            )
            answers[engine] = [metadata, status, inferred["outputs"], unknown[0], unknown[1]["error"]]

    assert answers["uvicorn"] == answers["fast"]
    assert answers["fast"][1] == 200 and answers["fast"][3] == 404
    assert FAST_PATH_OFF not in (tmp_path / "fast.log").read_text()  # (the uvicorn CI runs: the fast path serves)


def test_a_uvicorn_without_a_name_the_fast_path_uses_leaves_the_public_path_serving(demo_repo: Path,
                                                                                    tmp_path: Path):
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent(WITHOUT_A_NAME))
    log_path = tmp_path / "stack.log"
    with running_stack(demo_repo, "--http-engine", "fast", env={"PYTHONPATH": str(site)},
                       stack_class=logged_to(log_path)) as stack:
        request = urllib.request.Request(stack.url + "/v2/models/mlp/infer", method="POST",
                                         data=json.dumps(INFER).encode())
        with urllib.request.urlopen(request, timeout=10) as answer:
            status, outputs = answer.status, json.loads(answer.read())["outputs"]

    assert status == 200 and outputs[0]["name"] == "y"
    refusals = [line for line in log_path.read_text().splitlines() if FAST_PATH_OFF in line]
    assert len(refusals) == 1, log_path.read_text()
    assert "HttpToolsProtocol._unsupported_upgrade_warning" in refusals[0]
