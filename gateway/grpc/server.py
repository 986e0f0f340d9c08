"""KServe v2 gRPC (Triton's `inference.GRPCInferenceService`) beside HTTP, in every gateway process.

It runs on the gateway's event loop (grpcio's core server, gateway/grpc/core.py, or grpc.aio, gateway/grpc/aio.py)
over the same data plane as HTTP
(gateway/kserve/dataplane.py): one lookup, one availability check, one request parser
(gateway/grpc/codec.py turns the protobuf into the KServe codec's document), one dispatcher, so
HTTP and gRPC requests share batches. Nothing here imports an HTTP module. The
messages and the service are the ones `tritonclient.grpc` ships (service_pb2, model_config_pb2).

The listener, its options and the health service are gateway/grpc/listener.py. What one stream can
hold is bounded: --grpc-stream-max-in-flight requests per ModelStreamInfer stream (see ModelStreamInfer).
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from typing import Any, cast

import grpc
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2, service_pb2_grpc
from tritonclient.grpc import service_pb2 as pb

from ringserve.common.repository.config import ModelConfig
from ringserve.common.settings import Settings
from ringserve.gateway.codec.parse import parse_infer_doc
from ringserve.gateway.core.errors import GatewayError, ModelNotFound, Unavailable, echo
from ringserve.gateway.core.region_errors import ClientShmDisabled, CudaSharedMemoryUnsupported, RegionNotFound
from ringserve.gateway.core.request import InferRequest
from ringserve.gateway.grpc.codec import (
    GRPC_CODE,
    ReceivedInfer,
    grpc_code,
    infer_doc,
    infer_response,
    parameters_doc,
)
from ringserve.gateway.grpc.connections import ConnectionLedger
from ringserve.gateway.grpc.context import CallContext, RequestMessages
from ringserve.gateway.grpc.settings import SettingsRpcs
from ringserve.gateway.grpc.stream import StreamWindow, serve_stream
from ringserve.gateway.kserve.auth import ApiKey
from ringserve.gateway.kserve.dataplane import FAULT_INJECTION, SERVER_METADATA, UNKNOWN_MODEL_LABEL, DataPlane
from ringserve.gateway.observe.access import request_id_of

log = logging.getLogger(__name__)

MODEL_INFER_PATH = "/inference.GRPCInferenceService/ModelInfer"  # (the access log's path)
ENCODE_ASIDE_MIN_ELEMENTS = 64 * 1024  # BYTES output elements an answer encodes on the loop (about 50 ms)
STREAM_MAX_IN_FLIGHT = Settings.__dataclass_fields__["grpc_stream_max_in_flight"].default


def _metadata_value(metadata: Any, key: str) -> str | None:
    """A gRPC request's metadata value (keys are lower case), or None."""
    for name, value in metadata or ():
        if name == key:
            return value if isinstance(value, str) else None
    return None


def _bytes_elements(outcome: dict) -> int:
    """The BYTES elements of a model's outputs: past ENCODE_ASIDE_MIN_ELEMENTS its answer is encoded in the
    gateway's parse thread (DataPlane.parse_aside's), so that the loop answers health probes meanwhile."""
    return sum(array.size for array in outcome.values() if getattr(getattr(array, "dtype", None), "kind", "") == "O")


def grpc_code_of_status(status: int) -> int:
    """The gRPC status code (its number) of an HTTP status, as grpc_code maps the errors (200: OK)."""
    return 0 if status == 200 else GRPC_CODE.get(status, grpc.StatusCode.INTERNAL).value[0]


