"""BLS to a decoupled model of another lane: exec(decoupled=True) streams through the gateway
(worker/calls_stream.py, gateway/calls/stream.py), each response as the target sends it."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.support.bls_stream_models import build_bls_stream, listener_doc
from tests.support.stack import Stack, poll_for, running_stack

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def stream_stack(tmp_path_factory: pytest.TempPathFactory):
    repo = build_bls_stream(tmp_path_factory.mktemp("bls_stream"))
    with running_stack(repo, "--lanes", "model", "--warm-spare=false") as stack:
        yield stack


def listen(stack: Stack, doc: dict, timeout_s: float = 60) -> tuple[int, dict]:
    request = urllib.request.Request(f"{stack.url}/v2/models/listener/infer", data=json.dumps(doc).encode())
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def answered(body: dict) -> dict:
    return {o["name"]: o["data"] for o in body["outputs"]}


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_decoupled_model_in_another_lane_streams_each_response_to_the_caller_as_it_is_sent(
        stream_stack: Stack, mode: str) -> None:
    lanes = {tuple(w["models"]): w["pid"] for w in stream_stack.status()["workers"]}
    assert ("listener",) in lanes and ("ticker",) in lanes and lanes[("listener",)] != lanes[("ticker",)]

    status, body = listen(stream_stack, listener_doc(4, 0.4, mode))

    assert status == 200, body
    got = answered(body)
    assert got["ERROR"] == [""] and len(got["SENT"]) == len(got["GOT"]) == 4
    # each came within a fraction of the 0.4 s gap of its send, not buffered to the stream's end
    assert all(at - sent < 0.2 for sent, at in zip(got["SENT"], got["GOT"])), got
    assert got["GOT"][3] - got["GOT"][0] > 0.9


@pytest.mark.parametrize(("final_with_last", "count"), [(True, 3), (False, 4)])
def test_the_final_flag_ends_the_iterator_with_the_last_response_or_an_empty_one_when_it_came_alone(
        stream_stack: Stack, final_with_last: bool, count: int) -> None:
    status, body = listen(stream_stack, listener_doc(3, 0.0, final_with_last=final_with_last))

    assert status == 200, body
    got = answered(body)
    assert got["COUNT"] == [count] and len(got["GOT"]) == 3 and got["ERROR"] == [""], got


def test_cancel_on_the_callers_iterator_cancels_the_target_and_ends_with_a_cancelled_error(
        stream_stack: Stack, tmp_path: Path) -> None:
    started = time.monotonic()
    status, body = listen(stream_stack, listener_doc(50, 0.2, "cancel", marks=str(tmp_path)))

    assert status == 200, body
    got = answered(body)
    assert time.monotonic() - started < 5  # (the whole stream: 10 s)
    assert 1 <= len(got["GOT"]) < 5 and "cancelled" in got["ERROR"][0], got
    # the target's sender.is_cancelled() turned true (it looks between two responses)
    poll_for(lambda: (tmp_path / "cancelled").exists(), 5, what="the target told its stream is cancelled")


def test_a_streams_timeout_ends_it_with_an_error_in_the_iterator(stream_stack: Stack, tmp_path: Path) -> None:
    started = time.monotonic()
    status, body = listen(stream_stack, listener_doc(10, 1.0, timeout_us=500_000, marks=str(tmp_path)))

    assert status == 200, body
    got = answered(body)
    assert time.monotonic() - started < 5  # (the whole stream: 10 s)
    # The timeout bounds the wait for each next response, as in the caller's own worker (worker/python/bls_stream.py);
    # ticker's queue policy does not let a request lower its timeout, so the gateway keeps its own deadline.
    assert len(got["GOT"]) == 1 and "timeout (0.5 s) passed" in got["ERROR"][0], got
    poll_for(lambda: (tmp_path / "cancelled").exists(), 5, what="the target told its stream is cancelled")



def test_cancel_reaches_the_gateway_that_serves_the_stream_among_several(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    with running_stack(build_bls_stream(tmp_path / "repo"), "--gateways", "2", "--warm-spare=false") as stack:
        for k in range(4):  # (ZeroMQ hands the calls to the gateways in turn: each serves some)
            (marks / "cancelled").unlink(missing_ok=True)
            status, body = listen(stack, listener_doc(50, 0.2, "cancel", marks=str(marks)))

            assert status == 200 and "cancelled" in answered(body)["ERROR"][0], (k, body)
            poll_for(lambda: (marks / "cancelled").exists(), 5, what="the target told its stream is cancelled")


def test_in_one_worker_the_same_calls_answer_as_across_lanes(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    marks.mkdir()
    with running_stack(build_bls_stream(tmp_path / "repo"), "--lanes", "shared", "--warm-spare=false") as stack:
        streamed = listen(stack, listener_doc(3, 0.0))
        cancelled = listen(stack, listener_doc(50, 0.2, "cancel", marks=str(marks)))
        poll_for(lambda: (marks / "cancelled").exists(), 5, what="the target told its stream is cancelled")

    assert streamed[0] == 200 and answered(streamed[1])["COUNT"] == [4] and answered(streamed[1])["ERROR"] == [""]
    got = answered(cancelled[1])
    assert cancelled[0] == 200 and len(got["GOT"]) == 1 and "cancelled" in got["ERROR"][0], got
