"""gateway/http/fast.py: what one event-loop step writes leaves in one write, and close() loses nothing;
a request head past its limits is refused before the application sees it."""
from __future__ import annotations

import asyncio
import importlib.metadata
import time

import pytest
import uvicorn
from uvicorn.server import ServerState

from ringserve import cli
from ringserve.gateway.http import engine, fast
from ringserve.gateway.http.fast import CoalescingTransport, GatewayHttpProtocol, write_response
from ringserve.gateway.http.limits import ARRIVED_NS, ConnectionLimits


class RecordingTransport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False
        self.aborted = False
        self.paused = False

    def write(self, data: bytes) -> None:
        assert not self.closed
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.aborted = self.closed = True

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        self.paused = True


def run_steps(loop: asyncio.AbstractEventLoop, steps: int = 3) -> None:
    for _ in range(steps):
        loop.run_until_complete(asyncio.sleep(0))


def test_writes_in_one_step_leave_in_one_write(loop):
    real = RecordingTransport()
    transport = CoalescingTransport(real, loop)
    transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n")
    transport.write(b"{}")
    assert real.writes == []  # held until the step ends
    assert transport.get_write_buffer_size() == len(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}")
    run_steps(loop)
    assert real.writes == [b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\n{}"]
    transport.write(b"second")
    run_steps(loop)
    assert real.writes[1:] == [b"second"]


def test_close_flushes_first_and_abort_drops(loop):
    real = RecordingTransport()
    transport = CoalescingTransport(real, loop)
    transport.writelines([b"a", b"", b"b"])
    transport.close()
    assert real.writes == [b"ab"] and real.closed
    run_steps(loop)  # the scheduled flush finds nothing left
    assert real.writes == [b"ab"]

    real = RecordingTransport()
    transport = CoalescingTransport(real, loop)
    transport.write(b"lost")
    transport.abort()
    run_steps(loop)
    assert real.writes == [] and real.aborted


def test_a_closing_transport_gets_no_write_and_other_calls_pass_through(loop):
    real = RecordingTransport()
    transport = CoalescingTransport(real, loop)
    transport.write(b"late")
    real.closed = True  # the peer went away before the step ended
    run_steps(loop)
    assert real.writes == []
    transport.pause_reading()
    assert real.paused and transport.is_closing()


# -- the request head's limits ------------------------------------------------------------------------------------
class HeadRecorder(RecordingTransport):
    def get_extra_info(self, name: str, default=None):
        return default

    def resume_reading(self) -> None:  # (a pipelined request's: uvicorn pauses reading behind a response)
        self.paused = False


class App:
    """Answers 200; records each request it was given (so a refused head never reached the API key check)."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.arrivals: list[tuple[int | None, int]] = []  # (the scope's arrival stamp, when the app ran)

    async def __call__(self, scope, receive, send) -> None:
        self.paths.append(scope["path"])
        self.arrivals.append((scope.get(ARRIVED_NS), time.perf_counter_ns()))
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"0")]})
        await send({"type": "http.response.body", "body": b""})


def connect(loop, limits: ConnectionLimits, state: ServerState | None = None):
    app = App()
    config = uvicorn.Config(app, lifespan="off", proxy_headers=False, log_config=None)
    config.load()
    protocol = GatewayHttpProtocol(config=config, server_state=state or ServerState(), app_state={}, _loop=loop,
                                   limits=limits)
    real = HeadRecorder()
    protocol.connection_made(real)
    return protocol, real, app


def answer(real: RecordingTransport) -> tuple[int, bytes]:
    head, _, body = b"".join(real.writes).partition(b"\r\n\r\n")
    return int(head.split()[1]), body


LIMITS = ConnectionLimits(max_header_bytes=4096, header_timeout_s=0.2, max_connections=4)


def test_a_head_over_max_header_bytes_in_one_read_gets_431_and_never_reaches_the_app(loop):
    protocol, real, app = connect(loop, LIMITS)
    protocol.data_received(b"GET /v2 HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 5000 + b"\r\n\r\n")
    run_steps(loop)
    status, body = answer(real)
    assert status == 431 and b"(--max-header-bytes)" in body and real.closed
    assert app.paths == []


def test_a_head_fed_in_small_reads_is_refused_once_it_passes_the_limit_not_at_its_end(loop):
    protocol, real, app = connect(loop, LIMITS)
    protocol.data_received(b"GET /v2 HTTP/1.1\r\nHost: x\r\nX-Big: ")
    reads = 1
    while not real.closed:
        protocol.data_received(b"a" * 512)
        reads += 1
    run_steps(loop)
    assert answer(real)[0] == 431 and reads <= 4096 // 512 + 2
    assert app.paths == []


def test_a_head_just_under_the_limit_is_served_whether_it_comes_whole_or_in_pieces(loop):
    request = b"GET /v2 HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 3900 + b"\r\n\r\n"
    for pieces in (1, 40):
        protocol, real, app = connect(loop, LIMITS)
        step = -(-len(request) // pieces)
        for start in range(0, len(request), step):
            protocol.data_received(request[start:start + step])
        run_steps(loop)
        assert answer(real)[0] == 200 and app.paths == ["/v2"]


def test_a_head_that_stops_arriving_gets_408_and_the_connection_closes(loop):
    protocol, real, app = connect(loop, LIMITS)
    protocol.data_received(b"GET /v2 HTTP/1.1\r\nHo")
    loop.run_until_complete(asyncio.sleep(0.1))
    protocol.data_received(b"st: x\r\n")  # dripping does not push the deadline back
    loop.run_until_complete(asyncio.sleep(0.2))
    status, body = answer(real)
    assert status == 408 and b"(--header-timeout-s)" in body and real.closed
    assert app.paths == []


def test_a_connection_that_sends_nothing_is_closed_without_an_answer(loop):
    protocol, real, app = connect(loop, LIMITS)
    loop.run_until_complete(asyncio.sleep(0.3))
    assert real.closed and real.writes == []


def test_a_served_request_leaves_no_head_timer_behind(loop):
    protocol, real, app = connect(loop, LIMITS)
    protocol.data_received(b"GET /v2 HTTP/1.1\r\nHost: x\r\n\r\n")
    loop.run_until_complete(asyncio.sleep(0.3))
    assert answer(real)[0] == 200 and not real.closed  # the keep-alive timeout (5 s) is uvicorn's


def test_requests_on_a_connection_past_max_connections_get_503_and_it_closes(loop):
    state = ServerState()
    served = [connect(loop, LIMITS, state) for _ in range(LIMITS.max_connections)]
    protocol, real, app = connect(loop, LIMITS, state)
    protocol.data_received(b"GET /v2 HTTP/1.1\r\nHost: x\r\n\r\n")
    run_steps(loop)
    status, body = answer(real)
    assert status == 503 and b"(--max-connections)" in body and real.closed and app.paths == []
    assert b"retry-after: 1" in real.writes[0]
    first, first_real, first_app = served[0]
    first.data_received(b"GET /v2 HTTP/1.1\r\nHost: x\r\n\r\n")  # the ones under the cap are served
    run_steps(loop)
    assert answer(first_real)[0] == 200


# -- the defaults, and the descriptors they need ------------------------------------------------------
def test_the_head_and_connection_limits_default_to_64_kib_10_s_and_4096(tmp_path, monkeypatch):
    """The safe defaults for the request head and the connections, from the flags given no value down to
    the protocol."""
    monkeypatch.delenv(cli.ENV_API_KEY, raising=False)
    settings = cli.settings_from_args(cli.build_parser().parse_args(["serve", "--model-repository", str(tmp_path)]))

    assert (settings.max_header_bytes, settings.header_timeout_s, settings.max_connections) == (64 * 1024, 10.0, 4096)
    assert ConnectionLimits() == ConnectionLimits(max_header_bytes=65536, header_timeout_s=10.0, max_connections=4096)


def test_a_request_carries_when_its_first_bytes_were_read_not_when_its_head_was_parsed(loop):
    """Triton's statistics and perf_analyzer's server-side breakdown count from the read that brought
    the request: its head split over reads arrived at the first one."""
    protocol, real, app = connect(loop, LIMITS)
    before = time.perf_counter_ns()
    protocol.data_received(b"GET /v2 HTTP/1.1\r\nHo")
    time.sleep(0.02)
    protocol.data_received(b"st: x\r\n\r\n")
    run_steps(loop)

    (arrived, ran), = app.arrivals
    assert answer(real)[0] == 200
    assert before <= arrived < before + 15_000_000 and ran - arrived >= 20_000_000


class Echo:
    """An app that answers each request with the body it received, in as many messages as it came."""

    def __init__(self) -> None:
        self.bodies: list[bytes] = []

    async def __call__(self, scope, receive, send) -> None:
        body, more = b"", True
        while more:
            message = await receive()
            body, more = body + message.get("body", b""), message.get("more_body", False)
        self.bodies.append(body)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


UPGRADE_HEAD = b"POST /x HTTP/1.1\r\nHost: a\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"


@pytest.mark.parametrize("reads", [
    [UPGRADE_HEAD + b"Content-Length: 10\r\n\r\n0123456789GET /y HTTP/1.1\r\nHost: a\r\n\r\n"],
    [UPGRADE_HEAD + b"Content-Length: 10\r\n\r\n0123", b"45", b"6789GET /y HTTP/1.1\r\nHost: a\r\n\r\n"],
], ids=["one read", "the body over three reads"])
def test_an_upgrade_requests_body_reaches_the_app_and_the_request_behind_it_is_served(loop, reads):
    """httptools skips the body of a request that asks to upgrade (curl --http2 -d sends Upgrade: h2c);
    uvicorn's own protocol hands the application an empty body."""
    app = Echo()
    protocol = GatewayHttpProtocol(config=loaded_config(app), server_state=ServerState(), app_state={}, _loop=loop,
                                   limits=LIMITS)
    real = HeadRecorder()
    protocol.connection_made(real)
    for data in reads:
        protocol.data_received(data)
        run_steps(loop)
    protocol.connection_lost(None)

    assert app.bodies == [b"0123456789", b""]
    assert b"".join(real.writes).count(b"HTTP/1.1 200 OK") == 2


def loaded_config(app) -> uvicorn.Config:
    config = uvicorn.Config(app, lifespan="off", proxy_headers=False, log_config=None, access_log=False)
    config.load()
    return config


# -- the infer path's one-write answer (write_response) ------------------------------------------------------------
ANSWER_HEADERS = [(b"content-type", b"application/json"), (b"x-request-id", b"abc-1")]


class Answering:
    """An app that answers {"ok": 1} through write_response (`fast`) or uvicorn's two ASGI messages."""

    def __init__(self, fast: bool, headers=ANSWER_HEADERS) -> None:
        self.fast, self.headers, self.wrote = fast, headers, []

    async def __call__(self, scope, receive, send) -> None:
        body = b'{"ok":1}'
        wrote = self.fast and write_response(send, 200, self.headers, body)
        self.wrote.append(wrote)
        if not wrote:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [*self.headers, (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})


def serve_requests(loop, app, *requests: bytes) -> bytes:
    config = uvicorn.Config(app, lifespan="off", proxy_headers=False, log_config=None, server_header=False,
                            access_log=False)  # (as the gateway serves: UVICORN_OPTIONS)
    config.load()
    state = ServerState()
    state.default_headers = [(b"date", b"Sun, 06 Dec 2026 18:00:00 GMT")]
    protocol = GatewayHttpProtocol(config=config, server_state=state, app_state={}, _loop=loop, limits=LIMITS)
    real = HeadRecorder()
    protocol.connection_made(real)
    for request in requests:
        protocol.data_received(request)
        run_steps(loop)
    protocol.connection_lost(None)
    return b"".join(real.writes)


POST = b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"


def test_the_one_write_answer_is_the_bytes_uvicorn_writes_and_the_connection_serves_on(loop):
    fast, slow = Answering(fast=True), Answering(fast=False)

    written = serve_requests(loop, fast, POST, POST)

    assert fast.wrote == [True, True]
    assert written == serve_requests(loop, slow, POST, POST)
    assert written.count(b"HTTP/1.1 200 OK\r\n") == 2 and b"content-length: 8\r\n\r\n" in written


@pytest.mark.parametrize("request_bytes, headers", [
    (POST.replace(b"Host: x\r\n", b"Host: x\r\nConnection: close\r\n"), ANSWER_HEADERS),  # uvicorn closes after
    (b"HEAD /v2/models/m/infer HTTP/1.1\r\nHost: x\r\n\r\n", ANSWER_HEADERS),  # no body goes out
    (POST, [*ANSWER_HEADERS, (b"connection", b"close")]),  # an error that closes the connection
])
def test_what_the_one_write_answer_does_not_do_is_left_to_uvicorn(loop, request_bytes, headers):
    fast, slow = Answering(fast=True, headers=headers), Answering(fast=False, headers=headers)

    written = serve_requests(loop, fast, request_bytes)

    assert fast.wrote == [False] and written == serve_requests(loop, slow, request_bytes)


# -- the fast path's fence (gateway/http/engine.py chooses; fast.py declares its window and surface) ----------------
def test_the_surface_check_passes_on_this_uvicorn_and_refuses_one_outside_the_window():
    current = importlib.metadata.version("uvicorn")

    assert fast.surface_refusal(current) is None
    assert "outside the versions it was tested on" in fast.surface_refusal("0.40.9")
    assert "outside the versions it was tested on" in fast.surface_refusal("0.56.0")


def test_the_surface_check_names_a_method_or_an_attribute_that_is_gone(monkeypatch):
    current = importlib.metadata.version("uvicorn")
    monkeypatch.delattr(fast.HttpToolsProtocol, "_unsupported_upgrade_warning")

    assert fast.surface_refusal(current).endswith("lacks HttpToolsProtocol._unsupported_upgrade_warning")

    monkeypatch.undo()
    original = fast.RequestResponseCycle.__init__
    monkeypatch.setattr(fast.RequestResponseCycle, "__init__", lambda self, *a, **k: original(self, *a, **k))

    assert "RequestResponseCycle.response_started" in fast.surface_refusal(current)


def test_a_refused_fast_path_leaves_uvicorns_own_protocol_serving_and_says_why(monkeypatch, caplog):
    monkeypatch.setattr(fast, "surface_refusal", lambda version: "uvicorn 9.9 is outside the versions it was tested on")

    with caplog.at_level("WARNING", logger="ringserve.gateway.http.engine"):
        chosen = engine.choose_engine("fast", ConnectionLimits())

    assert chosen.name == "uvicorn" and chosen.options["http"] == "auto" and not chosen.write_response(None, 200, [], b"")
    assert "HTTP fast path off: uvicorn 9.9 is outside" in caplog.text
    assert engine.choose_engine("uvicorn", ConnectionLimits()).name == "uvicorn"
    monkeypatch.undo()
    assert engine.choose_engine("fast", ConnectionLimits()).write_response is fast.write_response
