"""gateway/kserve/infer_call.py: the call context each front end holds an inference in. Leaving it finishes the
call once, with the status it ended with, whichever way it ended; a model's failure is counted once."""
from __future__ import annotations

import asyncio

import pytest

from ringserve.gateway.core.errors import BadRequest, GatewayError
from ringserve.gateway.kserve.infer_call import InferCall


class RecordingPlane:
    """The data plane's steps (InferSteps), recorded: what `failed` and `finish` were called with."""

    def __init__(self) -> None:
        self.failures: list[GatewayError] = []
        self.finished: list[tuple] = []

    def target(self, call, model, version, where, streaming=False):
        raise AssertionError("not asked here")

    def run(self, call, parse, size, disconnected, stream=None):
        raise AssertionError("not asked here")

    def failed(self, call: InferCall, exc: GatewayError) -> int:
        self.failures.append(exc)
        return 400

    def finish(self, call: InferCall, status: int, method: str, path: str, nbytes: int, status_code: int) -> None:
        self.finished.append((status, method, path, nbytes, status_code))


def a_call(plane: RecordingPlane, code_of=None) -> InferCall:
    call = InferCall(0, "rid", None, "mlp")
    call.plane, call.method, call.path = plane, "POST", "/v2/models/mlp/infer"
    if code_of is not None:
        call.code_of = code_of
    return call


def test_an_answered_call_is_finished_once_with_its_bytes_and_status():
    plane = RecordingPlane()

    with a_call(plane) as call:
        call.answered(123)

    assert plane.finished == [(200, "POST", "/v2/models/mlp/infer", 123, 200)] and not plane.failures


def test_an_error_the_front_end_answered_is_counted_once_and_finishes_with_its_status():
    plane = RecordingPlane()

    with a_call(plane) as call:
        status = call.failed(BadRequest("no"))
        call.answered(40, status)

    assert len(plane.failures) == 1 and plane.finished == [(400, "POST", "/v2/models/mlp/infer", 40, 400)]


def test_an_error_that_leaves_the_context_is_counted_once_and_finishes_with_its_status_and_no_bytes():
    plane = RecordingPlane()

    with pytest.raises(BadRequest), a_call(plane, code_of=lambda status: 3) as call:
        call.answered(99)
        raise BadRequest("no")

    assert len(plane.failures) == 1 and plane.finished == [(400, "POST", "/v2/models/mlp/infer", 0, 3)]


def test_a_cancelled_call_finishes_as_499_and_any_other_error_as_500():
    plane = RecordingPlane()

    with pytest.raises(asyncio.CancelledError), a_call(plane):
        raise asyncio.CancelledError
    with pytest.raises(KeyError), a_call(plane):
        raise KeyError("a bug")

    assert [finished[0] for finished in plane.finished] == [499, 500] and not plane.failures


def test_an_error_counted_by_the_front_end_and_raised_on_is_not_counted_twice():
    plane = RecordingPlane()

    with pytest.raises(BadRequest), a_call(plane) as call:
        exc = BadRequest("no")
        call.failed(exc)
        raise exc

    assert len(plane.failures) == 1 and plane.finished[0][0] == 400
