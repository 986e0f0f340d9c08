"""gateway/grpc/core.py, grpcio's core server on an asyncio loop, and gateway/grpc/aio.py, grpc.aio running the
same handlers (the engine that serves when the fast path cannot), each with a plain grpc client in a thread."""
from __future__ import annotations

import asyncio
import threading

import grpc
import pytest

from ringserve.gateway.grpc import core, core_call
from ringserve.gateway.grpc.aio import AioServer
from ringserve.gateway.grpc.core import CoreServer

ECHO, SLOW, STREAM, FAIL = "/t.T/Echo", "/t.T/Slow", "/t.T/Stream", "/t.T/Fail"
WINDOW, BURST = "/t.T/Window", "/t.T/Burst"


async def echo(request: bytes, context) -> bytes:
    context.set_trailing_metadata((("x-seen", dict(context.invocation_metadata()).get("x-id", "")),))
    return b"echo:" + request


async def slow(request: bytes, context) -> bytes:
    try:  # (the core's calls see cancelled(); grpc.aio cancels the handler's task as well)
        while not context.cancelled():
            await asyncio.sleep(0.01)
    finally:
        slow.saw_cancel = True
    return b""


async def stream(requests, context) -> None:
    async for message in requests:
        if message == b"abort":
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "told to")
        await context.write(message.upper())
        await context.write(message)


async def window(requests, context) -> None:
    """Opens a window of 3, reads what the core let in, grants 2 more, reads again: answers both counts."""
    async def read_all() -> int:
        count = 0
        while True:
            try:
                await asyncio.wait_for(anext(requests), 0.5)
            except TimeoutError:  # (the core read no more)
                return count
            count += 1

    requests.open_window(3)
    first = await read_all()
    requests.grant(2)
    await context.write(f"{first},{first + await read_all()}".encode())


async def burst(requests, context) -> None:
    """50 messages queued at once, none awaited: each goes, in order, and the status after the last."""
    async for message in requests:
        for i in range(50):
            context.send(message + str(i).encode())


async def fail(request: bytes, context) -> bytes:
    raise RuntimeError("a bug")


def strict(data: bytes) -> bytes:
    if data.startswith(b"bad"):
        raise ValueError("not a message")
    return data


HANDLERS = {
    ECHO: grpc.unary_unary_rpc_method_handler(echo, request_deserializer=strict),
    SLOW: grpc.unary_unary_rpc_method_handler(slow),
    STREAM: grpc.stream_stream_rpc_method_handler(stream),
    FAIL: grpc.unary_unary_rpc_method_handler(fail),
    WINDOW: grpc.stream_stream_rpc_method_handler(window),
    BURST: grpc.stream_stream_rpc_method_handler(burst),
}


