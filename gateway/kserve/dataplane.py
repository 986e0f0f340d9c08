"""The KServe v2 data plane: what a request to the server does, whichever protocol carried it.

HTTP (gateway/http/), gRPC (gateway/grpc/) and the workers' calls (gateway/calls/) each hold an infer
request in one call context (`with plane.call(...) as call:`, gateway/kserve/infer_call.py), turning their
wire format into its steps and the outcome into their answer; everything between happens here, once:

    call        begin: the call's clock, its request id, its span; leaving it: finish
    target      lookup (404 / the `_unknown` label), readiness of an unloaded model, decoupled or not
    run         parse (in the parse thread for big BYTES requests), submit to the dispatcher, await
    failed      the status of a GatewayError, and Triton's failure statistics
    finish      the request counter, Triton's success statistics, the access line, the span's end

and the model- and server-level operations both protocols answer: readiness, metadata, the
statistics document (every gateway's, merged), the repository and the shared-memory regions.

The scheduler's Statistics are made by the caller and given to both the dispatcher and the data plane
at construction (gateway/process.py builds them): no layer above sets them afterwards. Of the dispatcher
the plane sees only WorkerSide, a Protocol of what it calls.
"""

from __future__ import annotations

import asyncio
import functools
import os
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from ringserve.common import tracing
from ringserve.common.repository.config import ModelConfig
from ringserve.common.version import VERSION
from ringserve.gateway.cache.responses import ResponseCache
from ringserve.gateway.cluster.merge import merge_statistics
from ringserve.gateway.cluster.peers import SCOPE_GATEWAY, Peers
from ringserve.gateway.cluster.triton_metrics import TritonMetrics
from ringserve.gateway.codec.parse import parse_infer_doc
from ringserve.gateway.core.errors import (
    BadRequest,
    ClientDisconnected,
    DecoupledNeedsStream,
    GatewayError,
    ModelNotFound,
    Unavailable,
    status_of,
)
from ringserve.gateway.core.phrases import say
from ringserve.gateway.core.region_registry import RegionRegistry
from ringserve.gateway.core.request import InferRequest
from ringserve.gateway.core.settings import DispatchSettings
from ringserve.gateway.dispatch.catalog import Catalog
from ringserve.gateway.dispatch.fleet import WorkerHandle
from ringserve.gateway.dispatch.link import Link
from ringserve.gateway.kserve.infer_call import InferCall
from ringserve.gateway.kserve.repository import Repository, check_model_name, check_version
from ringserve.gateway.kserve.shared_memory import SharedMemory
from ringserve.gateway.observe.access import AccessLog
from ringserve.gateway.observe.metrics import Metrics
from ringserve.gateway.observe.stats import Statistics, record_success
from ringserve.shm.segment import Segment

FAULT_INJECTION = os.environ.get("RINGSERVE_FAULT_INJECTION") == "1"
UNKNOWN_MODEL_LABEL = "_unknown"
# Triton's protocol extensions this server serves, in Triton's order (core server.cc): the `extensions`
# of /v2 and of gRPC's ServerMetadata are this tuple. To serve one more, add its name here and a probe of
# it to tests/integration/test_triton_rules.py (EXTENSION_PROBES), which checks each listed one.
EXTENSIONS: tuple[str, ...] = (
    "classification",  # an output's parameters.classification / class_count (codec/classification.py)
    "sequence",  # sequence_id, sequence_start, sequence_end: the sequence batcher and its state (sessions)
    "model_repository",  # /v2/repository/index, models/{m}/load, unload (and gRPC's Repository* calls)
    "schedule_policy",  # parameters.priority and timeout (codec/parse.py)
    "model_configuration",  # /v2/models/{m}/config
    "system_shared_memory",  # /v2/systemsharedmemory/... (gateway/http/shm_routes.py, gRPC's)
    "binary_tensor_data",  # Inference-Header-Content-Length and binary_data_size (codec/binary.py)
    "statistics",  # /v2/models/stats, /v2/models/{m}/stats
    "trace",  # /v2[/models/{m}]/trace/setting, gRPC's TraceSetting (gateway/cluster/runtime_settings.py)
    "logging",  # /v2/logging, gRPC's LogSettings (the same)
)
SERVER_METADATA = {"name": "ringserve", "version": VERSION, "extensions": EXTENSIONS}
# A request larger than this, of a model with BYTES inputs, is parsed in the parse thread (DataPlane.run):
# under it there are at most 64 Ki elements (each takes 4 bytes of binary form or 3 of JSON at least), some
# 60 ms of Python steps on the loop.
PARSE_ASIDE_MIN_BYTES = 256 << 10


