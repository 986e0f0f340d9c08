"""The request head, body and version limits on a real stack that needs an API key (--api-key-file).

A request head past --max-header-bytes (431), one that drips in past --header-timeout-s (408)
and a connection past --max-connections (503) are refused before the API key is looked at: a
client without the key gets the limit's answer, not 401. The scheme of `Authorization: Bearer`
is case-insensitive. A client that hangs up half way through a body leaves no ERROR line and
no traceback in the gateway's log. The gateway raises its open-files limit so that
--max-connections fit.
"""
from __future__ import annotations

import json
import resource
import socket
import struct
from pathlib import Path

import httpx
import psutil
import pytest

from ringserve.gateway.descriptors import RESERVED_FDS

from tests.support import rawhttp
from tests.support.stack import Stack, poll_for, running_stack
from .test_logs import LoggedStack

pytestmark = pytest.mark.integration

KEY = "k3y-for-the-order-tests"
MAX_HEADER_BYTES = 16 << 10
HEADER_TIMEOUT_S = 2.0
MAX_CONNECTIONS = 32
MAX_REQUEST_BYTES = 1 << 20
BODY_TIMEOUT_S = 1.0
# The soft open-files limit the stack starts with: under MAX_CONNECTIONS + RESERVED_FDS, as a shell's
# usual 1024 is under the default --max-connections 4096 (+ RESERVED_FDS).
STARTED_SOFT_NOFILE = 200

GUARDED = "/v2/models/mlp"  # needs the key (not one of the open health/metrics paths)
INFER = "/v2/models/mlp/infer"
X = {"inputs": [{"name": "x", "shape": [1, 512], "datatype": "FP32", "data": [0.5] * 512}]}


class LimitedLoggedStack(LoggedStack):
    """Logs to log_path; its processes start with a soft RLIMIT_NOFILE of STARTED_SOFT_NOFILE."""

    def start(self, *args, **kwargs) -> Stack:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (STARTED_SOFT_NOFILE, hard))  # inherited by the tree
        try:
            return super().start(*args, **kwargs)
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.fixture(scope="module")
def log_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("auth-order") / "stack.log"


@pytest.fixture(scope="module")
def stack(demo_repo: Path, log_path: Path):
    key_file = log_path.parent / "key"
    key_file.write_text(KEY + "\n")
    stack_class = type("Stack", (LimitedLoggedStack,), {"log_path": log_path})
    with running_stack(demo_repo, "--api-key-file", str(key_file), "--access-log",
                       "--max-header-bytes", str(MAX_HEADER_BYTES), "--header-timeout-s", str(HEADER_TIMEOUT_S),
                       "--max-connections", str(MAX_CONNECTIONS), "--max-request-bytes", str(MAX_REQUEST_BYTES),
                       "--body-timeout-s", str(BODY_TIMEOUT_S), stack_class=stack_class) as s:
        yield s


def gateway(stack: Stack) -> psutil.Process:
    return next(p for p in psutil.Process(stack.pid).children() if "ringserve.gateway" in " ".join(p.cmdline()))


def test_without_the_key_a_guarded_path_is_refused_with_401(stack):
    """The control for the tests below: the path they use needs the key."""
    r = rawhttp.request(stack.port, "GET", GUARDED)
    assert r.status == 401 and "needs the server's API key" in r.json()["error"], r.body[:300]


def test_a_head_over_max_header_bytes_gets_431_before_the_api_key_is_asked_for(stack):
    r = rawhttp.request(stack.port, "GET", GUARDED, headers={"X-Big": "a" * (2 * MAX_HEADER_BYTES)})

    assert r.status == 431, r.body[:300]
    assert "(--max-header-bytes)" in r.json()["error"] and r.headers["connection"] == "close"


def test_a_dripping_head_gets_408_before_the_api_key_is_asked_for(stack):
    answer, waited_s = rawhttp.drip_head(stack.port, GUARDED, HEADER_TIMEOUT_S + 5)

    assert answer.startswith(b"HTTP/1.1 408 "), answer[:300]
    assert b"(--header-timeout-s)" in answer
    assert waited_s < HEADER_TIMEOUT_S + 2


