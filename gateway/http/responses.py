"""How a Starlette endpoint of the gateway answers: a JSON document, a GatewayError, `?scope=`.

The raw infer path (routes.Endpoints.infer) writes its answers itself; every other endpoint
(routes.py, shm_routes.py, server_routes.py) answers through these.
"""

from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from ringserve.gateway.cluster.peers import SCOPE_GATEWAY, Peers
from ringserve.gateway.core.errors import BadRequest, GatewayError, echo, error_body, status_of
from ringserve.gateway.observe.access import current_request_id


def json_response(doc: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(doc), status, headers=headers, media_type="application/json")


def error_response(exc: GatewayError) -> Response:
    """The error's answer on a Starlette route, with the id of the request it answers (GatewayApp sets it)."""
    return Response(
        error_body(str(exc), current_request_id.get()),
        status_of(exc),
        headers=exc.headers,
        media_type="application/json",
    )


def scope_of(request: Request, peers: Peers | None) -> str:
    """`?scope=`: "server" (the default: every gateway's numbers merged, a change applied at each) or
    "gateway" (this one's own), which only a peer call may give (one on this gateway's own Unix
    socket, gateway/cluster/peers.py): from outside, a register at one gateway only would leave the others
    without the region, and numbers of one gateway read as the server's would mislead.
    Refused rather than ignored, so that a client never gets something other than what it asked for."""
    scope = request.query_params.get("scope", "server")
    if scope not in ("server", SCOPE_GATEWAY):
        raise BadRequest(f"scope must be 'server' or '{SCOPE_GATEWAY}', got {echo(scope)}")
    if scope == SCOPE_GATEWAY and (peers is None or not peers.is_peer_call(request.scope)):
        raise BadRequest(
            f"scope={SCOPE_GATEWAY} is only for this server's gateways asking each other, on their "
            "Unix sockets in the runtime dir; here every answer and change is the whole server's: "
            "leave scope out, or give scope=server"
        )
    return scope
