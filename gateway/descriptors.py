"""One open-files budget per gateway: its HTTP connections, its gRPC connections and the client
shared-memory regions it holds, together under RLIMIT_NOFILE.

Each of them is one descriptor (a region: its segment's, read with preadv, never mapped). A
process out of descriptors fails accept() with EMFILE: uvicorn logs it and the client's
connection is closed unanswered, and grpcio does the same for its own. One kind could
starve the others: at a 700-descriptor limit, 680 idle gRPC connections made every HTTP request
close with no answer, and 150 regions left 18 of 90 HTTP connections served. So each kind gets a
cap of its own, and the caps with RESERVED_FDS fit the limit. Past its cap each kind is refused
in its own protocol's words: HTTP 503 (gateway/http/fast.py), a gRPC connection closed at accept
(the client's call fails UNAVAILABLE: grpcio's `grpc.max_allowed_incoming_connections`), a
registration refused naming the limit (gateway/core/regions.py).

At start the gateway raises its soft limit toward the hard one until the caps fit (a shell's soft
limit is usually 1024); where the hard limit is lower, every cap is scaled down by the same factor
and the log says so.
"""

from __future__ import annotations

import logging
import resource
from dataclasses import dataclass

# Descriptors a gateway holds besides its clients' connections and regions: listeners, the ring,
# ZeroMQ's sockets, the peers', gRPC's own, logs. About 30 with one worker; the rest is room for more
# workers and gateways, and for connections accepted past a cap only to be answered 503 and closed.
RESERVED_FDS = 256
FDS_PER_REGION = 1  # the segment's descriptor (read and written with preadv/pwritev, never mapped)

log = logging.getLogger("ringserve.gateway")


@dataclass(frozen=True)
class DescriptorBudget:
    """How many of each a gateway holds at most (0 gRPC connections: gRPC is off)."""

    http_connections: int
    grpc_connections: int
    shm_regions: int

    def descriptors(self) -> int:
        """The open files these need, RESERVED_FDS included."""
        return self.http_connections + self.grpc_connections + FDS_PER_REGION * self.shm_regions + RESERVED_FDS

    def scaled(self, descriptors: int) -> DescriptorBudget:
        """Every share cut by one factor so that the whole fits `descriptors` (at least 1 of each wanted)."""
        factor = max(0, descriptors - RESERVED_FDS) / max(1, self.descriptors() - RESERVED_FDS)

        def share(wanted: int) -> int:
            return min(wanted, max(1, int(wanted * factor))) if wanted else 0

        return DescriptorBudget(share(self.http_connections), share(self.grpc_connections), share(self.shm_regions))


def fit_open_files(wanted: DescriptorBudget) -> DescriptorBudget:
    """Raise this process's soft RLIMIT_NOFILE, toward its hard limit, until `wanted` fits; return
    `wanted`, or (logged) the scaled-down budget that fits when the hard limit does not allow it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = wanted.descriptors()
    if soft != resource.RLIM_INFINITY and soft < needed:
        raised = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        if raised > soft:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
                soft = raised
            except (ValueError, OSError) as exc:
                log.warning("cannot raise the open-files limit from %d to %d: %s", soft, raised, exc)
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return wanted
    fits = wanted.scaled(soft)
    log.warning(
        "the open-files limit (%d, hard %s) does not fit --max-connections %d, --grpc-max-connections %d "
        "and %d shared-memory regions (%d descriptors with %d reserved): serving %d HTTP connections "
        "(503 past them), %d gRPC connections (closed past them) and %d regions; raise the limit "
        "(ulimit -n, systemd's LimitNOFILE=) to serve more",
        soft,
        "unlimited" if hard == resource.RLIM_INFINITY else hard,
        wanted.http_connections,
        wanted.grpc_connections,
        wanted.shm_regions,
        needed,
        RESERVED_FDS,
        fits.http_connections,
        fits.grpc_connections,
        fits.shm_regions,
    )
    return fits