@pytest.fixture(params=["core", "aio"])
def served(request: pytest.FixtureRequest):
    """(port, run(coroutine function)) with the server on a loop in a thread; stopped after the test."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    def run(make, timeout=30):
        return asyncio.run_coroutine_threadsafe(make(), loop).result(timeout)

    async def start():
        if isinstance(server, CoreServer):
            server.start()
        else:
            await server.start()

    async def make():
        return (CoreServer if request.param == "core" else AioServer)([("grpc.so_reuseport", 0)], HANDLERS)

    server = run(make)  # (grpc.aio's server is made on its loop)
    port = server.add_port("127.0.0.1:0")

    run(start)
    yield port, run, server
    run(lambda: server.stop(1.0))
    assert not isinstance(server, CoreServer) or not server.poller.is_alive()
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


def test_unary_answers_with_its_message_and_trailing_metadata(served):
    port, _, _ = served
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        answer, call = channel.unary_unary(ECHO).with_call(b"hi", metadata=(("x-id", "7"),), timeout=10)
        assert answer == b"echo:hi"
        assert dict(call.trailing_metadata())["x-seen"] == "7"
        answers = [channel.unary_unary(ECHO).future(str(i).encode(), timeout=10) for i in range(200)]
        assert [f.result() for f in answers] == [b"echo:" + str(i).encode() for i in range(200)]


def test_refusals_name_what_went_wrong(served):
    port, _, _ = served
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        for method, payload, code in ((ECHO, b"bad", grpc.StatusCode.INVALID_ARGUMENT),
                                      ("/t.T/Nothing", b"", grpc.StatusCode.UNIMPLEMENTED),
                                      (FAIL, b"", grpc.StatusCode.UNKNOWN)):
            with pytest.raises(grpc.RpcError) as info:
                channel.unary_unary(method)(payload, timeout=10)
            assert info.value.code() == code, (method, info.value.details())
        assert "not this method's request" in channel.unary_unary(ECHO).future(b"bad").exception().details()
        assert channel.unary_unary(ECHO)(b"ok", timeout=10) == b"echo:ok"  # still serving


def test_streams_answer_in_order_and_abort_ends_them_with_the_status(served):
    port, _, _ = served
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        assert list(channel.stream_stream(STREAM)(iter([b"a", b"b"]), timeout=10)) == [b"A", b"a", b"B", b"b"]
        answers = channel.stream_stream(STREAM)(iter([b"c", b"abort", b"d"]), timeout=10)
        assert next(answers) == b"C" and next(answers) == b"c"
        with pytest.raises(grpc.RpcError) as info:
            next(answers)
        assert info.value.code() == grpc.StatusCode.FAILED_PRECONDITION and info.value.details() == "told to"


def test_a_stream_is_read_ahead_only_as_far_as_its_window(served):
    """The core reads a stream's messages ahead of the servicer (on the poller thread), but only the credit
    it was given: 3, then 2 more, of the 10 the client wrote."""
    port, _, _ = served
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.stream_stream(WINDOW)(iter([b"m"] * 10), timeout=10)
        assert next(call) == b"3,5"
        call.cancel()


def test_queued_answers_all_go_in_order_before_the_status(served):
    port, _, _ = served
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.stream_stream(BURST)(iter([b"a", b"b"]), timeout=10)
        assert list(call) == [b"a" + str(i).encode() for i in range(50)] + [b"b" + str(i).encode() for i in range(50)]
        assert call.code() == grpc.StatusCode.OK


def test_a_client_that_cancels_is_seen_cancelled(served):
    port, _, server = served
    slow.saw_cancel = False
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        future = channel.unary_unary(SLOW).future(b"", timeout=10)
        for _ in range(100):
            if server.tasks:
                break
            threading.Event().wait(0.02)
        future.cancel()
        for _ in range(250):
            if slow.saw_cancel:
                break
            threading.Event().wait(0.02)
    assert slow.saw_cancel


def test_stop_ends_running_calls_after_the_grace(served):
    port, run, server = served
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        future = channel.unary_unary(SLOW).future(b"", timeout=20)
        for _ in range(100):
            if server.tasks:
                break
            threading.Event().wait(0.02)
        run(lambda: server.stop(0.2))
        assert future.exception(10).code() == grpc.StatusCode.UNAVAILABLE  # "Cancelling all calls", as grpc.aio
        assert not server.tasks


def test_the_fast_path_s_surface_check_passes_on_this_grpcio_and_names_what_is_missing(monkeypatch):
    assert core.surface_problem() is None
    monkeypatch.delattr(core.cygrpc, "ReceiveCloseOnServerOperation")
    assert "lacks ReceiveCloseOnServerOperation" in core.surface_problem()


def test_a_grpcio_outside_the_window_turns_the_fast_path_off(monkeypatch):
    monkeypatch.setattr(grpc, "__version__", "1.99.0")
    assert "grpcio 1.99.0 is outside the releases it was run on" in core.surface_problem()


def test_a_refused_batch_s_grpc_call_error_is_seen_and_logged(caplog):
    """The core answers a batch it will not run with a grpc_call_error (its tag never completes); it was dropped."""
    assert not core_call.refused_by_core(core.cygrpc.CallError.ok, "a call's sends")
    assert core_call.refused_by_core(core.cygrpc.CallError.too_many_operations, "a stream's receive")
    assert "gRPC core refused a stream's receive: grpc_call_error" in caplog.text
