"""Tracing on the real stack: spans received by an OTLP/HTTP receiver in the test process.

A client's traceparent is continued by the request span; each request's queue wait hangs off it;
a batch span links every request in it; the worker's span, in another process, is the batch
span's child across the ZeroMQ hop (the BATCH message's traceparent); a worker killed holding a
batch shows as `requeued` on its spans. Off (the default), no span leaves and no ringserve process
imports opentelemetry.
"""
from __future__ import annotations

import asyncio
import os
import secrets
from pathlib import Path

import httpx
import numpy as np
import onnxruntime as ort
import pytest

from tests.support.otlp import OtlpReceiver, ReceivedSpan
from tests.support.stack import Stack, held_requests, poll_for

pytestmark = pytest.mark.integration

# Export each span within ~50 ms rather than the SDK's 5 s (standard SDK variable; children inherit it).
FAST_EXPORT = {"OTEL_BSP_SCHEDULE_DELAY": "50"}
SERVER, PRODUCER, CONSUMER = 2, 4, 5  # opentelemetry.proto.trace.v1.Span.SpanKind
ERROR = 2  # Status.StatusCode


def client_context() -> tuple[str, str, str]:
    """A client's trace id, span id, and the traceparent header that carries them (sampled)."""
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return trace_id, span_id, f"00-{trace_id}-{span_id}-01"


def mlp_body(x: np.ndarray) -> dict:
    return {"inputs": [{"name": "x", "shape": list(x.shape), "datatype": "FP32", "data": x.ravel().tolist()}]}


def output_of(doc: dict) -> np.ndarray:
    out = doc["outputs"][0]
    return np.asarray(out["data"], np.float32).reshape(out["shape"])


async def infer_all(url: str, bodies: list[dict], traceparents: list[str]) -> list[httpx.Response]:
    async with httpx.AsyncClient(base_url=url, timeout=60) as http:
        return await asyncio.gather(*(http.post("/v2/models/mlp/infer", json=body, headers={"traceparent": tp})
                                      for body, tp in zip(bodies, traceparents)))


def by_id(spans: list[ReceivedSpan]) -> dict[str, ReceivedSpan]:
    return {s.span_id: s for s in spans}


def all_arrived(receiver: OtlpReceiver, requests: int) -> bool:
    """Every request's span, each linked from a batch span, and each batch span's execution (the
    gateway and the worker export on their own schedules)."""
    request_ids = {s.span_id for s in receiver.named("POST ")}
    batches = receiver.named("batch ")
    linked = {span_id for b in batches for _, span_id in b.links}
    executed = {e.parent_span_id for e in receiver.named("execute ")}
    return len(request_ids) == requests and linked == request_ids and executed == {b.span_id for b in batches}


def test_spans_continue_the_clients_trace_link_a_shared_batch_and_cross_the_zeromq_hop(
        start_stack, demo_repo: Path) -> None:
    with OtlpReceiver() as receiver:
        stack: Stack = start_stack(demo_repo, "--otel-endpoint", receiver.endpoint, env=FAST_EXPORT)
        rng = np.random.default_rng(18)
        xs = [rng.standard_normal((1 + i, 512)).astype(np.float32) for i in range(4)]
        clients = [client_context() for _ in xs]
        # Four requests behind a stopped worker: at most two batches are in flight per worker, so
        # at least two of them share a batch.
        responses = stack.send_while_stopped(
            lambda: asyncio.run(infer_all(stack.url, [mlp_body(x) for x in xs], [c[2] for c in clients])),
            until=lambda status: held_requests(status) >= 4)
        session = ort.InferenceSession(str(demo_repo / "mlp/1/model.onnx"), providers=["CPUExecutionProvider"])
        for x, r in zip(xs, responses):
            assert r.status_code == 200, r.text
            np.testing.assert_allclose(output_of(r.json()), session.run(None, {"x": x})[0], atol=1e-5)

        poll_for(lambda: all_arrived(receiver, requests=4), 20, what="the request, batch and execution spans")
        requests = receiver.named("POST ")
        waits, batches, executions = receiver.named("queue wait"), receiver.named("batch "), receiver.named("execute ")
        gateway_pid = requests[0].resource["process.pid"]

        # Each request span continues its client's trace: same trace id, the client's span as parent.
        assert len(requests) == 4
        request_of = {}
        for trace_id, span_id, _ in clients:
            (span,) = [s for s in requests if s.trace_id == trace_id]
            assert span.parent_span_id == span_id
            assert span.kind == SERVER
            assert span.attributes["http.response.status_code"] == 200
            assert span.attributes["ringserve.model"] == "mlp"
            assert span.resource["service.name"] == "ringserve"
            assert span.resource["ringserve.process.role"] == "gateway"
            assert span.resource["ringserve.process.index"] == 0
            request_of[span.span_id] = span
            # ...and has its queue wait, from enqueue to the batch formed, inside it.
            (wait,) = [w for w in waits if w.parent_span_id == span.span_id]
            assert wait.trace_id == trace_id
            assert span.start_ns <= wait.start_ns <= wait.end_ns <= span.end_ns

        # Every request is linked from exactly one batch span, and some batch holds two or more.
        linked = sorted(span_id for b in batches for _, span_id in b.links)
        assert linked == sorted(request_of)
        assert max(len(b.links) for b in batches) >= 2
        for batch in batches:
            assert batch.kind == PRODUCER
            assert batch.resource["process.pid"] == gateway_pid
            first = request_of[batch.parent_span_id]  # a child of its first request's span, in that trace
            assert (batch.trace_id, batch.parent_span_id) == (first.trace_id, first.span_id)
            assert all((trace_id, span_id) == (request_of[span_id].trace_id, span_id)
                       for trace_id, span_id in batch.links)
            assert batch.attributes["ringserve.batch.requests"] == len(batch.links)
            assert [name for name, _ in batch.events] == ["sent"]

        # Each batch ran in the worker, another process, as a child of its batch span: the trace
        # context crossed the ZeroMQ hop in the BATCH message.
        worker_pid = next(w["pid"] for w in stack.status()["workers"] if "mlp" in w["models"])  # mlp's lane
        batch_spans = by_id(batches)
        assert sorted(e.parent_span_id for e in executions) == sorted(batch_spans)
        for execution in executions:
            batch = batch_spans[execution.parent_span_id]
            assert execution.trace_id == batch.trace_id
            assert execution.kind == CONSUMER
            assert execution.resource["ringserve.process.role"] == "worker"
            assert execution.resource["process.pid"] == worker_pid != gateway_pid
            assert execution.attributes["ringserve.batch_id"] == batch.attributes["ringserve.batch_id"]
            assert execution.attributes["ringserve.compute_s"] >= 0
            assert batch.start_ns <= execution.start_ns <= execution.end_ns <= batch.end_ns