class WorkerSide(Protocol):
    """What the data plane needs of the gateway's side of the workers: the Dispatcher in the server
    (gateway/process.py hands it over), a fake in a unit test. Nothing else of the dispatcher is read here."""

    segment: Segment  # the ring: its slots' data capacity bounds a request
    regions: RegionRegistry  # the clients' shared-memory regions
    catalog: Catalog  # the models' versions, and the ones that failed their config
    settings: DispatchSettings  # retry_after_s

    link: Link | None  # the workers' channel: a lane's BLS call is answered on it (gateway/calls/)

    def submit(self, request: InferRequest) -> None: ...
    def check_available(self, key: str) -> None: ...
    def ready_to_serve(self) -> bool: ...
    def ready_workers(self, model: str | None = None) -> list[WorkerHandle]: ...  # (a wedged one's: not ready)
    def cancel(self, request: InferRequest, error: GatewayError) -> None: ...  # (the client went away)


class DataPlane:
    """One gateway's data plane, over its side of the workers, metrics, statistics and repository."""

    def __init__(
        self,
        configs: dict[str, ModelConfig],
        dispatcher: WorkerSide,
        metrics: Metrics,
        statistics: Statistics,
        *,
        repository: Repository,
        peers: Peers | None = None,
        access_log: AccessLog | None = None,
        max_tensor_bytes: int = 0,
        cache: ResponseCache | None = None,
    ) -> None:
        self.configs = configs  # the catalog's dict of default versions: a reload changes what is looked up
        self.dispatcher = dispatcher
        self.metrics = metrics
        self.statistics = statistics
        self.peers = peers  # the other gateways (None: this one is the server)
        self.access_log = access_log  # None: --access-log is off, and costs one test per request
        self.max_tensor_bytes = max_tensor_bytes  # --max-tensor-bytes (0: only the slot bounds a tensor)
        self.cache = cache  # Triton's response cache (--cache-config); None: off
        self.capacity_bytes = dispatcher.segment.data_capacity
        self.regions = dispatcher.regions
        self.repository = repository  # Triton's model repository extension (it drives the dispatcher's models)
        self.shared_memory = SharedMemory(self.regions, peers)
        self.parse_thread = ThreadPoolExecutor(1, thread_name_prefix="ringserve-parse")  # (started at its first use)
        # False while --grpc-port is on and its listener not yet up (it starts once a worker serves this
        # gateway): not ready until then, so that a client told "ready" finds both protocols listening.
        self.grpc_listening = True
        metrics.registry.register(TritonMetrics(statistics, dispatcher.catalog))  # nv_inference_*

    # -- models and the server ---------------------------------------------------------------------
    def lookup(self, model: str, version: str | None) -> ModelConfig:
        config = self.configs.get(model)
        if config is None:
            check_model_name(model)
            self.dispatcher.catalog.check_failed(model)  # 503 with the reason when its config is broken
            raise ModelNotFound(model, version, sorted(self.configs))
        if version is not None and version != str(config.version):
            check_version(version)
            return self.dispatcher.catalog.version(config, version)  # another served version, or 404
        return config

    def check_serving(self, config: ModelConfig) -> None:
        """503 when the model is unloaded, quarantined or has no ready worker."""
        why = self.repository.unloaded.get(config.name)
        if why is not None:
            raise Unavailable(
                say("no_available_versions", f"model {config.name!r} is not loaded: {why}", model=config.name),
                self.dispatcher.settings.retry_after_s,
            )
        self.dispatcher.check_available(config.key)  # the key names one version: 'm' or 'm/2'
        holders = [w for w in self.dispatcher.ready_workers(config.key) if not w.standby]
        if holders and all(w.wedged for w in holders):  # its beats stopped: wedged, not busy
            raise Unavailable(
                f"model {config.name!r}: its worker(s) stopped answering heartbeats; not ready until they "
                "beat again or are replaced",
                self.dispatcher.settings.retry_after_s,
            )

    def server_ready(self) -> bool:
        """/v2/health/ready, gRPC's ServerReady and /admin/status's `ready`: serving no model at all is
        never ready (but in explicit mode, which starts with none, as Triton's), nor before every model's worker
        has announced it (Dispatcher.ready_to_serve)."""
        explicit = self.dispatcher.settings.model_control_mode == "explicit"
        return self.grpc_listening and (bool(self.configs) or explicit) and self.dispatcher.ready_to_serve()

    def metadata_doc(self, config: ModelConfig) -> dict:
        """A model's metadata."""
        batch = [-1] if config.max_batch_size > 0 else []
        versions = [str(c.version) for c in self.dispatcher.catalog.served_versions(config.name)]
        platform = config.platform or str(config.extra.get("backend", ""))  # Triton's: "python" for a model.py

        def describe(tensors):
            return [{"name": t.name, "datatype": t.datatype, "shape": batch + list(t.dims)} for t in tensors]

        return {
            "name": config.name,
            "versions": versions or [str(config.version)],
            "platform": platform,
            "inputs": describe(config.inputs),
            "outputs": describe(config.outputs),
        }

    def statistics_configs(self, model: str | None, version: str | None) -> list[ModelConfig]:
        """The model versions a statistics request names: as Triton, every served version of the model
        when no version is named, of every model when no model is."""
        if model is not None and version is not None:
            return [self.lookup(model, version)]
        served = self.dispatcher.catalog.served_versions
        if model is not None:
            return served(self.lookup(model, None).name)
        return [config for name in sorted(self.configs) for config in served(name)]

    async def statistics_doc(self, configs: list[ModelConfig], path: str, scope: str) -> dict:
        """Triton's statistics of `configs`, every gateway's summed (gateway/cluster/merge.py), or with
        scope "gateway" this one's own; `path` is the HTTP path the peers are asked."""
        own = {"model_stats": [self.statistics.model_stats(c) for c in configs]}
        if self.peers is None or not self.peers.others() or scope == SCOPE_GATEWAY:
            return own  # (one gateway: Triton's document as it is)
        docs, unreachable = {}, {}
        for answer in await self.peers.get(path + "?scope=" + SCOPE_GATEWAY):
            doc = answer.json_object()
            if isinstance(doc, str):
                unreachable[answer.gateway_index] = doc
            else:
                docs[answer.gateway_index] = doc
        merged, unreadable = merge_statistics(own, docs)
        unreachable.update(unreadable)
        answered = sorted({self.peers.index, *docs} - set(unreachable))
        merged["gateways"] = {
            "answered": answered,
            "unreachable": {str(k): why for k, why in sorted(unreachable.items())},
        }
        return merged

    # -- inference ---------------------------------------------------------------------------------
    def call(
        self,
        model: str,
        request_id: str,
        span_headers: Any,
        protocol: str,
        method: str,
        path: str,
        arrived_ns: int | None = None,
        code_of: Callable[[int], int] | None = None,
    ) -> InferCall:
        """One call's context (`with plane.call(...) as call:`): begun now, finished on leaving it. `method`
        and `path` are the access line's; `code_of` turns a status into the span's code (gRPC's)."""
        call = self.begin(model, request_id, span_headers, protocol, arrived_ns)
        call.plane, call.method, call.path = self, method, path
        if code_of is not None:
            call.code_of = code_of
        return call

    def begin(
        self, model: str, request_id: str, span_headers: Any, protocol: str, arrived_ns: int | None = None
    ) -> InferCall:
        """A call's start: its clock (Triton's statistics and the access line count from `arrived_ns`, the
        front end's first sight of the request's bytes, or from now)."""
        span = None if tracing.active is None else tracing.active.start_request(span_headers, model, protocol)
        return InferCall(arrived_ns or time.perf_counter_ns(), request_id, span, model)

    def target(
        self, call: InferCall, model: str, version: str | None, where: str, streaming: bool = False
    ) -> ModelConfig:
        """The model version the call names, or the GatewayError that answers it; `where` names the
        route for a decoupled model that needs a stream instead (`streaming`: this call is one)."""
        try:
            config = self.lookup(model, version)
        except GatewayError:
            call.label = UNKNOWN_MODEL_LABEL
            raise
        call.config, call.label_version = config, config.version
        if config.name in self.repository.unloaded:
            self.check_serving(config)
        if config.decoupled and not streaming:
            raise DecoupledNeedsStream(config.name, where)
        return config

    def doc_parser(
        self, config: ModelConfig, doc: dict[str, Any], allow_faults: bool = False
    ) -> Callable[[asyncio.Future], InferRequest]:
        """The parse step of a request already read as a KServe JSON document (no binary part, no regions):
        what the routes that build one from another shape (generate, OpenAI's) hand `run`."""
        return functools.partial(
            parse_infer_doc,
            config,
            doc,
            None,
            capacity_bytes=self.capacity_bytes,
            allow_faults=allow_faults,
            max_tensor_bytes=self.max_tensor_bytes,
        )

    def run(
        self,
        call: InferCall,
        parse: Callable[[asyncio.Future], InferRequest],
        size: int,
        disconnected: Callable[[], bool] | None,
        stream: Callable[..., None] | None = None,
    ) -> Awaitable[Any]:
        """parse(future=) -> the request, submitted to the dispatcher; awaited, its outcome once it ran. `size`
        is the request's bytes: many BYTES elements are parsed in the parse thread (parse_aside). A
        decoupled model's responses go to stream(request, outputs, error) as they come. Not a coroutine: the
        usual request is parsed and submitted here and its future handed back, one coroutine frame fewer on
        every request's way in and out."""
        future = asyncio.get_running_loop().create_future()
        if call.config.bytes_inputs and size > PARSE_ASIDE_MIN_BYTES:
            return self._run_aside(call, parse, future, disconnected, stream)
        self._submit(call, parse(future=future), disconnected, stream)
        return future

    async def _run_aside(
        self,
        call: InferCall,
        parse: Callable[[asyncio.Future], InferRequest],
        future: asyncio.Future,
        disconnected: Callable[[], bool] | None,
        stream: Callable[..., None] | None,
    ) -> Any:
        self._submit(call, await self.parse_aside(lambda: parse(future=future)), disconnected, stream)
        return await future

    def _submit(
        self,
        call: InferCall,
        request: InferRequest,
        disconnected: Callable[[], bool] | None,
        stream: Callable[..., None] | None,
    ) -> None:
        config = call.config
        call.request = request
        request.disconnected = disconnected
        request.request_id = call.request_id
        request.arrived_ns = call.started_ns
        request.span = call.span
        if config.decoupled:
            if request.output_regions is not None:
                raise BadRequest(
                    f"model {config.name!r} is decoupled: its outputs cannot go into shared-memory regions"
                )
            request.stream = lambda outputs, error: stream(request, outputs, error)
        if config.kind == "python":  # a cancelled await (gRPC: a cancelled call or stream) cancels the request
            request.future.add_done_callback(lambda future: self.cancel(call) if future.cancelled() else None)
        if self.cache is not None and (cached := self.cache.lookup(request)) is not None:
            call.cache = cached
            if cached.hit:
                return  # answered from the cache: no batcher, no worker
        self.dispatcher.submit(request)

    def cancel(self, call: InferCall) -> None:
        """The call's client went away or cancelled it: its request, if it is still waiting for its answer,
        is answered 499 and a Python model running it sees is_cancelled() (dispatch/replies.py: cancel)."""
        request = call.request
        if request is not None and not request.done:
            self.dispatcher.cancel(request, ClientDisconnected())

    async def parse_aside(self, parse: Callable[[], InferRequest]) -> InferRequest:
        """parse() in the gateway's parse thread. A request with many BYTES elements costs a Python step
        each (lengths, objects, UTF-8); there the interpreter hands the loop the GIL within the switch
        interval (1 ms in the gateway: gateway/__main__.py), so health checks and other requests go on
        meanwhile. One thread: the loop shares the GIL with it alone."""
        return await asyncio.get_running_loop().run_in_executor(self.parse_thread, parse)

    def failed(self, call: InferCall, exc: GatewayError) -> int:
        """The status that answers `exc`; a model's failure counted in its statistics."""
        config = call.config
        if config is not None:
            self.statistics.record_failure(config.name, config.version, time.perf_counter_ns() - call.started_ns, exc)
        return status_of(exc)

    def finish(self, call: InferCall, status: int, method: str, path: str, nbytes: int, status_code: int) -> None:
        """Once the answer is on its way: counted, Triton's success statistics, the access line, the span
        (ended with `status_code`: the HTTP status or the gRPC code)."""
        self.metrics.count_request(call.label, call.label_version, status)
        request = call.request
        if status == 200 and request is not None and request.stages is not None:  # (gateway/observe/stats.py)
            record_success(request, time.perf_counter_ns())
        if call.cache is not None and self.cache is not None:
            self.cache.finished(call.cache, call.config, call.started_ns, status)  # (a hit's success, a miss stored)
        if self.access_log is not None:
            batch_size = None if request is None else request.batch_size or None  # 0: it ran in no batch
            self.access_log.write(
                method, path, status, nbytes, call.started_ns, call.request_id, call.model, batch_size
            )
        if call.span is not None:
            tracing.finish_request(call.span, status_code)
