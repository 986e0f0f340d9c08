"""The HTTP engine: uvicorn's public Server and Config, over the fast protocol or uvicorn's own.

Two paths serve HTTP (--http-engine):

    fast      gateway/http/fast.py: uvicorn's httptools protocol subclassed (one write per response,
              the request head's limits) and the infer path's response written straight into
              uvicorn's request cycle. It stands on uvicorn's private names, so it serves only when
              the installed uvicorn is one CI has run and every name it uses is there.
    uvicorn   uvicorn's own protocol ("auto": httptools where installed) and nothing private: the
              head's size and time limits are off (uvicorn has none), --max-connections holds as
              uvicorn's limit_concurrency. `python -m bench protocols` measures it beside the fast
              one (docs/architecture.md, "Fast paths and their fence").

When fast is asked for and refused, this logs why and the public path serves: a uvicorn release can make
the gateway slower, never down. Only this module and fast.py import uvicorn; only fast.py its private
names (importlinter-fast-paths.ini).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.metadata
import logging
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import uvicorn

from ringserve.common.settings import HttpEngine
from ringserve.gateway.http.limits import ConnectionLimits
from ringserve.gateway.http.routes import WriteResponse, messages_only

log = logging.getLogger(__name__)

# The gateway's uvicorn settings for serving, both engines (bench/ceilings/send_once.py serves the ceiling
# app with the same, so the two stay comparable); the engine adds "http".
UVICORN_OPTIONS: dict[str, Any] = {
    "loop": "uvloop",
    "proxy_headers": False,  # nothing here reads the client address; saves ~3 us/request
    "server_header": False,  # no "server: uvicorn" to validate and write per response
    "access_log": False,
    "lifespan": "off",  # the gateway process starts and stops its parts itself (gateway/process.py)
    "log_level": "warning",
}


@dataclass(frozen=True)
class ChosenEngine:
    """The engine that serves: its name, uvicorn's `http` option and how the infer path writes an answer."""

    name: HttpEngine
    options: dict[str, Any]
    write_response: WriteResponse


def public_engine(limits: ConnectionLimits) -> ChosenEngine:
    return ChosenEngine("uvicorn", {"http": "auto", "limit_concurrency": limits.max_connections}, messages_only)


def fast_engine(limits: ConnectionLimits) -> ChosenEngine | str:
    """The fast path, or why it cannot serve on the uvicorn installed here."""
    try:
        from ringserve.gateway.http import fast  # noqa: PLC0415 - imported only when asked for: it may not import
    except (ImportError, AttributeError) as exc:  # a private name gone from uvicorn
        return f"its uvicorn imports fail: {exc}"
    refusal = fast.surface_refusal(importlib.metadata.version("uvicorn"))
    if refusal is not None:
        return refusal
    protocol = functools.partial(fast.GatewayHttpProtocol, limits=limits)
    return ChosenEngine("fast", {"http": protocol}, fast.write_response)


def choose_engine(requested: HttpEngine, limits: ConnectionLimits) -> ChosenEngine:
    """--http-engine's engine: fast where it can serve, else (with a warning that says why) uvicorn's own."""
    if requested == "fast":
        chosen = fast_engine(limits)
        if not isinstance(chosen, str):
            return chosen
        log.warning(
            "HTTP fast path off: %s; serving with uvicorn's own protocol (slower; no --max-header-bytes or "
            "--header-timeout-s). --http-engine uvicorn chooses it without this warning",
            chosen,
        )
    return public_engine(limits)


class HttpServer(uvicorn.Server):
    """uvicorn's server, run as one task of the gateway process (gateway/process.py), which takes the
    signals: stopping is its `should_exit`, set by the process in its drain order."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def http_server(app: Callable[..., Any], engine: ChosenEngine, drain_timeout_s: float) -> HttpServer:
    """The HTTP server of `app` on `engine`; its sockets are given to serve()."""
    config = uvicorn.Config(
        app,
        **UVICORN_OPTIONS,
        **engine.options,
        timeout_graceful_shutdown=int(drain_timeout_s),
        log_config=None,
    )
    return HttpServer(config)


def bind_socket(host: str, port: int) -> socket.socket:
    """host:port bound as uvicorn binds it (a gateway started by hand, or by an older supervisor)."""
    return uvicorn.Config(None, host=host, port=port).bind_socket()  # type: ignore[arg-type]