POISON_OPENTELEMETRY = """import os, sys
with open(os.environ["RINGSERVE_TEST_OTEL_IMPORTS"], "a") as f:
    f.write(f"{os.getpid()} {sys.argv}\\n")
raise ImportError("a ringserve process imported opentelemetry while tracing is off")
"""


def test_tracing_is_off_by_default_no_span_leaves_and_no_process_imports_opentelemetry(
        start_stack, demo_repo: Path, tmp_path: Path, monkeypatch) -> None:
    # An `opentelemetry` package first on every process's path records who imports it.
    (tmp_path / "poison" / "opentelemetry").mkdir(parents=True)
    (tmp_path / "poison" / "opentelemetry" / "__init__.py").write_text(POISON_OPENTELEMETRY)
    imports = tmp_path / "imports.txt"
    monkeypatch.delenv("OTEL_EXPORTER_OTLP_ENDPOINT", raising=False)
    with OtlpReceiver() as receiver:
        stack: Stack = start_stack(demo_repo, env={
            **FAST_EXPORT, "RINGSERVE_TEST_OTEL_IMPORTS": str(imports), "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT":
                receiver.endpoint + "/v1/traces",  # not ours to read: only the base variable or the flag
            "PYTHONPATH": os.pathsep.join(p for p in [str(tmp_path / "poison"), os.environ.get("PYTHONPATH")] if p)})
        _, _, traceparent = client_context()
        (response,) = asyncio.run(infer_all(stack.url, [mlp_body(np.ones((1, 512), np.float32))], [traceparent]))
        assert response.status_code == 200, response.text
        assert stack.stop() == 0  # every process's exit path ran (where tracing flushes when on)
    assert receiver.requests == 0
    assert not imports.exists(), imports.read_text()


def test_the_gateway_and_the_worker_flush_their_spans_when_the_server_stops(start_stack, demo_repo: Path) -> None:
    with OtlpReceiver() as receiver:
        # Nothing leaves on the processor's schedule within the test: only the exit paths' flush sends.
        stack: Stack = start_stack(demo_repo, "--otel-endpoint", receiver.endpoint,
                                   env={"OTEL_BSP_SCHEDULE_DELAY": "600000"})
        trace_id, _, traceparent = client_context()
        (response,) = asyncio.run(infer_all(stack.url, [mlp_body(np.ones((1, 512), np.float32))], [traceparent]))
        assert response.status_code == 200, response.text
        assert receiver.spans == []
        assert stack.stop() == 0
    roles = {s.name.split(" ")[0]: s.resource["ringserve.process.role"] for s in receiver.spans}
    assert roles == {"POST": "gateway", "queue": "gateway", "batch": "gateway", "execute": "worker"}
    assert {s.trace_id for s in receiver.spans} == {trace_id}
