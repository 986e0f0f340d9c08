"""Tracing through a worker's death: a batch whose worker is SIGKILLed is requeued, and its spans say so."""
from __future__ import annotations

import asyncio
import os
import signal
import threading
from pathlib import Path

import httpx
import numpy as np
import pytest

from ..integration.test_tracing import FAST_EXPORT, client_context, infer_all, mlp_body
from tests.support.otlp import OtlpReceiver
from tests.support.stack import Stack, poll_for

pytestmark = pytest.mark.chaos


def test_a_batch_whose_worker_is_killed_is_requeued_and_its_spans_say_so(start_stack, demo_repo: Path) -> None:
    with OtlpReceiver() as receiver:
        # The standard variable, not the flag: the CLI reads it once for every process.
        # A long hang timeout: the supervisor must not kill the stopped worker as hung before the test does.
        stack: Stack = start_stack(demo_repo, "--hang-timeout-s", "60",
                                   env={**FAST_EXPORT, "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint})
        x = np.random.default_rng(3).standard_normal((2, 512)).astype(np.float32)
        trace_id, span_id, traceparent = client_context()
        lane = stack.lane("mlp")  # the worker that runs mlp's batches (the encoder has its own)
        killed = stack.worker_pid(lane)
        os.kill(killed, signal.SIGSTOP)  # the batch waits in its inbox: in flight, never answered
        try:
            answers: list[httpx.Response] = []
            sending = threading.Thread(target=lambda: answers.extend(
                asyncio.run(infer_all(stack.url, [mlp_body(x)], [traceparent]))))
            sending.start()
            poll_for(lambda: stack.status()["workers"][lane]["in_flight_batches"] == 1, 10,
                     what="the batch in flight")
        finally:
            os.kill(killed, signal.SIGKILL)
        sending.join(60)
        (response,) = answers
        assert response.status_code == 200, response.text

        poll_for(lambda: receiver.named("batch ") and receiver.named("execute ") and receiver.named("POST "), 20,
                 what="the spans of the requeued batch")
        (request,), (batch,) = receiver.named("POST "), receiver.named("batch ")
        assert (request.trace_id, request.parent_span_id) == (trace_id, span_id)
        assert [name for name, _ in batch.events] == ["sent", "requeued", "sent"]
        requeued = dict(batch.events)["requeued"]
        assert requeued["ringserve.crash_reason"] == "SIGKILL"
        assert requeued["ringserve.attempt"] == 1
        assert [name for name, _ in request.events] == ["requeued"]
        # The killed worker never ended its span; the one that ran the batch again did, as the batch's child.
        (execution,) = receiver.named("execute ")
        assert execution.parent_span_id == batch.span_id
        assert execution.resource["process.pid"] not in (killed, request.resource["process.pid"])
        assert execution.attributes["ringserve.attempt"] == 1
