"""What both HTTP engines share (gateway/http/engine.py): a connection's limits, and the scope key of a
request's arrival. Imports no uvicorn module, so the public path never loads the fast one's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ringserve.common.settings import Settings


def _default(name: str) -> Any:
    return Settings.__dataclass_fields__[name].default


@dataclass(frozen=True)
class ConnectionLimits:
    """What one connection may send before its request reaches the application (defaults: Settings').
    The fast path enforces all three (gateway/http/fast.py); uvicorn's public protocol only the
    connection count (as uvicorn's limit_concurrency: 503 past it)."""

    max_header_bytes: int = _default("max_header_bytes")
    header_timeout_s: float = _default("header_timeout_s")
    max_connections: int = _default("max_connections")


# The scope key of the time (perf_counter_ns) the read that brought a request's first bytes returned:
# its arrival for Triton's statistics and the access log, before httptools parsed it and uvicorn made
# its task (at 1 client, ~60 us that perf_analyzer's server-side breakdown would otherwise miss). Only the
# fast path sets it; on the public one a request's clock starts in the data plane.
ARRIVED_NS = "ringserve.arrived_ns"