class InferenceService(service_pb2_grpc.GRPCInferenceServiceServicer):
    """The RPCs, each a thin translation onto the data plane."""

    def __init__(
        self,
        plane: DataPlane,
        api_key: ApiKey | None,
        key_on_health: bool,
        stream_max_in_flight: int = STREAM_MAX_IN_FLIGHT,
        connections: ConnectionLedger | None = None,
    ) -> None:
        self.plane = plane
        self.connections = connections or ConnectionLedger()  # what each connection may hold (connections.py)
        self.stream_max_in_flight = stream_max_in_flight  # --grpc-stream-max-in-flight
        self.dispatcher = plane.dispatcher
        self.api_key = api_key
        self.key_on_health = key_on_health  # --api-key-everywhere: live and ready need it too
        self.runtime_settings = SettingsRpcs(plane)  # Triton's LogSettings and TraceSetting

    # -- the API key: metadata `authorization: Bearer <key>`, as HTTP's header ----------------------
    async def _authorize(self, context: CallContext, health: bool = False) -> None:
        if self.api_key is None or (health and not self.key_on_health):
            return
        headers = [
            (b"authorization", v if isinstance(v, bytes) else v.encode())
            for k, v in (context.invocation_metadata() or ())
            if k == "authorization"
        ]
        refusal = self.api_key.refusal(headers)
        if refusal is not None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, str(refusal))

    async def _abort(self, context: CallContext, exc: GatewayError) -> None:
        await context.abort(grpc_code(exc), str(exc))

    # -- health and metadata -------------------------------------------------------------------------
    async def ServerLive(self, request: pb.ServerLiveRequest, context) -> pb.ServerLiveResponse:
        await self._authorize(context, health=True)
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: pb.ServerReadyRequest, context) -> pb.ServerReadyResponse:
        await self._authorize(context, health=True)
        return pb.ServerReadyResponse(ready=self.plane.server_ready())

    async def ModelReady(self, request: pb.ModelReadyRequest, context) -> pb.ModelReadyResponse:
        """ready false for a model or version that is not served, as for one that is not serving: Triton's
        clients (tritonclient.grpc's is_model_ready, its QA's lifecycle tests) take that as "not ready",
        where an error status would raise. HTTP's ready route answers such a model with a 4xx, which
        tritonclient.http reads as not ready too."""
        await self._authorize(context)
        try:
            config = self.plane.lookup(request.name, request.version or None)
            self.plane.check_serving(config)
        except (Unavailable, ModelNotFound):
            return pb.ModelReadyResponse(ready=False)
        except GatewayError as exc:  # a name or version no model can have: INVALID_ARGUMENT, as Triton's
            await self._abort(context, exc)
        return pb.ModelReadyResponse(ready=True)

    async def ServerMetadata(self, request, context) -> pb.ServerMetadataResponse:
        await self._authorize(context)
        return pb.ServerMetadataResponse(**SERVER_METADATA)

    async def ModelMetadata(self, request: pb.ModelMetadataRequest, context) -> pb.ModelMetadataResponse:
        await self._authorize(context)
        try:
            config = self.plane.lookup(request.name, request.version or None)
        except GatewayError as exc:
            await self._abort(context, exc)
        return json_format.ParseDict(self.plane.metadata_doc(config), pb.ModelMetadataResponse())

    async def ModelConfig(self, request: pb.ModelConfigRequest, context) -> pb.ModelConfigResponse:
        """The config in force, as HTTP's /config; ringserve's own fields (padding) have no protobuf field."""
        await self._authorize(context)
        try:
            config = self.plane.lookup(request.name, request.version or None)
        except GatewayError as exc:
            await self._abort(context, exc)
        message = json_format.ParseDict(config.to_json(), model_config_pb2.ModelConfig(), ignore_unknown_fields=True)
        return pb.ModelConfigResponse(config=message)

    async def ModelStatistics(self, request: pb.ModelStatisticsRequest, context) -> pb.ModelStatisticsResponse:
        """The whole server's statistics (every gateway's, as HTTP's /stats); an empty name: every model."""
        await self._authorize(context)
        plane = self.plane
        try:
            name = request.name or None  # (a version without a name names nothing: every model's)
            configs = plane.statistics_configs(name, (request.version or None) if name else None)
            if request.name:
                path = f"/v2/models/{request.name}" + (f"/versions/{request.version}" if request.version else "")
                path += "/stats"
            else:
                path = "/v2/models/stats"
        except GatewayError as exc:
            await self._abort(context, exc)
        doc = await plane.statistics_doc(configs, path, "server")
        return json_format.ParseDict(doc, pb.ModelStatisticsResponse(), ignore_unknown_fields=True)

    # -- the repository ------------------------------------------------------------------------------
    async def RepositoryIndex(self, request: pb.RepositoryIndexRequest, context) -> pb.RepositoryIndexResponse:
        await self._authorize(context)
        models = self.plane.repository.index(request.ready)
        return json_format.ParseDict({"models": models}, pb.RepositoryIndexResponse(), ignore_unknown_fields=True)

    async def RepositoryModelLoad(self, request: pb.RepositoryModelLoadRequest, context):
        await self._authorize(context)
        try:
            await self.plane.repository.load(request.model_name, parameters_doc(request.parameters))
        except GatewayError as exc:
            await self._abort(context, exc)
        return pb.RepositoryModelLoadResponse()

    async def RepositoryModelUnload(self, request: pb.RepositoryModelUnloadRequest, context):
        await self._authorize(context)
        try:
            await self.plane.repository.unload_request(request.model_name, parameters_doc(request.parameters))
        except GatewayError as exc:
            await self._abort(context, exc)
        return pb.RepositoryModelUnloadResponse()

    # -- inference -----------------------------------------------------------------------------------
    async def infer(
        self,
        received: ReceivedInfer,
        disconnected: Callable[[], bool] | None = None,
        metadata: Any = None,
        path: str = MODEL_INFER_PATH,
        request_id: str | None = None,
        stream: Callable[..., None] | None = None,
        arrived_ns: int | None = None,
        respond: Callable[[pb.ModelInferResponse], None] | None = None,
    ) -> pb.ModelInferResponse | None:
        """One request through the data plane, with its request id (None: the metadata's `x-request-id`,
        or one made here). A decoupled model's responses go to `stream(request, outputs, error)` as they
        come (None is returned once the model sent its last); without `stream` such a model is refused."""
        plane = self.plane
        message = received.request
        if request_id is None:
            request_id = request_id_of(_metadata_value(metadata, "x-request-id"))
        with plane.call(
            message.model_name, request_id, metadata or (), "grpc", "GRPC", path, arrived_ns, grpc_code_of_status
        ) as call:
            if received.refusal is not None:
                call.label = UNKNOWN_MODEL_LABEL
                raise received.refusal()
            config = call.target(message.model_version or None, "gRPC ModelInfer", streaming=stream is not None)
            parse = functools.partial(self._parse, config, received)
            outcome = await call.run(parse, received.nbytes, disconnected, stream)  # (cancelled: see ModelInfer)
            if config.decoupled:
                return None
            if _bytes_elements(outcome) < ENCODE_ASIDE_MIN_ELEMENTS:
                response = infer_response(call.request, outcome)
            else:  # (a Python step each: 2 M took the loop a second; encoded where such inputs are parsed)
                response = await asyncio.get_running_loop().run_in_executor(
                    plane.parse_thread, infer_response, call.request, outcome
                )
            if respond is not None:  # (sent inside the call's span, as Triton counts a request's time)
                respond(response)
            call.answered(response.ByteSize())
        return response

    def _parse(self, config: ModelConfig, received: ReceivedInfer, future: asyncio.Future) -> InferRequest:
        capacity_bytes = self.plane.capacity_bytes
        doc, raw = infer_doc(received.request, received.raw, capacity_bytes)
        return parse_infer_doc(
            config,
            doc,
            raw,
            capacity_bytes=capacity_bytes,
            future=future,
            allow_faults=FAULT_INJECTION,
            regions=self.plane.regions,
            max_tensor_bytes=self.plane.max_tensor_bytes,
        )

    async def ModelInfer(self, request: ReceivedInfer, context) -> pb.ModelInferResponse | None:
        await self._authorize(context)
        metadata = context.invocation_metadata()
        request_id = request_id_of(_metadata_value(metadata, "x-request-id"))
        answer_metadata = (("x-request-id", request_id),)  # every answer carries it, as over HTTP

        def respond(response: pb.ModelInferResponse) -> None:
            context.set_trailing_metadata(answer_metadata)
            context.answer(response.SerializeToString())

        on_cancelled = getattr(context, "on_cancelled", None)
        if on_cancelled is not None:  # a cancelled call cancels its request: a Python model sees is_cancelled()
            on_cancelled(cast(asyncio.Task, asyncio.current_task()).cancel)
        peer, nbytes = context.peer(), request.nbytes
        try:
            self.connections.admit(peer, nbytes)
            try:
                await self.infer(
                    request,
                    context.cancelled,
                    metadata,
                    request_id=request_id,
                    arrived_ns=context.arrived_ns,
                    respond=respond,
                )
            finally:
                self.connections.release(peer, nbytes)
        except GatewayError as exc:
            code, details = grpc_code(exc), str(exc)
        else:
            return None  # (answered by respond)
        finally:
            if on_cancelled is not None:
                on_cancelled(None)  # (the call held this task: a cycle per call otherwise)
        # Answered with a status, not context.abort(): grpc keeps the AbortError that abort raises (on the
        # call's state, which `context` holds), and its traceback holds grpc's own frames, which hold the
        # received bytes; that was a cycle, and each failed 250 MiB message stayed until the cyclic
        # collector happened to run. (grpc sends no message with a non-OK status.)
        del request
        context.set_code(code)
        context.set_details(details)
        context.set_trailing_metadata(answer_metadata)
        return None

    async def ModelStreamInfer(self, request_iterator: RequestMessages, context: CallContext) -> None:
        """Each request of the stream is served as it arrives, concurrently (so they can share a batch);
        answers go back in the order the requests came (as Triton's), each carrying the request's id;
        a decoupled model's responses as they come. An error answers that request alone
        (error_message), as Triton's stream does; the stream goes on.

        Back-pressure: at most `stream_max_in_flight` requests are read and not yet answered back (an
        answer is back once grpcio has sent it, which waits for the client's flow-control window). At
        the cap the stream is not read until an answer goes out, so HTTP/2's flow control holds the
        client's writes: a client that never reads its answers holds that many requests, where it used
        to queue every request it could write (20,000 in 30 s). Chosen over RESOURCE_EXHAUSTED per
        request because those refusals would be answers too, queued for a client that reads none, and
        because a client that does read loses nothing. Each request still meets its model's queue
        policy (max_queue_size) at submit, as any other request does.

        The core reads the stream ahead and sends its answers one after another off the loop
        (gateway/grpc/core_call.py: RequestStream, CoreCall.send): perf_analyzer puts 4 requests in flight on
        each of its streams, and each waited a loop turn to be read and another to be answered."""
        await self._authorize(context)
        peer = context.peer()
        try:  # (a stream is one call; its requests' bytes count as they are read)
            self.connections.admit(peer, 0)
        except GatewayError as exc:
            await self._abort(context, exc)
        window = StreamWindow(request_iterator, self.stream_max_in_flight, self.plane.metrics.grpc_stream_in_flight)
        try:
            await serve_stream(request_iterator, context, peer, window, self.infer, self.connections)
        finally:
            self.connections.release(peer, 0)

    # -- Triton's shared-memory extensions: the same operations as over HTTP (gateway/http/shm_routes.py) ---
    async def SystemSharedMemoryStatus(self, request: pb.SystemSharedMemoryStatusRequest, context):
        await self._authorize(context)
        try:
            regions = await self.plane.shared_memory.region_status(request.name or None)
        except RegionNotFound as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))  # (a 400 to grpc_code: Triton says NOT_FOUND)
        except GatewayError as exc:
            await self._abort(context, exc)
        status = pb.SystemSharedMemoryStatusResponse.RegionStatus
        return pb.SystemSharedMemoryStatusResponse(
            regions={
                r["name"]: status(name=r["name"], key=r["key"], offset=r["offset"], byte_size=r["byte_size"])
                for r in regions
            }
        )

    async def SystemSharedMemoryRegister(self, request: pb.SystemSharedMemoryRegisterRequest, context):
        await self._authorize(context)
        try:
            await self.plane.shared_memory.register_region(
                request.name, {"key": request.key, "offset": request.offset, "byte_size": request.byte_size}
            )
        except GatewayError as exc:
            await self._abort(context, exc)
        return pb.SystemSharedMemoryRegisterResponse()

    async def SystemSharedMemoryUnregister(self, request: pb.SystemSharedMemoryUnregisterRequest, context):
        await self._authorize(context)
        try:
            await self.plane.shared_memory.unregister_region(request.name or None)
        except GatewayError as exc:
            await self._abort(context, exc)
        return pb.SystemSharedMemoryUnregisterResponse()

    # CUDA shared memory: as Triton built without GPUs answers (no GPU memory is ever registered).
    async def CudaSharedMemoryStatus(self, request: pb.CudaSharedMemoryStatusRequest, context):
        await self._authorize(context)
        if request.name:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"Unable to find cuda shared memory region: {echo(request.name)}"
            )
        return pb.CudaSharedMemoryStatusResponse()

    async def CudaSharedMemoryRegister(self, request: pb.CudaSharedMemoryRegisterRequest, context):
        await self._authorize(context)
        if not self.plane.regions.allowed:  # (Triton answers this before it looks at GPUs)
            await self._abort(context, ClientShmDisabled())
        await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(CudaSharedMemoryUnsupported(request.name)))

    async def CudaSharedMemoryUnregister(self, request: pb.CudaSharedMemoryUnregisterRequest, context):
        await self._authorize(context)
        if not self.plane.regions.allowed:
            await self._abort(context, ClientShmDisabled())
        return pb.CudaSharedMemoryUnregisterResponse()

    # -- Triton's logging and trace extensions --------------------------------------------------------
    async def TraceSetting(self, request, context):
        await self._authorize(context)
        return await self.runtime_settings.trace_setting(request, context)  # (gateway/grpc/settings.py)

    async def LogSettings(self, request, context):
        await self._authorize(context)
        return await self.runtime_settings.log_settings(request, context)
