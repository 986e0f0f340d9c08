"""The gateway's ASGI application: API key check, then the raw infer path in front of Starlette. It is handed
the data plane and the peers (gateway/process.py builds them) and starts or stops nothing."""

from __future__ import annotations

import time

from starlette.applications import Starlette
from starlette.responses import Response

from ringserve.gateway.cluster.peers import Peers
from ringserve.gateway.core.errors import GatewayError, MethodNotAllowed, NoRoute, error_body, status_of
from ringserve.gateway.dispatch.dispatcher import Dispatcher
from ringserve.gateway.http.generate import GenerateEndpoints, match_generate_path
from ringserve.gateway.http.routes import Endpoints, WriteResponse, match_infer_path
from ringserve.gateway.kserve.auth import ApiKey
from ringserve.gateway.kserve.dataplane import DataPlane
from ringserve.gateway.observe.access import REQUEST_ID_HEADER, current_request_id, header_request_id
from ringserve.gateway.openai.errors import is_openai_path, openai_error_body

METRICS_PATH = "/metrics"
# Open without the API key unless --api-key-everywhere: probes and scrapers carry no secrets.
OPEN_PATHS = frozenset({"/v2/health/live", "/v2/health/ready", METRICS_PATH, "/openapi.json"})


class GatewayApp:
    """ASGI entry point. POST .../infer goes straight to Endpoints.infer."""

    def __init__(
        self,
        plane: DataPlane,
        peers: Peers,
        api_key: ApiKey | None,
        *,
        max_request_bytes: int,
        body_timeout_s: float,
        api_key_everywhere: bool = False,
        metrics_port: int = 0,
        write_response: WriteResponse | None = None,
        dispatcher: Dispatcher | None = None,
    ) -> None:
        self.plane = plane
        self.peers = peers
        self.endpoints = Endpoints(
            plane,
            max_request_bytes,
            body_timeout_s=body_timeout_s,
            write_response=write_response,
            dispatcher=dispatcher,
        )
        self.generate = GenerateEndpoints(plane, self.endpoints.read_body)  # Triton's generate extension
        self.starlette = Starlette(
            routes=self.endpoints.routes(),
            exception_handlers={404: _not_found, 405: _method_not_allowed},
        )
        self.api_key = api_key
        self._open_paths = frozenset() if api_key_everywhere else OPEN_PATHS
        self.metrics_port = metrics_port

    async def __call__(self, scope: dict, receive, send) -> None:
        if scope["type"] == "http":
            if self.metrics_port and scope["path"] != METRICS_PATH and on_port(scope, self.metrics_port):
                await self._serve(
                    scope,
                    send,
                    NoRoute(scope["method"], scope["path"], f" (port {self.metrics_port} serves {METRICS_PATH} only)"),
                )
                return
            # A request on this gateway's own Unix socket is trusted by the runtime dir's 0700, not by the key.
            if (
                self.api_key is not None
                and scope["path"] not in self._open_paths
                and not self.peers.is_peer_call(scope)
            ):
                refusal = self.api_key.refusal(scope["headers"])
                if refusal is not None:
                    await self._serve(scope, send, refusal)
                    return
            if scope["method"] == "POST":
                target = match_infer_path(scope["path"])
                if target is not None:  # the hot path: it makes its request id and access line itself
                    await self.endpoints.infer(scope, receive, send, *target)
                    return
                generate = match_generate_path(scope["path"])
                if generate is not None:  # (streams its answer: raw ASGI too)
                    await self.generate.serve(scope, receive, send, *generate)
                    return
            await self._serve(scope, send, receive=receive)
            return
        await self.starlette(scope, receive, send)  # (no lifespan: the gateway process starts its parts)

    async def _serve(self, scope: dict, send, refusal: GatewayError | None = None, receive=None) -> None:
        """Starlette's answer (or the API key's refusal), with the request's id in its header and in an
        error body, and its access line."""
        started_ns = time.perf_counter_ns()
        request_id = header_request_id(scope["headers"])
        current_request_id.set(request_id)  # in this request's task only: error_response reads it
        response = _ResponseWatch(send, request_id)
        if refusal is not None:
            await _send_error(response.send, refusal, request_id, scope["path"])
        else:
            await self.starlette(scope, receive, response.send)
        if self.plane.access_log is not None:
            model = (scope.get("path_params") or {}).get("model")
            self.plane.access_log.write(
                scope["method"], scope["path"], response.status, response.nbytes, started_ns, request_id, model
            )


class _ResponseWatch:
    """Adds X-Request-ID to a response on its way out, and notes its status and size (the access line's)."""

    __slots__ = ("_send", "_header", "status", "nbytes")

    def __init__(self, send, request_id: str) -> None:
        self._send = send
        self._header = (REQUEST_ID_HEADER, request_id.encode())
        self.status = 0
        self.nbytes = 0

    async def send(self, message: dict) -> None:
        if message["type"] == "http.response.start":
            self.status = message["status"]
            message["headers"] = [*message.get("headers", ()), self._header]
        elif message["type"] == "http.response.body":
            self.nbytes += len(message.get("body", b""))
        await self._send(message)


def on_port(scope: dict, port: int) -> bool:
    """Whether the request came in on TCP port `port` of this host (ASGI's `server`: the local address)."""
    server = scope.get("server")
    return server is not None and server[1] == port


async def _send_error(send, exc: GatewayError, request_id: str, path: str) -> None:
    body = openai_error_body(exc) if is_openai_path(path) else error_body(str(exc), request_id)
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    headers += [(k.encode(), v.encode()) for k, v in exc.headers.items()]
    await send({"type": "http.response.start", "status": status_of(exc), "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def _not_found(request, exc) -> Response:
    path = request.url.path
    suffixes = ("/infer", "/ready", "/config", "/stats")
    hint = " (model names cannot contain '/')" if path.startswith("/v2/models/") and path.endswith(suffixes) else ""
    error = NoRoute(request.method, path, hint)
    body = openai_error_body(error) if is_openai_path(path) else error_body(str(error), current_request_id.get())
    return Response(body, status_of(error), media_type="application/json")


async def _method_not_allowed(request, exc) -> Response:
    allowed = (getattr(exc, "headers", None) or {}).get("Allow", "another method")
    error = MethodNotAllowed(request.method, request.url.path, allowed)
    return Response(
        error_body(str(error), current_request_id.get()),
        status_of(error),
        headers=error.headers,
        media_type="application/json",
    )
