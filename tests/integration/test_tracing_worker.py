"""The worker's execution spans: a real worker process serving two fake gateways (test_worker_gateways'
harness), exporting to an OTLP receiver in the test. Each BATCH's traceparent is its span's parent,
alone or fused with batches of the other gateway; a batch without one makes no span."""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from ringserve.common import messages

from tests.support.otlp import OtlpReceiver
from tests.support.stack import poll_for
from .test_worker_gateways import WORKER, Stack, rows, two_gateways

CONSUMER, ERROR = 5, 2  # opentelemetry.proto's SpanKind and StatusCode


class TracedStack(Stack):
    receiver: OtlpReceiver

    def start_worker(self, gateways: int, env: dict[str, str] | None = None, **settings: object) -> None:
        super().start_worker(gateways, env={"OTEL_BSP_SCHEDULE_DELAY": "50"}, otel_endpoint=self.receiver.endpoint)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[TracedStack]:
    with OtlpReceiver() as receiver:
        traced = TracedStack(tmp_path)
        traced.receiver = receiver
        with two_gateways(traced) as stack:
            yield stack


def traced(batch: messages.Batch, span_id: str) -> messages.Batch:
    """The batch as a tracing gateway sends it: its batch span's traceparent in `trace`."""
    return dataclasses.replace(batch, trace=f"00-{'ab' * 16}-{span_id}-01")


def test_each_batch_runs_under_its_traceparent_alone_or_fused_and_untraced_ones_make_no_span(stack):
    g0, g1 = stack.gateways
    g0.ready(), g1.ready()
    g0.send(WORKER, traced(g0.batch(800, 0, rows(80), faults=["slow"]), "0000000000000800"))  # the others queue
    stack.started(800)
    g0.send(WORKER, traced(g0.batch(801, 1, rows(81)), "0000000000000801"))
    g1.send(WORKER, traced(g1.batch(901, 1, rows(91)), "0000000000000901"))
    g1.send(WORKER, g1.batch(902, 2, rows(92)))  # from a gateway that does not trace
    assert g0.reply().batch_id == 800
    results = {r.batch_id: r for r in (g0.reply(), g1.reply(), g1.reply())}
    assert {k: r.fused for k, r in results.items()} == {801: 3, 901: 3, 902: 3}
    g0.send(WORKER, traced(g0.batch(802, 2, {"input_ids": rows(1).astype("int64")}, model="encoder"),
                           "0000000000000802"))  # refused by the model: an Error
    assert isinstance(g0.reply(), messages.Error)

    poll_for(lambda: len(stack.receiver.named("execute ")) == 4, 20, what="the worker's execution spans")
    spans = {s.parent_span_id: s for s in stack.receiver.named("execute ")}
    assert set(spans) == {"0000000000000800", "0000000000000801", "0000000000000901", "0000000000000802"}
    for parent, span in spans.items():
        assert span.trace_id == "ab" * 16
        assert span.kind == CONSUMER
        assert span.attributes["ringserve.batch_id"] == str(int(parent))
        assert span.resource["ringserve.process.role"] == "worker"
        assert span.resource["process.pid"] == stack.process.pid
    assert spans["0000000000000801"].attributes["ringserve.gateway"] == 0
    assert spans["0000000000000901"].attributes["ringserve.gateway"] == 1
    assert spans["0000000000000801"].attributes["ringserve.fused_batches"] == 3
    assert "ringserve.fused_batches" not in spans["0000000000000800"].attributes
    assert spans["0000000000000802"].status_code == ERROR
    assert "ringserve.compute_s" not in spans["0000000000000802"].attributes
