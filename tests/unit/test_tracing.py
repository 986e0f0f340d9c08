"""common/tracing.py: the facade off (no-op, nothing imported), the endpoint rules, and the gateway's
spans through a bisection, driven by hand with an in-memory exporter."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from ringserve import cli
from ringserve.common import tracing
from ringserve.common.errors import SettingError
from ringserve.gateway.core.errors import WorkerCrashed

from tests.support.gateway_fakes import dispatch_settings
from .test_dispatch import POISON, Harness, rows

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def test_the_flag_wins_over_the_variable_and_an_empty_flag_turns_tracing_off() -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}
    assert tracing.resolve_endpoint("http://jaeger:4318", env) == "http://jaeger:4318"
    assert tracing.resolve_endpoint(None, env) == "http://collector:4318"
    assert tracing.resolve_endpoint("", env) is None
    assert tracing.resolve_endpoint(None, {}) is None
    assert tracing.resolve_endpoint(None, {**env, "OTEL_SDK_DISABLED": "true"}) is None
    with pytest.raises(ValueError, match="http:// or https://"):
        tracing.resolve_endpoint("collector:4317", {})


def test_the_endpoint_is_a_base_url_as_the_standard_variable_is() -> None:
    assert tracing.traces_url("http://localhost:4318") == "http://localhost:4318/v1/traces"
    assert tracing.traces_url("http://localhost:4318/") == "http://localhost:4318/v1/traces"
    assert tracing.traces_url("https://otel.example/v1/traces") == "https://otel.example/v1/traces"


def test_serve_reads_the_variable_once_into_the_settings_and_refuses_what_cannot_trace(
        tmp_path: Path, monkeypatch) -> None:
    def settings(*flags: str):
        return cli.settings_from_args(cli.build_parser().parse_args(
            ["serve", "--model-repository", str(tmp_path), *flags]))

    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    assert settings().otel_endpoint is None
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://collector:4318")
    assert settings().otel_endpoint == "http://collector:4318"  # children read it from the settings file
    assert settings("--otel-endpoint", "http://jaeger:4318").otel_endpoint == "http://jaeger:4318"
    with pytest.raises(SettingError, match="http:// or https://"):
        settings("--otel-endpoint", "jaeger:4317")
    monkeypatch.setattr(tracing, "missing_packages", lambda: "tracing needs the opentelemetry.sdk package")
    with pytest.raises(SettingError, match="opentelemetry.sdk"):
        settings()


OFF_PROCESS = """import sys
from ringserve.common import tracing
import ringserve.cli, ringserve.gateway.__main__, ringserve.worker.__main__
assert tracing.setup(None, "gateway") is None and tracing.active is None
assert tracing.start_request([(b"traceparent", b"%s")], "mlp") is None
with tracing.tracer().start_span("anything") as span:
    span.set_attribute("a", 1)
