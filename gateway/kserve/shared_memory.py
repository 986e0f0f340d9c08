"""Triton's system shared-memory extension, the operations HTTP and gRPC both answer.

The regions themselves: gateway/core/regions.py. Every gateway of the server holds the same regions:
a register or unregister is applied here, then POSTed to the other gateways with ?scope=gateway
(applied there, not forwarded again); a gateway that starts adopts its peers' regions
(adopt_peer_regions). Status is the server's. Each operation raises GatewayError.

While --allow-client-shm is off (the default, as Triton's), register and unregister answer
"Client shared memory is disabled" (501; gRPC UNIMPLEMENTED) and status lists nothing.
"""

from __future__ import annotations

import logging
from urllib.parse import quote

import orjson

from ringserve.gateway.cluster.peers import SCOPE_GATEWAY, PeerAnswer, Peers
from ringserve.gateway.core.errors import GatewayError
from ringserve.gateway.core.region_errors import RegionError, RegionNotFound
from ringserve.gateway.core.region_registry import RegionRegistry

log = logging.getLogger(__name__)


class SharedMemory:
    """One gateway's regions (the RegionRegistry the infer path reads a request's regions from) and
    the other gateways, which must hold the same regions."""

    def __init__(self, regions: RegionRegistry, peers: Peers | None) -> None:
        self.regions = regions
        self.peers = peers

    async def region_status(self, name: str | None, scope: str = "server") -> list[dict]:
        """Triton's status list; RegionNotFound (404) for a named region no gateway holds."""
        if not self.regions.allowed:  # (none can be registered: no gateway need be asked)
            if name is not None:
                raise RegionNotFound(name, [])
            return []
        regions = {r.name: r.status() for r in self.regions.regions.values() if name is None or r.name == name}
        if scope != SCOPE_GATEWAY and self.peers is not None:
            for answer in await self.peers.get(_shm_path(name, "status")):
                for entry in _json_list_of(answer):
                    regions.setdefault(entry.get("name"), entry)
        if name is not None and not regions:
            raise RegionNotFound(name, sorted(self.regions.regions))
        return list(regions.values())

    async def register_region(self, name: str, doc: dict, scope: str = "server") -> None:
        """Register `name` ({key, offset, byte_size}) here and at every other gateway; RegionError (400)."""
        self.regions.register(name, doc, idempotent=scope == SCOPE_GATEWAY)
        if scope == SCOPE_GATEWAY or self.peers is None:
            return
        # A peer that refuses it (it is up and says no) undoes it everywhere; one that is not running
        # is left out: it adopts the regions when it starts.
        answers = await self.peers.post(_shm_path(name, "register"), orjson.dumps(doc))
        refused = [a for a in answers if a.error is None and a.status != 200]
        if not refused:
            return
        self.regions.unregister(name)
        await self.peers.post(_shm_path(name, "unregister"))
        why = refused[0].json_object()
        why = why.get("error", why) if isinstance(why, dict) else why
        raise RegionError(
            f"failed to register shared memory region {name!r}: gateway {refused[0].gateway_index} of this "
            f"server refused it: {why}"
        )

    async def unregister_region(self, name: str | None, scope: str = "server") -> None:
        """Unregister one region (None: all) here and at every other gateway; an unknown name is no error."""
        self.regions.unregister(name)
        if scope != SCOPE_GATEWAY and self.peers is not None:
            await self.peers.post(_shm_path(name, "unregister"))

    async def adopt_peer_regions(self) -> None:
        """A gateway that (re)starts registers the regions its running peers hold, so that a client's
        next request finds its regions whichever gateway takes it. Peers not up yet are skipped."""
        if self.peers is None or not self.regions.allowed:
            return
        for answer in await self.peers.get(_shm_path(None, "status")):
            for entry in _json_list_of(answer):
                try:
                    self.regions.register(entry.get("name"), entry, idempotent=True)
                except GatewayError as exc:
                    log.warning(
                        "could not adopt shared memory region %r from gateway %d: %s",
                        entry.get("name"),
                        answer.gateway_index,
                        exc,
                    )


def _shm_path(name: str | None, action: str) -> str:
    """A system shared-memory path for the other gateways: this one's own share of it (?scope=gateway)."""
    region = "" if name is None else "/region/" + quote(name, safe="")
    return f"/v2/systemsharedmemory{region}/{action}?scope={SCOPE_GATEWAY}"


def _json_list_of(answer: PeerAnswer) -> list[dict]:
    """A peer's JSON list of objects (a shared-memory status), or [] when it has none to give."""
    if not answer.ok:
        return []
    try:
        doc = orjson.loads(answer.body)
    except orjson.JSONDecodeError:
        return []
    return [entry for entry in doc if isinstance(entry, dict)] if isinstance(doc, list) else []