def test_a_connection_past_max_connections_gets_503_before_the_api_key_is_asked_for(stack):
    idle = [socket.create_connection(("127.0.0.1", stack.port), timeout=10) for _ in range(MAX_CONNECTIONS)]
    try:
        r = rawhttp.request(stack.port, "GET", GUARDED)
        assert r.status == 503, r.body[:300]
        assert "(--max-connections)" in r.json()["error"] and r.headers["retry-after"] == "1"
    finally:
        for sock in idle:
            sock.close()
    poll_for(lambda: rawhttp.request(stack.port, "GET", GUARDED).status == 401, timeout=10,
             what="the key asked for again once the idle connections are closed")


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER"])
def test_the_key_is_accepted_with_the_scheme_in_any_case(stack, scheme):
    auth = {"Authorization": f"{scheme} {KEY}"}
    with httpx.Client(base_url=stack.url, timeout=30) as http:
        assert http.get(GUARDED, headers=auth).status_code == 200
        r = http.post(INFER, json=X, headers=auth)
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["name"] == "y"


@pytest.mark.parametrize("auth", [f"Bearer {KEY}x", f"bearer {KEY[:-1]}", f"Basic {KEY}", KEY])
def test_a_wrong_key_or_scheme_gets_401(stack, auth):
    r = httpx.post(stack.url + INFER, json=X, headers={"Authorization": auth}, timeout=30)
    assert r.status_code == 401 and "is wrong" in r.json()["error"], r.text


# -- a client that hangs up mid-body -------------------------------------------------------------------
def hang_up_mid_body(port: int, path: str, request_id: str, reset: bool) -> None:
    """Send the head and part of a 200 kB body, then go: a FIN (close) or an RST (reset)."""
    body = json.dumps(X).encode() + b" " * 200_000
    head = (f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nAuthorization: Bearer {KEY}\r\nX-Request-ID: {request_id}\r\n\r\n")
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(head.encode() + body[:70_000])
    if reset:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


@pytest.mark.parametrize("reset", [False, True], ids=["close", "reset"])
@pytest.mark.parametrize("path", ["/v2/repository/index", INFER], ids=["repository-index", "infer"])
def test_a_client_that_hangs_up_mid_body_leaves_no_error_and_no_traceback_in_the_log(stack, log_path, path, reset):
    offset = log_path.stat().st_size
    request_id = f"hang-up-{path.rsplit('/', 1)[1]}-{'reset' if reset else 'close'}"

    hang_up_mid_body(stack.port, path, request_id, reset)

    def answered() -> str:  # the access line of the request (499: its client went), or a traceback
        text = log_path.read_bytes()[offset:].decode(errors="replace")
        return text if f"request_id={request_id}" in text or "Traceback" in text else ""
    text = poll_for(answered, timeout=10, what="the gateway to finish the request")
    lines = text.splitlines()
    assert not [line for line in lines if " ERROR " in line or " CRITICAL " in line], text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert any(f"POST {path} 499 " in line and f"request_id={request_id}" in line for line in lines), text[-3000:]
    with httpx.Client(base_url=stack.url, timeout=30, headers={"Authorization": f"Bearer {KEY}"}) as http:
        assert http.post(INFER, json=X).status_code == 200  # and it serves on


# -- descriptors for --max-connections ---------------------------------------------------------------
def test_the_gateway_raises_its_open_files_limit_so_that_max_connections_fit(stack):
    """The stack started with a soft limit under what MAX_CONNECTIONS needs with RESERVED_FDS (no gRPC here, and
    no regions: client shared memory is off by default): the gateway raised its own."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = MAX_CONNECTIONS + RESERVED_FDS
    expected = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)

    assert psutil.Process(stack.pid).rlimit(psutil.RLIMIT_NOFILE)[0] == STARTED_SOFT_NOFILE  # as it started
    assert gateway(stack).rlimit(psutil.RLIMIT_NOFILE) == (expected, hard)
