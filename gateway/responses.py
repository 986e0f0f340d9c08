"""How a Starlette endpoint of the gateway answers: a JSON document, a GatewayError, `?scope=`.

The raw infer path (routes.Endpoints.infer) writes its answers itself; every other endpoint
(routes.py, shm_routes.py, server_routes.py) answers through these.
"""
from __future__ import annotations

from typing import Any

import orjson
from starlette.requests import Request
from starlette.responses import Response

from .access import current_request_id
from .errors import BadRequest, GatewayError, echo, error_body, status_of
from .peers import SCOPE_GATEWAY


def json_response(doc: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(orjson.dumps(doc), status, headers=headers, media_type="application/json")


def error_response(exc: GatewayError) -> Response:
    """The error's answer on a Starlette route, with the id of the request it answers (GatewayApp sets it)."""
    return Response(error_body(str(exc), current_request_id.get()), status_of(exc), headers=exc.headers,
                    media_type="application/json")

def scope_of(request: Request) -> str:
    """`?scope=`: "server" (the default: every gateway's numbers merged) or "gateway" (this one's own)."""
    scope = request.query_params.get("scope", "server")
    if scope not in ("server", SCOPE_GATEWAY):
        raise BadRequest(f"scope must be 'server' or '{SCOPE_GATEWAY}', got {echo(scope)}")
    return scope
