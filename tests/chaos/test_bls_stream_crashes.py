"""A BLS stream across lanes (exec(decoupled=True) to a decoupled model of another lane) when either end's
lane is SIGKILLed mid-stream: the caller's request gets its answer, nothing hangs, the server keeps serving."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from tests.integration.test_lanes_bls_stream import answered, listen
from tests.support.bls_stream_models import build_bls_stream, listener_doc
from tests.support.stack import poll_for

pytestmark = pytest.mark.chaos


def lane_pids(stack) -> dict[str, int]:
    return {next(iter(w["models"])): w["pid"] for w in stack.status()["workers"] if len(w["models"]) == 1}


def listen_in_thread(stack, doc: dict) -> tuple[threading.Thread, list]:
    answer: list = []
    thread = threading.Thread(target=lambda: answer.append((listen(stack, doc), time.monotonic())), daemon=True)
    thread.start()
    return thread, answer


def test_the_target_lane_killed_mid_stream_ends_the_callers_iterator_with_an_error(start_stack, tmp_path: Path):
    stack = start_stack(build_bls_stream(tmp_path / "repo"), "--lanes", "model", "--warm-spare=false")
    marks = tmp_path / "marks"
    marks.mkdir()
    before = lane_pids(stack)
    thread, answer = listen_in_thread(stack, listener_doc(30, 0.3, "strict", marks=str(marks)))
    try:
        # (killed once the caller has a response: one still on its way would be lost with the lane, which
        # the gateway answers by replaying the request, as for a stream that sent nothing)
        poll_for(lambda: (marks / "received").exists(), 30, what="the caller's first response")
        target = int((marks / "streaming").read_text())
        assert target == before["ticker"]
        os.kill(target, signal.SIGKILL)
        killed_at = time.monotonic()
    finally:
        thread.join(30)  # (a hang fails below: no answer)
    (status, body), answered_at = answer[0]

    assert status != 200 and "worker died (SIGKILL)" in body["error"], body  # the error response the iterator gave
    assert answered_at - killed_at < 5  # (its stream would have gone on for 9 s)
    poll_for(lambda: stack.serves("ticker"), 60, what="ticker's lane back")
    status, body = listen(stack, listener_doc(2, 0.05))
    assert status == 200 and len(answered(body)["GOT"]) == 2
    after = lane_pids(stack)
    assert after["listener"] == before["listener"] and after["ticker"] != before["ticker"]


def test_the_callers_lane_killed_mid_stream_frees_the_targets_stream(start_stack, tmp_path: Path):
    stack = start_stack(build_bls_stream(tmp_path / "repo"), "--lanes", "model", "--warm-spare=false")
    marks = tmp_path / "marks"
    marks.mkdir()
    before = lane_pids(stack)
    thread, answer = listen_in_thread(stack, listener_doc(3, 2.0, marks=str(marks)))
    try:
        poll_for(lambda: (marks / "received").exists(), 30, what="the caller's first response")
        os.kill(before["listener"], signal.SIGKILL)
        # The target's stream is cancelled (its sender.is_cancelled() turns true) once the gateway hears of the
        # exit, not at its next response (2 s on), the first the gateway could not hand to its dead caller.
        poll_for(lambda: (marks / "cancelled").exists(), 1.5, what="the target's stream cancelled")
    finally:
        thread.join(60)
    (status, body), _ = answer[0]

    # the caller's batch was replayed on its lane's next process, which streamed again from the start
    assert status == 200 and len(answered(body)["GOT"]) == 3, body
    after = lane_pids(stack)
    assert after["ticker"] == before["ticker"] and after["listener"] != before["listener"]
