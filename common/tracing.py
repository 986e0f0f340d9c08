"""OpenTelemetry tracing: a request's way through the gateway, its batch and the worker, as spans.

Off unless an OTLP endpoint is set (`--otel-endpoint`, else $OTEL_EXPORTER_OTLP_ENDPOINT, read
once by the CLI into Settings.otel_endpoint). Off, nothing here imports opentelemetry, `active`
is None, and the hot path pays one `is None` check per request and per batch. On, each gateway
and worker process has its own TracerProvider (service.name `ringserve`, resource attributes
`ringserve.process.role`/`.index`/`.generation`) exporting over OTLP/HTTP (protobuf) through a
BatchSpanProcessor, flushed by `shutdown()` on each process's way out.

The spans (process, kind):

    client's span                      from the request's W3C `traceparent` header, if any
     └─ POST /v2/models/{model}/infer  gateway, SERVER: arrival to the response sent
         ├─ queue wait                 gateway: enqueued to its batch formed
         └─ batch {model}              gateway, PRODUCER: formed to answered (or failed, or split);
             │                         child of its first sampled request's span, linked to every request
             │                         span in it; events `sent` (per attempt), `requeued` (a worker
             │                         died holding it; on the request spans too), `bisected`
             └─ execute {model}        worker, CONSUMER: one per run of the batch; its parent is the
                                       traceparent the BATCH message carries (Batch.trace)

The gRPC path (or any other front end) calls `start_request` and `finish_request` around a
request and sets the InferRequest's `span`; the scheduler does the rest.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from ringserve.common import runtime_settings
from ringserve.common.version import VERSION

log = logging.getLogger(__name__)

ENV_ENDPOINT = "OTEL_EXPORTER_OTLP_ENDPOINT"  # the OTLP base URL; /v1/traces is appended
ENV_SDK_DISABLED = "OTEL_SDK_DISABLED"
ENV_SERVICE_NAME = "OTEL_SERVICE_NAME"
TRACES_PATH = "/v1/traces"
SERVICE_NAME = "ringserve"
PACKAGES = ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http")
INSTALL_HINT = "install ringserve's otel extra (pip install -e '.[otel]' in a checkout)"
# At exit, the spans still buffered get this long to leave: a collector that is down must not hold a
# stopping gateway or worker for the exporter's retries (OTEL_EXPORTER_OTLP_TIMEOUT, 10 s, per batch).
# A stop runs the drain, then a gateway's flush, then a worker's: the unit's TimeoutStopSec is 60 s.
FLUSH_AT_EXIT_S = 2.0

active: Tracing | None = None  # this process's tracing; None: off


# -- configuration (no opentelemetry import) ----------------------------------------------------
def resolve_endpoint(flag: str | None, environ: Mapping[str, str] = os.environ) -> str | None:
    """The OTLP endpoint to use: the flag's, else $OTEL_EXPORTER_OTLP_ENDPOINT, else None (off).

    An empty flag (`--otel-endpoint ''`) turns tracing off even where the variable is set, and
    OTEL_SDK_DISABLED=true turns it off whatever is set, as it does in every OpenTelemetry SDK.
    Raises ValueError for an endpoint that is not an http(s) URL.
    """
    if environ.get(ENV_SDK_DISABLED, "").strip().lower() == "true":
        return None
    endpoint = (environ.get(ENV_ENDPOINT) or None) if flag is None else flag
    if not endpoint:
        return None
    endpoint = endpoint.strip()
    if not endpoint.startswith(("http://", "https://")):
        raise ValueError(
            f"must be an http:// or https:// URL (OTLP over HTTP, e.g. http://localhost:4318), got {endpoint!r}"
        )
    return endpoint


def traces_url(endpoint: str) -> str:
    """An OTLP base URL (as $OTEL_EXPORTER_OTLP_ENDPOINT is) with the traces path; a URL that names it is kept."""
    endpoint = endpoint.rstrip("/")
    return endpoint if endpoint.endswith(TRACES_PATH) else endpoint + TRACES_PATH


def missing_packages() -> str | None:
    """Why tracing cannot start here (the otel extra is not installed), or None."""
    for name in PACKAGES:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            return f"tracing needs the {name} package: {INSTALL_HINT}"
    return None


def setup(endpoint: str | None, role: str, index: int = 0, generation: int = 0) -> Tracing | None:
    """Start tracing in this process when `endpoint` is set (Settings.otel_endpoint); else stay off.

    A process that cannot start it logs why and serves untraced: tracing never stops serving.
    """
    global active
    if not endpoint:
        return None
    try:
        active = Tracing(endpoint, role, index, generation)
    except Exception as exc:  # noqa: BLE001 - the extra missing, a bad URL: serve without traces
        log.error("tracing is off in %s %d: %s (%s)", role, index, exc, missing_packages() or type(exc).__name__)
        return None
    log.info("tracing: spans of %s %d go to %s", role, index, active.url)
    return active


def shutdown() -> None:
    """Export what is still buffered and stop (each process's exit path, after its last span)."""
    global active
    tracing, active = active, None
    if tracing is not None:
        tracing.shutdown()


def tracer() -> Any:
    """This process's OpenTelemetry tracer, or a no-op one while tracing is off (for code off the hot path)."""
    return NO_TRACER if active is None else active.tracer


# -- a request (the one hook a front end calls) -------------------------------------------------
def start_request(headers: Iterable[tuple[Any, Any]], model: str, protocol: str = "http") -> Any:
    """The SERVER span of one inference request, continuing the client's W3C `traceparent`; None when off.

    `headers`: the ASGI headers (bytes pairs) or gRPC metadata (str pairs). Store the span as
    the InferRequest's `span` (its queue wait and batch hang off it), and end it with
    `finish_request` once answered.
    """
    return None if active is None else active.start_request(headers, model, protocol)


def finish_request(span: Any, status: int) -> None:
    """End a request's span with its answer: an HTTP status, or a gRPC status code for protocol grpc."""
    if span is not None and active is not None:
        active.finish_request(span, status)


def start_execution(batch: Any, gateway: int = 0) -> Any:
    """The worker's span of running one BATCH message, a child of the batch span it names (`trace`); None when off."""
    if active is None or batch.trace is None:
        return None
    return active.start_execution(batch, gateway)


def end_execution(span: Any, reply: Any, fused: int = 1) -> None:
    """End an execution span with its Result (compute time) or Error (the span's error status)."""
    if span is not None and active is not None:
        active.end_execution(span, reply, fused)


class Tracing:
    """One process's tracer provider, exporter and the hooks the gateway and the worker call.

    Built only when tracing is on: opentelemetry is imported here, not at module level.
    """

    def __init__(self, endpoint: str, role: str, index: int, generation: int, exporter: Any = None) -> None:
        """`exporter`: None = OTLP/HTTP to `endpoint`; tests pass the SDK's in-memory one."""
        from opentelemetry import trace  # noqa: PLC0415 - OpenTelemetry is imported only when --otel-endpoint is set
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter  # noqa: PLC0415 - OpenTelemetry is imported only when --otel-endpoint is set
        from opentelemetry.sdk.resources import Resource  # noqa: PLC0415 - OpenTelemetry is imported only when --otel-endpoint is set
        from opentelemetry.sdk.trace import TracerProvider  # noqa: PLC0415 - OpenTelemetry is imported only when --otel-endpoint is set
        from opentelemetry.sdk.trace.export import BatchSpanProcessor  # noqa: PLC0415 - OpenTelemetry is imported only when --otel-endpoint is set
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator  # noqa: PLC0415 - OpenTelemetry is imported only when --otel-endpoint is set
        from opentelemetry.trace.status import Status, StatusCode  # noqa: PLC0415 - OpenTelemetry is imported only when --otel-endpoint is set

        self.url = traces_url(endpoint)
        self.role, self.index = role, index
        resource = Resource.create(
            {
                "service.name": os.environ.get(ENV_SERVICE_NAME) or SERVICE_NAME,
                "service.version": VERSION,
                "process.pid": os.getpid(),
                "ringserve.process.role": role,
                "ringserve.process.index": index,
                "ringserve.process.generation": generation,
            }
        )
        # Not the global provider: a library in this process that traces on its own does not
        # send its spans to our endpoint unasked. The sampler is the SDK's: $OTEL_TRACES_SAMPLER,
        # by default parent-based (a client's unsampled traceparent is honoured).
        self.provider = TracerProvider(resource=resource, shutdown_on_exit=False)
        self.provider.add_span_processor(BatchSpanProcessor(exporter or OTLPSpanExporter(endpoint=self.url)))
        self.tracer = self.provider.get_tracer("ringserve", VERSION)
        self._trace, self._kind, self._link = trace, trace.SpanKind, trace.Link
        self._propagator = TraceContextTextMapPropagator()
        self._error = lambda description: Status(StatusCode.ERROR, description)

    def shutdown(self) -> None:
        # BatchSpanProcessor: exports what it holds, then stops its thread; bounded by FLUSH_AT_EXIT_S.
        flush = threading.Thread(target=self.provider.shutdown, name="tracing-flush", daemon=True)
        flush.start()
        flush.join(FLUSH_AT_EXIT_S)
        if flush.is_alive():
            log.warning(
                "tracing: spans not exported within %.0f s at exit (is %s reachable?); dropping them",
                FLUSH_AT_EXIT_S,
                self.url,
            )

    # -- context in and out ----------------------------------------------------------------------
    def _context_of(self, carrier: dict[str, str]) -> Any:
        return self._propagator.extract(carrier) if carrier else None

    def traceparent(self, span: Any) -> str | None:
        carrier: dict[str, str] = {}
        self._propagator.inject(carrier, context=self._trace.set_span_in_context(span))
        return carrier.get("traceparent")

    # -- the gateway -----------------------------------------------------------------------------
    def start_request(self, headers: Iterable[tuple[Any, Any]], model: str, protocol: str) -> Any:
        if not runtime_settings.sampler.admit(model):  # Triton's trace_level, trace_rate, trace_count: untraced
            return None
        carrier = {}
        for name, value in headers:
            if type(name) is bytes:
                name = name.decode("latin-1")
            name = name.lower()
            if name == "traceparent" or name == "tracestate":
                carrier[name] = value.decode("latin-1") if type(value) is bytes else value
        grpc = protocol == "grpc"
        name = "ModelInfer" if grpc else "POST /v2/models/{model}/infer"
        attributes = (
            {"rpc.system": "grpc", "rpc.service": "inference.GRPCInferenceService", "rpc.method": "ModelInfer"}
            if grpc
            else {"http.request.method": "POST", "http.route": "/v2/models/{model}/infer"}
        )
        attributes["ringserve.model"] = model
        return self.tracer.start_span(
            name, context=self._context_of(carrier), kind=self._kind.SERVER, attributes=attributes
        )

    def finish_request(self, span: Any, status: int) -> None:
        if (getattr(span, "attributes", None) or {}).get("rpc.system") == "grpc":
            span.set_attribute("rpc.grpc.status_code", status)
            failed = status in GRPC_SERVER_ERRORS
        else:
            span.set_attribute("http.response.status_code", status)
            failed = status >= 500  # a server span's 4xx is the client's error, not ours
        if failed:
            span.set_status(self._error(f"answered {status}"))
        span.end()

    def batch_formed(self, batch: Any) -> None:
        """The queue-wait span of each request in a batch just formed, and the batch's own span."""
        spans = [r.span for r in batch.requests if r.span is not None]
        if not spans:
            return  # none of its requests is traced (a front end without the hook)
        now_ns, now_s = time.time_ns(), time.monotonic()
        for request in batch.requests:
            if request.span is not None and request.span.is_recording():  # (not sampled: its children never are)
                waited_ns = int((now_s - request.enqueued_at) * 1e9)
                wait = self.tracer.start_span(
                    "queue wait",
                    context=self._trace.set_span_in_context(request.span),
                    start_time=now_ns - waited_ns,
                    attributes={"ringserve.model": batch.model.name, "ringserve.priority": request.priority},
                )
                wait.end(end_time=now_ns)
        batch.span = self._start_batch(batch, _first_sampled(spans), spans, now_ns)

    def _start_batch(self, batch: Any, parent: Any, spans: list[Any], start_ns: int | None = None) -> Any:
        links = [self._link(s.get_span_context()) for s in spans]
        return self.tracer.start_span(
            f"batch {batch.model.name}",
            context=self._trace.set_span_in_context(parent),
            kind=self._kind.PRODUCER,
            links=links,
            start_time=start_ns,
            attributes={
                "ringserve.model": batch.model.name,
                "ringserve.model_version": batch.model.version,
                "ringserve.batch_id": str(batch.batch_id),
                "ringserve.batch.requests": len(batch.requests),
                "ringserve.batch.rows": batch.rows,
            },
        )

    def batch_sent(self, batch: Any, worker: int, generation: int) -> str | None:
        """The traceparent for the BATCH message (the worker's span continues it); event `sent`."""
        span = batch.span
        span.add_event(
            "sent",
            {"ringserve.worker": worker, "ringserve.worker_generation": generation, "ringserve.attempt": batch.attempt},
        )
        return self.traceparent(span)

    def batch_requeued(self, batch: Any, reason: str | None) -> None:
        """A worker died holding the batch (or it could not be sent): back to the head of its queue."""
        if batch.span is None:
            return
        event = {
            "ringserve.attempt": batch.attempt,
            "ringserve.batch_id": str(batch.batch_id),
            # None: the worker died running an earlier batch; this one was only waiting in its inbox
            "ringserve.crash_reason": reason or "none",
        }
        batch.span.add_event("requeued", event)
        for request in batch.requests:
            if request.span is not None and not request.done:
                request.span.add_event("requeued", event)

    def batch_split(self, batch: Any, halves: tuple[Any, Any]) -> None:
        """A batch bisected (isolating a request that kills workers, or that the model refuses)."""
        if batch.span is None:
            return
        batch.span.add_event("bisected", {"ringserve.batch_ids": [str(h.batch_id) for h in halves]})
        for half in halves:
            spans = [r.span for r in half.requests if r.span is not None]
            half.span = self._start_batch(half, batch.span, spans) if spans else None  # (sampled as the batch)
        batch.span.end()
        batch.span = None

    def batch_failed(self, batch: Any, error: BaseException) -> None:
        if batch.span is not None:
            batch.span.set_status(self._error(f"{type(error).__name__}: {error}"))

    def batch_ended(self, batch: Any) -> None:
        if batch.span is not None:
            batch.span.end()
            batch.span = None

    # -- the worker ------------------------------------------------------------------------------
    def start_execution(self, batch: Any, gateway: int) -> Any:
        return self.tracer.start_span(
            f"execute {batch.model}",
            context=self._context_of({"traceparent": batch.trace}),
            kind=self._kind.CONSUMER,
            attributes={
                "ringserve.model": batch.model,
                "ringserve.model_version": batch.version,
                "ringserve.batch_id": str(batch.batch_id),
                "ringserve.attempt": batch.attempt,
                "ringserve.gateway": gateway,
            },
        )

    def end_execution(self, span: Any, reply: Any, fused: int) -> None:
        error = getattr(reply, "error", None)
        if error is not None:
            span.set_status(self._error(error))
        else:
            span.set_attribute("ringserve.compute_s", reply.compute_s)
        if fused > 1:
            span.set_attribute("ringserve.fused_batches", fused)
        span.end()


def _first_sampled(spans: list[Any]) -> Any:
    """The batch span's parent: its first sampled request's span. With a sampler (OTEL_TRACES_SAMPLER)
    the first request may be unsampled; the batch must still be traced for a sampled one in it."""
    for span in spans:
        if span.is_recording():
            return span
    return spans[0]


# gRPC codes that are the server's failure (OpenTelemetry's rule for server spans)
GRPC_SERVER_ERRORS = frozenset(
    {2, 4, 12, 13, 14, 15}
)  # UNKNOWN, DEADLINE_EXCEEDED, UNIMPLEMENTED, INTERNAL, UNAVAILABLE, DATA_LOSS


class _NoSpan:
    """What the no-op tracer's spans are: every call does nothing."""

    def __enter__(self) -> _NoSpan:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def is_recording(self) -> bool:
        return False

    def _nothing(self, *args: object, **kwargs: object) -> None:
        return None

    end = set_attribute = set_attributes = add_event = set_status = record_exception = update_name = _nothing


class _NoTracer:
    def start_span(self, *args: object, **kwargs: object) -> _NoSpan:
        return NO_SPAN

    def start_as_current_span(self, *args: object, **kwargs: object) -> _NoSpan:
        return NO_SPAN


NO_SPAN = _NoSpan()
NO_TRACER = _NoTracer()
