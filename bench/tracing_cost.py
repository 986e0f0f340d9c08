"""`python -m bench.tracing_cost`: what tracing's hooks cost per request and per batch, off and on, with timeit.

Off, the hot path runs exactly the hook lines below (gateway/http/routes.py, scheduler.py, recovery.py,
worker/loop.py): None checks and one attribute store. On, the hooks make the spans (the SDK's
work; the export is a BatchSpanProcessor thread's, not timed here; the in-memory exporter stands in
for OTLP). `python -m bench mlp --otel` measures the served req/s with tracing on and off side by side.
"""
from __future__ import annotations

import argparse
import asyncio
import timeit
from types import SimpleNamespace

from ringserve.common import tracing

HEADERS = [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json"), (b"content-length", b"10000"),
           (b"traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")]


def request_hooks(request) -> None:
    """The infer path's three hook lines (gateway/http/routes.py Endpoints.infer)."""
    span = None if tracing.active is None else tracing.active.start_request(HEADERS, "mlp", "http")
    request.span = span
    if span is not None:
        tracing.finish_request(span, 200)


def batch_hooks(scheduler, batch, message) -> None:
    """The per-batch hook lines: formed (scheduler), sent (scheduler), ended (recovery), run (worker)."""
    if scheduler.tracing is not None:
        scheduler.tracing.batch_formed(batch)
    trace = None if batch.span is None else scheduler.tracing.batch_sent(batch, 0, 1)
    if batch.span is not None:
        scheduler.tracing.batch_ended(batch)
    message.trace = trace
    span = None if message.trace is None else tracing.start_execution(message, 0)
    if span is not None:
        tracing.end_execution(span, SimpleNamespace(error=None, compute_s=0.001))


def nothing(*args: object) -> None:
    """The call the hooks are timed inside, timed alone: subtracted from the off numbers."""


def per_call_ns(fn, number: int, repeat: int = 5) -> float:
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e9


def measure(number: int, rows: int) -> dict[str, float]:
    loop = asyncio.new_event_loop()
    model = SimpleNamespace(name="mlp", version=1)
    requests = [SimpleNamespace(span=None, enqueued_at=0.0, priority=0, rows=1, done=False) for _ in range(rows)]
    batch = SimpleNamespace(span=None, requests=requests, model=model, batch_id=1, rows=rows, attempt=0)
    message = SimpleNamespace(trace=None, model="mlp", version=1, batch_id=1, attempt=0)
    scheduler = SimpleNamespace(tracing=None)
    request = requests[0]
    call_ns = per_call_ns(lambda: nothing(scheduler, batch, message), number)
    out = {"off_request_ns (net of the call)": per_call_ns(lambda: request_hooks(request), number) - call_ns,
           "off_batch_ns (net of the call)": per_call_ns(lambda: batch_hooks(scheduler, batch, message), number) - call_ns,
           "the call itself_ns": call_ns}
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    tracing.active = tracing.Tracing("http://127.0.0.1:9", "gateway", 0, 0, exporter=exporter)
    scheduler.tracing = tracing.active
    try:
        def traced_batch() -> None:
            for r in requests:
                r.span = tracing.active.start_request(HEADERS, "mlp", "http")
            batch_hooks(scheduler, batch, message)
            for r in requests:
                tracing.finish_request(r.span, 200)
            exporter.clear()

        on_number = max(1, number // 1000)
        out["on_request_ns"] = per_call_ns(lambda: (request_hooks(request), exporter.clear()), on_number)
        out[f"on_batch_of_{rows}_with_its_requests_ns"] = per_call_ns(traced_batch, max(1, on_number // rows))
    finally:
        tracing.shutdown()
        loop.close()
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.tracing_cost", description=__doc__)
    parser.add_argument("--number", type=int, default=1_000_000, help="calls per timing (off; on: /1000)")
    parser.add_argument("--rows", type=int, default=16, help="requests per batch in the on case")
    args = parser.parse_args()
    for name, ns in measure(args.number, args.rows).items():
        print(f"{name:40s} {ns:10.1f} ns")


if __name__ == "__main__":
    main()
