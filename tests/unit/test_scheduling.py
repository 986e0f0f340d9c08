"""gateway/grpc/scheduling.py: threads started inside helper_threads() run under SCHED_BATCH, the caller does not."""
from __future__ import annotations

import os
import threading

import pytest

from ringserve.gateway.grpc.scheduling import helper_threads

pytestmark = pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="SCHED_BATCH is Linux's")


def policy_of_a_thread_started_now() -> int:
    seen: list[int] = []
    thread = threading.Thread(target=lambda: seen.append(os.sched_getscheduler(0)))
    thread.start()
    thread.join()
    return seen[0]


def in_a_thread(body):
    """Run `body` in a fresh thread (each test changes only that thread's policy); its result or exception."""
    out: list = []

    def run() -> None:
        try:
            out.append(body())
        except BaseException as exc:  # noqa: BLE001 - handed back to the test
            out.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if isinstance(out[0], BaseException):
        raise out[0]
    return out[0]


def test_threads_started_inside_run_under_batch_and_the_caller_keeps_its_policy():
    def body():
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))  # (the default, whatever pytest runs under)
        with helper_threads():
            inside = policy_of_a_thread_started_now()
        return inside, os.sched_getscheduler(0), policy_of_a_thread_started_now()

    assert in_a_thread(body) == (os.SCHED_BATCH, os.SCHED_OTHER, os.SCHED_OTHER)


def test_the_caller_gets_its_policy_back_when_the_block_raises():
    def body():
        os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
        with pytest.raises(RuntimeError), helper_threads():
            raise RuntimeError("the server could not start")
        return os.sched_getscheduler(0)

    assert in_a_thread(body) == os.SCHED_OTHER


def test_a_thread_under_another_policy_is_left_as_it_is():
    """Started under SCHED_BATCH by the operator (chrt, systemd's CPUSchedulingPolicy=): not changed back."""
    def body():
        os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
        with helper_threads():
            pass
        return os.sched_getscheduler(0)

    assert in_a_thread(body) == os.SCHED_BATCH