tracing.finish_request(None, 200)
tracing.shutdown()
print(sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry"))
""" % TRACEPARENT


def test_off_the_facade_does_nothing_and_no_process_module_imports_opentelemetry() -> None:
    out = subprocess.run([sys.executable, "-P", "-c", OFF_PROCESS], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


@pytest.fixture
def spans(monkeypatch):
    """Tracing on in this process, into memory; the finished spans as a list, on demand."""
    exporter = InMemorySpanExporter()
    on = tracing.Tracing("http://127.0.0.1:9", "gateway", 0, 0, exporter=exporter)
    monkeypatch.setattr(tracing, "active", on)

    def finished():
        on.provider.force_flush()
        return list(exporter.get_finished_spans())

    yield finished
    on.shutdown()


def test_a_request_span_continues_the_traceparent_of_http_headers_and_of_grpc_metadata(spans) -> None:
    http = tracing.start_request([(b"host", b"x"), (b"traceparent", TRACEPARENT.encode())], "mlp")
    grpc = tracing.start_request([("traceparent", TRACEPARENT)], "mlp", protocol="grpc")
    alone = tracing.start_request([], "mlp")
    tracing.finish_request(http, 503)
    tracing.finish_request(grpc, 3)  # INVALID_ARGUMENT: the client's error
    tracing.finish_request(alone, 400)
    by_name = {s.name: s for s in spans()}
    assert set(by_name) == {"POST /v2/models/{model}/infer", "ModelInfer"}
    for span in (http, grpc):
        assert span.kind == SpanKind.SERVER
        assert format(span.context.trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"
        assert format(span.parent.span_id, "016x") == "b7ad6b7169203331"
    assert http.status.status_code == StatusCode.ERROR and http.attributes["http.response.status_code"] == 503
    assert grpc.status.status_code == StatusCode.UNSET and grpc.attributes["rpc.grpc.status_code"] == 3
    assert alone.parent is None


def test_a_bisected_batch_ends_its_span_and_each_half_gets_one_linked_to_its_requests(spans, segment, loop) -> None:
    harness = Harness(segment, loop, dispatch_settings(max_inflight_per_worker=1))
    reqs = [harness.request(rows(1, 10.0 * i)) for i in range(4)]
    reqs[2].inputs["x"][0, 1] = POISON
    request_spans = [tracing.start_request([], "mlp") for _ in reqs]
    for request, span in zip(reqs, request_spans):
        request.span = span
    generation = 1
    harness.ready(0, generation)
    for r in reqs:
        harness.dispatcher.submit(r)
    harness.settle()
    done = 0
    while done < len(harness.sent):  # as test_dispatch's poison test: 4 crash twice, then halves
        sent = harness.sent[done]
        done += 1
        assert sent.batch.trace is not None  # each BATCH carries its batch span's context
        if (harness.inputs_of(sent) == POISON).any():
            harness.exited(0, generation, reason="SIGSEGV")
            generation += 1
            harness.ready(0, generation)
        else:
            harness.answer(sent)
    with pytest.raises(WorkerCrashed):
        reqs[2].future.result()
    for span in request_spans:
        tracing.finish_request(span, 200)

    finished = spans()
    batches = [s for s in finished if s.name == "batch mlp"]
    waits = [s for s in finished if s.name == "queue wait"]
    assert len(waits) == 4  # once each, when the first batch formed; not again for the halves
    whole = next(b for b in batches if len(b.links) == 4)
    assert [e.name for e in whole.events] == ["sent", "requeued", "sent", "requeued", "bisected"]
    assert [e.attributes["ringserve.crash_reason"] for e in whole.events if e.name == "requeued"] == ["SIGSEGV"] * 2
    assert whole.parent.span_id == request_spans[0].context.span_id
    # Halves and quarters: children of the batch they split from, linked to their own requests.
    by_id = {b.context.span_id: b for b in batches}
    ids = {r.context.span_id: i for i, r in enumerate(request_spans)}
    linked = sorted((sorted(ids[link.context.span_id] for link in b.links)) for b in batches)
    assert linked == [[0, 1], [0, 1, 2, 3], [2], [2, 3], [3]]
    for batch in batches:
        if batch is not whole:
            assert batch.parent.span_id in by_id
    (poison_batch,) = [b for b in batches if [ids[link.context.span_id] for link in b.links] == [2]]
    assert poison_batch.status.status_code == StatusCode.ERROR
    assert "WorkerCrashed" in poison_batch.status.description
    assert all(b.end_time is not None for b in batches)
    # The traceparent each BATCH carried names the span of the batch that was sent.
    sent_parents = {s.batch.trace.split("-")[2] for s in harness.sent}
    assert sent_parents == {format(b.context.span_id, "016x") for b in batches}


def test_a_batch_whose_first_request_is_not_sampled_is_traced_under_a_sampled_one(spans, segment, loop) -> None:
    harness = Harness(segment, loop, dispatch_settings(max_inflight_per_worker=1))
    unsampled = TRACEPARENT[:-2] + "00"  # the client's sampling decision: not this one
    sampled = "00-11111111111111111111111111111111-2222222222222222-01"
    reqs = [harness.request(rows(2, 0.0)), harness.request(rows(2, 100.0))]
    for request, traceparent in zip(reqs, (unsampled, sampled)):
        request.span = tracing.start_request([(b"traceparent", traceparent.encode())], "mlp")
    harness.ready(0, 1)
    for r in reqs:
        harness.dispatcher.submit(r)
    harness.settle()  # one full batch of 4 rows
    (sent,) = harness.sent
    assert sent.batch.trace.split("-")[1] == "1" * 32  # the worker continues the sampled trace
    harness.answer(sent)
    for r in reqs:
        tracing.finish_request(r.span, 200)
    finished = spans()
    assert sorted(s.name for s in finished) == ["POST /v2/models/{model}/infer", "batch mlp", "queue wait"]
    (batch,) = [s for s in finished if s.name == "batch mlp"]
    assert batch.parent.span_id == reqs[1].span.context.span_id
    assert len(batch.links) == 2  # the unsampled request is linked all the same
